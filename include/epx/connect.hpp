// epx/connect.hpp — a Transport for ranks that a launcher other than epx started.
//
//   auto bootstrap = ...;                          // e.g. the MPI/OpenSHMEM runtime, a torch group
//   auto transport = epx::connect(*bootstrap, {}); // collective
//   epx::Buffer buffer(*transport, config);        // as with epx::launch
//
// The bootstrap (epx/bootstrap.hpp) carries only setup traffic; the returned transport
// moves the rows. Collective: every rank of the bootstrap calls connect() with the same
// options. The bootstrap must outlive the transport.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string_view>

#include "epx/bootstrap.hpp"
#include "epx/transport.hpp"

namespace epx {

enum class ConnectKind {
  kAuto,   ///< shm when every rank is on one node (discover_nodes); across nodes shmem when
           ///< oshrun/mpirun started the process and the build has OpenSHMEM, else ucx
  kShm,    ///< POSIX shared memory; every rank must be on one node
  kShmem,  ///< OpenSHMEM (Open MPI's oshmem over UCX); the process was started by oshrun/mpirun
  kUcx,    ///< UCX (UCP) directly, any launcher: UCX's shared memory within a machine, TCP (or
           ///< RDMA where present) across; UCX_TLS / UCX_NET_DEVICES choose (docs/transport.md)
};

/// "auto" | "shm" | "shmem" | "ucx"; throws kInvalidArgument naming the accepted values otherwise.
ConnectKind parse_connect_kind(std::string_view name);
const char* to_string(ConnectKind kind) noexcept;

struct ConnectOptions {
  ConnectKind kind = ConnectKind::kAuto;
  std::chrono::milliseconds timeout{60000};  ///< every wait of the transport
  /// Optional: called by a thread whose wait is yielding, at most every 50 ms per thread
  /// (shm transport). It may throw epx::Error to abandon the wait — the Python binding
  /// ends a hung call on Ctrl-C this way. Must be thread-safe.
  std::function<void()> wait_hook{};
};

/// Collective: creates this rank's transport over the ranks of `bootstrap`. Throws
/// kUnsupported when this build lacks the transport, kInvalidArgument when the ranks'
/// layout cannot use it (shm across nodes), kPeerFailed / kTimeout as any setup does.
std::unique_ptr<Transport> connect(Bootstrap& bootstrap, const ConnectOptions& options);

/// True when this build has the UCX transport (CMake option EPX_WITH_UCX, on when pkg-config
/// finds UCX).
bool ucx_available() noexcept;

/// What kAuto picks for ranks spread over `num_nodes` nodes: kShm on one node; across nodes
/// kShmem when `under_open_mpi` (oshrun/mpirun started the process) and `shmem_built`, else
/// kUcx. Pure, for tests; connect() passes this process's facts.
ConnectKind auto_connect_kind(int num_nodes, bool under_open_mpi, bool shmem_built) noexcept;

}  // namespace epx
