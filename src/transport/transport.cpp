// The interface's defaults (include/epx/transport.hpp).
#include "epx/transport.hpp"

#include <string>

#include "epx/error.hpp"

namespace epx {

void Transport::get(int peer, std::size_t, void*, std::size_t, int) {
  throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank()) + ": transport '" + caps().name +
                                           "' has no one-sided get (reading rank " + std::to_string(peer) +
                                           "'s window); TransportCaps::one_sided_get is false");
}

}  // namespace epx
