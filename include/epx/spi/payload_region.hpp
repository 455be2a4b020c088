// epx/spi/payload_region.hpp — an optional interface for transports that want to know which
// window bytes carry rows (bulk payload) and which carry control data (headers, metadata).
//
// The engine tells it after every allocate of a Buffer's window, if the transport implements
// it (dynamic_cast once, when the Buffer is built). The simulator uses it to skip copying
// payload in model-only mode (epx/sim/model_transport.hpp); the shmem transport to count the
// row bytes it put to each peer apart from the rest. A transport that needs neither does not
// implement it.
#pragma once

#include <cstddef>

namespace epx::spi {

class PayloadRegionListener {
 public:
  virtual ~PayloadRegionListener() = default;
  /// Bytes [begin, end) of every rank's window hold rows; the rest is control data.
  virtual void set_payload_region(std::size_t begin, std::size_t end) = 0;
};

}  // namespace epx::spi
