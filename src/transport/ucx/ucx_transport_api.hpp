// What connect() needs of ucx/: declared apart from ucx_transport.hpp, which includes UCX's
// headers (absent from a build without UCX).
#pragma once

#include <memory>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

/// connect(kUcx): collective over `bootstrap`, which must outlive the transport. Throws
/// kUnsupported in a build without UCX.
std::unique_ptr<Transport> connect_ucx(Bootstrap& bootstrap, const ConnectOptions& options);

}  // namespace epx::detail
