// epx sim's runs: the real engine on sim ranks, replayed through the hardware model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "epx/sim/hardware.hpp"
#include "epx/sim/runner/calibrate.hpp"
#include "epx/sim/runner/run.hpp"

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

// In the steady state (a second dispatch and combine after a first pair) each call follows
// one of the other kind and puts its rows before the header exchange: in simulated time
// the second dispatch must beat the first (a new Buffer's first call exchanges headers
// first) and wait less. A cached second dispatch also skips the plan and the metadata.
TEST(SimRun, SteadyStateCallsGoRowsFirst) {
  const sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  for (int ep : {8, 16}) {
    SimOptions o = decode_shape();
    const SimPoint first = evaluate_run(collect_run(o, ep), hw, o);
    EXPECT_FALSE(first.steady);
    o.steady = true;
    const SimRun run = collect_run(o, ep);
    EXPECT_EQ(run.dispatch_call, 3) << "EP" << ep;
    EXPECT_EQ(run.combine_call, 4) << "EP" << ep;
    const SimPoint steady = evaluate_run(run, hw, o);
    EXPECT_TRUE(steady.steady);
    EXPECT_LT(steady.dispatch_us, first.dispatch_us) << "EP" << ep;
    EXPECT_LT(steady.dispatch_split.sync_us, 0.5 * first.dispatch_split.sync_us) << "EP" << ep;
    o.cached = true;
    const SimPoint cached = evaluate_run(collect_run(o, ep), hw, o);
    EXPECT_TRUE(cached.cached);
    EXPECT_LT(cached.dispatch_us, steady.dispatch_us) << "EP" << ep;
    EXPECT_LT(cached.dispatch_split.control_us, steady.dispatch_split.control_us) << "EP" << ep;
  }
}

// Combine's per-peer hand-back on the engine's own run (calibration shape, fewer tokens):
// with the cost large enough to follow the last sum, every rank hands back all R-1 remote
// peers one after another, so doubling the cost from X to 2X adds exactly x X to
// every rank's time after its last transport op — the closed form the EP trend comes from
// (docs/sim.md §3b) — and the attribution without it is faster, by more at EP16 than at EP8.
TEST(SimRun, CombinePeerReleaseGrowsWithThePeers) {
  SimOptions o;
  o.tokens = 1024;
  o.progress = false;
  o.attribution = true;
  sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  const double x_us = 100;  // longer than the gaps between the peers' last sums
  double gain[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const int ep = i == 0 ? 8 : 16;
    const SimRun run = collect_run(o, ep);
    const SimPoint stored = evaluate_run(run, hw, o);
    ASSERT_EQ(stored.combine_without.back().first, "per-peer release");
    gain[i] = stored.combine_without.back().second / stored.combine_gbps - 1;
    EXPECT_GT(gain[i], 0.0) << "EP" << ep;
    sim::HardwareModel h = hw;
    h.set("combine_peer_release", x_us * 1000, "test");
    const double tail1 = evaluate_run(run, h, o).combine_split.reduce_tail_us;
    h.set("combine_peer_release", 2 * x_us * 1000, "test");
    const double tail2 = evaluate_run(run, h, o).combine_split.reduce_tail_us;
    EXPECT_NEAR(tail2 - tail1, (ep - 1) * x_us, 1e-3 * (ep - 1) * x_us) << "EP" << ep;
  }
  EXPECT_GT(gain[1], gain[0]);
}

// The built-in profile against the published points it was fitted on (EP8/16/32, the
// calibration shape; docs/sim.md §3): every error within the 3 % asked for. The held-out
// EP64/128 points are not in the code at all.
TEST(SimCalibration, ProfileMatchesThePublishedEP8To32Within3Percent) {
  SimOptions o;
  o.progress = false;
  const std::vector<CalibrationPoint> points = calibration_points(o, sim::load_hardware("ascend950-supernode"));
  ASSERT_EQ(points.size(), 3u);
  for (const CalibrationPoint& p : points) {
    std::printf("EP%d: dispatch %.1f GB/s (%+.2f %%), combine %.1f GB/s (%+.2f %%)\n", p.target.point.ep, p.dispatch_gbps,
                p.dispatch_error_pct, p.combine_gbps, p.combine_error_pct);
    EXPECT_LE(std::fabs(p.dispatch_error_pct), 3.0) << "EP" << p.target.point.ep;
    EXPECT_LE(std::fabs(p.combine_error_pct), 3.0) << "EP" << p.target.point.ep;
  }
}

}  // namespace
}  // namespace epx::tools
