// connect(): a transport from a bootstrap, for ranks another launcher started.
#include "epx/connect.hpp"

#include <cstdlib>
#include <string>

#include "epx/error.hpp"
#include "epx/shmem.hpp"
#include "shm/shm_connect.hpp"
#include "shmem/shmem_transport.hpp"
#include "ucx/ucx_transport_api.hpp"

namespace epx {

ConnectKind parse_connect_kind(std::string_view name) {
  if (name == "auto") return ConnectKind::kAuto;
  if (name == "shm") return ConnectKind::kShm;
  if (name == "shmem") return ConnectKind::kShmem;
  if (name == "ucx") return ConnectKind::kUcx;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown transport '" + std::string(name) + "' for connect (expected 'auto', 'shm', 'shmem' or 'ucx')");
}

const char* to_string(ConnectKind kind) noexcept {
  switch (kind) {
    case ConnectKind::kAuto: return "auto";
    case ConnectKind::kShm: return "shm";
    case ConnectKind::kShmem: return "shmem";
    case ConnectKind::kUcx: return "ucx";
  }
  return "?";
}

// Across nodes OpenSHMEM stays the choice for ranks oshrun/mpirun started (its runtime is
// there already, and the multi-machine scripts rely on it); any other launcher (torchrun, a
// Python store, a test's own sockets) gets UCX, which needs nothing but the bootstrap.
ConnectKind auto_connect_kind(int num_nodes, bool under_open_mpi, bool shmem_built) noexcept {
  if (num_nodes <= 1) return ConnectKind::kShm;
  return under_open_mpi && shmem_built ? ConnectKind::kShmem : ConnectKind::kUcx;
}

namespace {
// Open MPI's launchers (mpirun, oshrun) give every rank they start its place in the job.
bool started_by_open_mpi() noexcept { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }
}  // namespace

std::unique_ptr<Transport> connect(Bootstrap& bootstrap, const ConnectOptions& options) {
  ConnectKind kind = options.kind;
  if (kind == ConnectKind::kAuto)
    kind = auto_connect_kind(discover_nodes(bootstrap).num_nodes, started_by_open_mpi(), shmem_available());
  switch (kind) {
    case ConnectKind::kShm: return detail::connect_shm(bootstrap, options);
    case ConnectKind::kUcx: return detail::connect_ucx(bootstrap, options);  // kUnsupported in a build without UCX
    default: return detail::connect_shmem(bootstrap, options);               // kUnsupported in a build without OpenSHMEM
  }
}

}  // namespace epx
