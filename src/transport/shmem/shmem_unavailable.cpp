// Built instead of shmem_transport.cpp when CMake found no OpenSHMEM (EPX_WITH_SHMEM=OFF).
#include <string>

#include "epx/error.hpp"
#include "shmem/shmem_transport.hpp"

namespace epx {
namespace {
[[noreturn]] void missing(const std::string& what) {
  throw Error(ErrorCode::kUnsupported, what + ": this build of epx has no OpenSHMEM transport (Open MPI's oshmem was not "
                                              "found at configure time: apt-get install libopenmpi-dev openmpi-bin "
                                              "libucx-dev, then reconfigure with -DEPX_WITH_SHMEM=ON)");
}
}  // namespace

bool shmem_available() noexcept { return false; }
std::unique_ptr<Bootstrap> shmem_bootstrap(const ShmemOptions&) { missing("shmem_bootstrap"); }
ShmemRuntimeInfo shmem_runtime_info() { missing("shmem_runtime_info"); }
std::vector<ShmemPeerInfo> shmem_peer_info(const Transport&) { missing("shmem_peer_info"); }

namespace detail {
std::unique_ptr<Transport> connect_shmem(Bootstrap& bootstrap, const ConnectOptions&) {
  missing(std::string("connect(shmem) over a '") + bootstrap.name() + "' bootstrap");
}
}  // namespace detail
}  // namespace epx
