// epx/sim/launch.hpp — start P simulator ranks with recording options (for `epx sim`).
//
// epx::launch({.transport = kSim}) runs the simulator transport with default options (copy
// mode, no trace kept); this entry point adds what only the simulator has: model-only mode
// and the trace sink.
#pragma once

#include "epx/launch.hpp"
#include "epx/sim/trace.hpp"

namespace epx::sim {

/// As epx::launch with options.transport = kSim (options.transport is ignored; every other
/// field and rule of LaunchOptions applies): P ranks as threads of this process on the
/// simulator transport. `sim.trace`, when set, receives every rank's records when the launch
/// returns (also after a failure of a rank: not filled then). Called by one thread.
void launch(const LaunchOptions& options, const SimTransportOptions& sim, const RankFn& fn);

}  // namespace epx::sim
