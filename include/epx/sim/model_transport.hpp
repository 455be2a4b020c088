// epx/sim/model_transport.hpp — what a modelling transport (the simulator) hears from the
// engine beyond the Transport interface. Optional: a transport that moves bytes does not
// implement it. The engine asks for it once, when a Buffer is built
// (dynamic_cast<sim::ModelTransport*>(&transport)), and uses it only if present.
#pragma once

#include <cstddef>

#include "epx/spi/payload_region.hpp"

namespace epx::sim {

class ModelTransport : public spi::PayloadRegionListener {
 public:
  virtual ~ModelTransport() = default;

  /// Payload bytes really move. When false, the transport may only account for puts into
  /// the payload region (set_payload_region): the engine then skips every loop that reads
  /// or writes payload (epilogue copies, combine sums, the reduction), and the values of
  /// received rows and of the outputs are unspecified.
  virtual bool moves_payload() const noexcept = 0;

  // set_payload_region (spi::PayloadRegionListener), after every allocate of a Buffer's
  // window: with moves_payload() false the transport may skip copying puts inside the
  // payload region, and must then treat wait_flag on a block there as satisfied once the
  // block's put was issued.

  /// The engine's rank thread has joined the workers it forked for a task (after every
  /// fork/join). A transport that records each thread's operations as its own stream
  /// orders the rank thread's next operations after the workers' last ones.
  virtual void workers_joined() = 0;
};

}  // namespace epx::sim
