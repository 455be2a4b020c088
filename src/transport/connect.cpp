// connect(): a transport from a bootstrap, for ranks another launcher started.
#include "epx/connect.hpp"

#include <string>

#include "epx/error.hpp"
#include "shm/shm_connect.hpp"
#include "shmem/shmem_transport.hpp"

namespace epx {

ConnectKind parse_connect_kind(std::string_view name) {
  if (name == "auto") return ConnectKind::kAuto;
  if (name == "shm") return ConnectKind::kShm;
  if (name == "shmem") return ConnectKind::kShmem;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown transport '" + std::string(name) + "' for connect (expected 'auto', 'shm' or 'shmem')");
}

const char* to_string(ConnectKind kind) noexcept {
  switch (kind) {
    case ConnectKind::kAuto: return "auto";
    case ConnectKind::kShm: return "shm";
    case ConnectKind::kShmem: return "shmem";
  }
  return "?";
}

std::unique_ptr<Transport> connect(Bootstrap& bootstrap, const ConnectOptions& options) {
  ConnectKind kind = options.kind;
  if (kind == ConnectKind::kAuto) kind = discover_nodes(bootstrap).num_nodes == 1 ? ConnectKind::kShm : ConnectKind::kShmem;
  if (kind == ConnectKind::kShm) return detail::connect_shm(bootstrap, options);
  return detail::connect_shmem(bootstrap, options);  // kUnsupported in a build without OpenSHMEM
}

}  // namespace epx
