// epx sim hybridep: the closed-form limits, computed here by hand from the assumptions in
// docs/sim.md §7 (not through the tool's own helpers).
#include <gtest/gtest.h>

#include <cmath>

#include "epx/error.hpp"
#include "epx/sim/runner/hybridep.hpp"

namespace epx::tools {
namespace {

HybridOptions small() {
  HybridOptions o;
  o.ranks = 16;
  o.domains = 2;
  o.tokens = 1000;
  o.hidden = 1024;
  o.topk = 4;
  o.experts = 32;
  o.fp8 = false;
  o.expert_intermediate = 512;
  o.weight_bytes = 2;
  o.compression = 0.5;
  o.cross_bandwidth = 10;
  o.cross_latency_us = 5;
  return o;
}

TEST(SimHybridEP, PureTokenAllToAllAtPZero) {
  const sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  const HybridOptions o = small();
  const HybridPoint pt = hybrid_point(o, hw, 0.0);
  // 2 domains of 8 ranks; bf16 rows: dispatch 2H + 12K bytes, combine 2H.
  const double rd = 2 * 1024 + 12 * 4, rc = 2 * 1024;
  const double crossing = 1 - std::pow(0.5, 4);          // the other domain, reached once
  const double inside = 8 * (1 - std::pow(1 - 1.0 / 16, 4));  // unique ranks of the own domain
  EXPECT_NEAR(pt.tokens_crossing, crossing, 1e-12);
  EXPECT_NEAR(pt.unique_in_domain, inside, 1e-12);
  EXPECT_EQ(pt.gather_bytes, 0.0);
  EXPECT_EQ(pt.gather_us, 0.0);
  const double link = hw.link_bandwidth.gbps * 1e3, lat = hw.link_latency.ns / 1e3;  // bytes/us, us
  auto phase = [&](double row) {
    const double port = 1000 * (inside * (1 - 1.0 / 8) + crossing) * row / link + lat;
    const double slow = 8 * 1000 * crossing * row / (10 * 1e3) + 5;  // 8 ranks' crossings over 10 GB/s, + 5 us
    return std::max(port, slow);
  };
  EXPECT_NEAR(pt.dispatch_us, phase(rd), 1e-9);
  EXPECT_NEAR(pt.combine_us, phase(rc), 1e-9);
  EXPECT_NEAR(pt.layer_us, phase(rd) + phase(rc), 1e-9);
  EXPECT_NEAR(pt.cross_token_bytes, 8 * 1000 * crossing * (rd + rc), 1e-6);
}

TEST(SimHybridEP, PureExpertAllGatherAtPOne) {
  const sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  HybridOptions o = small();
  const HybridPoint pt = hybrid_point(o, hw, 1.0);
  EXPECT_EQ(pt.tokens_crossing, 0.0);
  EXPECT_EQ(pt.cross_token_bytes, 0.0);
  // All 16 other-domain experts copied: 3 H I weights x 2 B, halved on the link.
  const double gather = 16 * 3.0 * 1024 * 512 * 2 * 0.5;
  EXPECT_NEAR(pt.gather_bytes, gather, 1e-6);
  EXPECT_NEAR(pt.gather_us, gather / (10 * 1e3) + 5, 1e-9);
  // Tokens stay in their domain: an all-to-all over its 8 ranks, every expert there.
  const double inside = 8 * (1 - std::pow(1 - 1.0 / 8, 4));
  EXPECT_NEAR(pt.unique_in_domain, inside, 1e-12);
  const double link = hw.link_bandwidth.gbps * 1e3, lat = hw.link_latency.ns / 1e3;
  const double rd = 2 * 1024 + 12 * 4, rc = 2 * 1024;
  const double a2a = 1000 * inside * (1 - 1.0 / 8) * (rd + rc) / link + 2 * lat;
  EXPECT_NEAR(pt.dispatch_us + pt.combine_us, a2a, 1e-9);
  EXPECT_NEAR(pt.layer_us, gather / (10 * 1e3) + 5 + a2a, 1e-9);
  // Hidden behind compute: only what does not fit is exposed.
  o.compute_us = 100;
  o.overlap = 0.5;
  EXPECT_NEAR(hybrid_point(o, hw, 1.0).gather_exposed_us, std::max(0.0, pt.gather_us - 50), 1e-9);
}

// Between the limits: crossings fall and the gather grows with p; the best p is the sweep's
// minimum; a small batch keeps tokens moving, a large one moves experts.
TEST(SimHybridEP, SweepAndBestP) {
  const sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  HybridOptions o = small();
  o.p = {0, 0.25, 0.5, 0.75, 1};
  auto sweep = hybrid_sweep(o, hw);
  for (std::size_t i = 1; i < sweep.size(); ++i) {
    EXPECT_LT(sweep[i].tokens_crossing, sweep[i - 1].tokens_crossing);
    EXPECT_GT(sweep[i].gather_bytes, sweep[i - 1].gather_bytes);
  }
  const std::size_t b = best_point(sweep);
  for (const HybridPoint& pt : sweep) EXPECT_LE(sweep[b].layer_us, pt.layer_us);
  o.tokens = 10;
  EXPECT_EQ(hybrid_sweep(o, hw)[best_point(hybrid_sweep(o, hw))].p, 0.0);
  o.tokens = 100000;
  EXPECT_EQ(hybrid_sweep(o, hw)[best_point(hybrid_sweep(o, hw))].p, 1.0);
  o.p = {1.5};
  EXPECT_THROW(hybrid_sweep(o, hw), Error);
  o.p = {0};
  o.domains = 3;  // 16 ranks do not split into 3 domains
  EXPECT_THROW(hybrid_sweep(o, hw), Error);
}

}  // namespace
}  // namespace epx::tools
