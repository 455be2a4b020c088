// epx sim's runs: the real engine on sim ranks, replayed through the hardware model.
#include <gtest/gtest.h>

#include "epx/sim_hardware.hpp"
#include "sim_run.hpp"

namespace epx::tools {
namespace {

// The decode shape: few tokens, where synchronisation weighs most.
SimOptions decode_shape() {
  SimOptions o;
  o.tokens = 128;
  o.topk = 8;
  o.fp8 = false;
  o.layout = "compact";
  o.progress = false;
  return o;
}

// A cached dispatch right after its combine skips the plan and sends its rows before the
// header exchange: in simulated time it must beat the fresh dispatch of the same routing
// and wait less (one synchronisation instead of two; a cached dispatch that exchanged
// headers first would only save the plan), while the combine between them is the same call
// in both runs.
TEST(SimRun, CachedDispatchIsModelledFasterThanFresh) {
  const sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  for (int ep : {8, 16}) {
    SimOptions o = decode_shape();
    const SimPoint fresh = evaluate_run(collect_run(o, ep), hw, o);
    o.cached = true;
    const SimRun run = collect_run(o, ep);
    EXPECT_EQ(run.dispatch_call, 3) << "EP" << ep;
    const SimPoint cached = evaluate_run(run, hw, o);
    EXPECT_TRUE(cached.cached);
    EXPECT_LT(cached.dispatch_us, fresh.dispatch_us) << "EP" << ep;
    EXPECT_LT(cached.dispatch_split.control_us, fresh.dispatch_split.control_us) << "EP" << ep;
    EXPECT_LT(cached.dispatch_split.sync_us, 0.5 * fresh.dispatch_split.sync_us) << "EP" << ep;
    EXPECT_DOUBLE_EQ(cached.combine_us, fresh.combine_us) << "EP" << ep;
  }
}

}  // namespace
}  // namespace epx::tools
