// epx sim's runs: the real engine on sim ranks, its trace timed on the hardware model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "epx/error.hpp"
#include "epx/sim/hardware.hpp"
#include "epx/sim/runner/calibrate.hpp"
#include "epx/sim/runner/published.hpp"
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
// peers one after another, so doubling the cost from X to 2X adds exactly (R-1) x X to
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

namespace epx::tools {
namespace {

// DeepEP's bottleneck bandwidth (docs/sim.md §8), counted here with plain loops on the
// run's own routing: normal internode (hierarchical across servers of 8) = my tokens once
// per destination server, the own included, x H x 2 x (1 + 4/128) / 2; normal intranode
// (one server) = received rows x the same row; low-latency (any other schedule) = received
// (token, expert) selections x (H + H/128 x 4 + 16). Combine counts 2H per row of each.
TEST(SimRun, BottleneckBytesFollowDeepEPsDefinitions) {
  SimOptions o;
  o.hardware = "h800-deepep";
  o.tokens = 96, o.hidden = 1024, o.topk = 8, o.experts = 256, o.groups = 8, o.topk_groups = 4, o.fp8 = true;
  o.layout = "compact", o.schedule = "hierarchical", o.combine_order = "node-first", o.progress = false;
  const double x_row = 1024 * 2 * (1 + 4.0 / 128) / 2, y_row = 2048;
  for (int ep : {8, 16}) {
    const SimRun run = collect_run(o, ep);
    const BenchProblem p = sim_problem(o, ep);
    const int L = 256 / ep;
    std::vector<double> pairs(ep, 0), rows(ep, 0);
    for (int r = 0; r < ep; ++r)
      for (std::int64_t t = 0; t < o.tokens; ++t) {
        bool server_hit[32] = {}, rank_hit[32] = {};
        for (int k = 0; k < 8; ++k) {
          const int d = static_cast<int>(p.rank[r].topk_idx[t * 8 + k] / L);
          if (!server_hit[d / 8]) server_hit[d / 8] = true, ++pairs[r];
          if (!rank_hit[d]) rank_hit[d] = true, ++rows[d];
        }
      }
    EXPECT_EQ(run.bottleneck_metric, ep == 8 ? "normal intranode" : "normal internode");
    for (int r = 0; r < ep; ++r) {
      const double n = ep == 8 ? rows[r] : pairs[r];
      EXPECT_DOUBLE_EQ(run.bottleneck_dispatch_bytes[r], n * x_row) << "EP" << ep << " rank " << r;
      EXPECT_DOUBLE_EQ(run.bottleneck_combine_bytes[r], n * y_row) << "EP" << ep << " rank " << r;
    }
  }
  o.schedule = "flat", o.combine_order = "flat", o.groups = o.topk_groups = 0, o.layout = "expanded", o.alignment = 1;
  const SimRun ll = collect_run(o, 16);
  const BenchProblem p = sim_problem(o, 16);
  std::vector<double> selections(16, 0);
  for (int r = 0; r < 16; ++r)
    for (std::int64_t t = 0; t < o.tokens * 8; ++t) ++selections[p.rank[r].topk_idx[t] / 16];
  EXPECT_EQ(ll.bottleneck_metric, "low-latency");
  for (int r = 0; r < 16; ++r) {
    EXPECT_DOUBLE_EQ(ll.bottleneck_dispatch_bytes[r], selections[r] * (1024 + 32 + 16)) << "rank " << r;
    EXPECT_DOUBLE_EQ(ll.bottleneck_combine_bytes[r], selections[r] * y_row) << "rank " << r;
  }
  // And the point reports it: per rank bytes over its time, averaged; max-rank µs.
  const SimPoint pt = evaluate_run(ll, sim::load_hardware("h800-deepep"), o);
  EXPECT_GT(pt.dispatch_bottleneck_gbps, 0);
  EXPECT_EQ(pt.bottleneck_metric, "low-latency");
}

// DeepEP's low-latency kernels move one row per (token, expert) selection both ways; the
// engine does with --one-copy (an expanded dispatch puts each row once per slot into the
// receiver's output block) and --combine-replies selections (each slot's y row back): its
// own put counters, against the selections counted with plain loops. Without them it moves
// a row per (token, rank).
TEST(SimRun, OneCopyAndSelectionRepliesMoveARowPerSelection) {
  SimOptions o;
  o.hardware = "h800-deepep";
  o.tokens = 64, o.hidden = 1024, o.topk = 8, o.experts = 64, o.fp8 = true, o.layout = "expanded", o.alignment = 1;
  o.schedule = "grouped:8", o.progress = false, o.collect_stats = true;
  const int P = 8, L = 64 / P;
  const BenchProblem p = sim_problem(o, P);
  std::vector<std::uint64_t> sent(P, 0), received(P, 0), entries(P, 0);  // selections and (token, rank) pairs
  for (int r = 0; r < P; ++r)
    for (std::int64_t t = 0; t < o.tokens; ++t) {
      bool hit[P] = {};
      for (int k = 0; k < 8; ++k) {
        const int d = static_cast<int>(p.rank[r].topk_idx[t * 8 + k] / L);
        ++sent[r], ++received[d];
        if (!hit[d]) hit[d] = true, ++entries[d];
      }
    }
  const std::uint64_t x_row = 1024 + 1024 / 128 * 4, y_row = 2048;
  for (bool per_selection : {false, true}) {
    SCOPED_TRACE(per_selection ? "one copy, selections" : "default");
    o.one_copy = per_selection;
    o.combine_replies = per_selection ? "selections" : "partials";
    const SimRun run = collect_run(o, P);
    for (int r = 0; r < P; ++r) {
      const EngineCounters& c = run.combine_counters[r];
      EXPECT_EQ(c.bytes + c.local_bytes, (per_selection ? received[r] : entries[r]) * y_row) << "rank " << r;
      const EngineCounters& d = run.dispatch_counters[r];
      if (per_selection) EXPECT_GE(d.bytes + d.local_bytes, sent[r] * x_row) << "rank " << r;  // + the metadata per (token, rank)
      else EXPECT_LT(d.bytes + d.local_bytes, sent[r] * x_row) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace epx::tools

namespace epx::tools {
namespace {

// A profile's published series drive both the calibration and `epx sim published`: the
// h800 profile's four calibration rows come with their series' options; a small series of
// a profile made here is predicted at each of its EP sizes, in its metric, with the
// published point next to its own EP size only, and drawn (a square per published figure).
TEST(SimPublished, SeriesDriveCalibrationAndPredictions) {
  const sim::HardwareModel h800 = sim::load_hardware("h800-deepep");
  const std::vector<CalibrationTarget> t = calibration_targets(SimOptions{}, h800);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[1].options.tokens, 4096);
  EXPECT_EQ(t[1].options.groups, 8);
  EXPECT_EQ(t[1].options.schedule, "hierarchical");
  EXPECT_EQ(t[1].options.combine_order, "node-first");
  EXPECT_EQ(t[1].options.ep, std::vector<int>{16});
  EXPECT_EQ(t[2].options.tokens, 128);
  EXPECT_EQ(t[2].options.schedule, "grouped:8");  // DeepEP's all-peers-at-once issue: no common order (docs/sim.md §8)
  EXPECT_TRUE(t[2].options.one_copy);             // a row per selection, both ways
  EXPECT_EQ(t[2].options.combine_replies, "selections");
  EXPECT_EQ(t[3].point.dispatch_us, 118);

  std::string j = sim::builtin_hardware_json("h800-deepep");
  j = j.substr(0, j.find("\"published\"")) +
      R"("published": [{"label": "tiny", "metric": "deepep", "run": {"tokens": 32, "hidden": 256, "topk": 4, "experts": 64,
        "schedule": "rotated", "layout": "compact"}, "ep": [8, 16], "points": [{"ep": 16, "dispatch_gbps": 10, "combine_gbps": [9, 11]}]}]})";
  const sim::HardwareModel hw = sim::parse_hardware_json(j, "tiny");
  EXPECT_THROW(calibration_targets(SimOptions{}, hw), Error);  // nothing marked "calibrate"
  SimOptions base;
  base.progress = false;
  const SystemPrediction sys = predict_published(base, hw);
  ASSERT_EQ(sys.series.size(), 1u);
  const SeriesPrediction& s = sys.series[0];
  ASSERT_EQ(s.points.size(), 2u);
  EXPECT_EQ(s.options.tokens, 32);
  EXPECT_FALSE(s.points[0].published);
  EXPECT_TRUE(s.points[1].published);
  EXPECT_EQ(s.points[1].point.combine_hi, 11);
  for (const SeriesPoint& p : s.points) {
    EXPECT_EQ(p.dispatch_gbps, p.predicted.dispatch_bottleneck_gbps);
    EXPECT_EQ(p.predicted.bottleneck_metric, "low-latency");
    EXPECT_GT(p.dispatch_gbps, 0);
  }
  const std::string svg = published_svg({sys});
  std::size_t rects = 0;
  for (std::size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) ++rects;
  EXPECT_EQ(rects, 2u);  // dispatch and combine of the one published point
  EXPECT_NE(published_json({sys}).find("\"published\""), std::string::npos);
}

}  // namespace
}  // namespace epx::tools
