// Built instead of ucx_transport.cpp when CMake found no UCX (EPX_WITH_UCX=OFF).
#include <memory>
#include <string>

#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "ucx/ucx_transport_api.hpp"

namespace epx {

bool ucx_available() noexcept { return false; }

namespace detail {
std::unique_ptr<Transport> connect_ucx(Bootstrap& bootstrap, const ConnectOptions&) {
  throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(bootstrap.rank()) + ": connect(ucx) over a '" + bootstrap.name() +
                                           "' bootstrap: this build of epx has no UCX transport (UCX's development files were "
                                           "not found by pkg-config at configure time: apt-get install libucx-dev, then "
                                           "reconfigure with -DEPX_WITH_UCX=ON)");
}
}  // namespace detail
}  // namespace epx
