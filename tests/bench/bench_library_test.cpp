// The bench engine as a library (epx_bench, tools/include/epx/bench/): a run of 2 threads ranks
// called directly, without the CLI, its result struct checked against an independent count
// of the routing made here from topk_idx alone (not RouteCount, not the engine's plan).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "epx/bench/routing.hpp"
#include "epx/bench/run.hpp"

namespace {

using epx::tools::BenchMeasurement;
using epx::tools::BenchOptions;
using epx::tools::BenchProblem;

BenchOptions two_ranks() {
  BenchOptions o;
  o.ranks = 2, o.tokens = 24, o.hidden = 256, o.topk = 3, o.experts = 6;
  o.warmup = 1, o.iters = 3, o.overhead_iters = 0;
  o.transport = "threads";
  o.progress = false;
  return o;
}

// Per rank: (token, unique destination rank) pairs it sends, and those it receives.
struct Pairs {
  std::vector<std::int64_t> sent, received;
};

Pairs count_pairs(const BenchProblem& p) {
  Pairs c{std::vector<std::int64_t>(static_cast<std::size_t>(p.ranks)), std::vector<std::int64_t>(static_cast<std::size_t>(p.ranks))};
  const int per_rank = p.experts / p.ranks;
  for (int r = 0; r < p.ranks; ++r) {
    const auto& in = p.rank[static_cast<std::size_t>(r)];
    for (std::int64_t t = 0; t < in.tokens; ++t) {
      std::set<int> dest;
      for (int k = 0; k < p.topk; ++k) {
        const std::int64_t e = in.topk_idx[static_cast<std::size_t>(t * p.topk + k)];
        if (e >= 0) dest.insert(static_cast<int>(e / per_rank));
      }
      c.sent[static_cast<std::size_t>(r)] += static_cast<std::int64_t>(dest.size());
      for (int d : dest) ++c.received[static_cast<std::size_t>(d)];
    }
  }
  return c;
}

TEST(BenchLibrary, ThreadsRunReportsTheRoutingsBytes) {
  const BenchOptions o = two_ranks();
  const BenchMeasurement m = epx::tools::measure_bench(o);
  const BenchProblem p = epx::tools::make_problem(o);  // the same seed: the routing the run used
  const Pairs pairs = count_pairs(p);
  const std::int64_t x_row = o.hidden * 2, y_row = o.hidden * 2;  // bf16 rows

  const auto& rep = m.report;
  ASSERT_EQ(rep.ranks, 2);
  ASSERT_EQ(m.records.size(), 2u);
  ASSERT_EQ(rep.dispatch.payload_bytes.size(), 2u);
  ASSERT_EQ(rep.combine.payload_bytes.size(), 2u);
  std::int64_t total_dispatch = 0;
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(rep.dispatch.payload_bytes[r], pairs.sent[r] * x_row) << "rank " << r;
    EXPECT_EQ(rep.combine.payload_bytes[r], pairs.received[r] * y_row) << "rank " << r;
    total_dispatch += pairs.sent[r] * x_row;
    // Per-rank latencies: one per timed iteration, every call took time.
    ASSERT_EQ(m.records[r].dispatch.size(), static_cast<std::size_t>(o.iters));
    ASSERT_EQ(m.records[r].combine.size(), static_cast<std::size_t>(o.iters));
    for (const auto& c : m.records[r].dispatch) EXPECT_GT(c.lat_us, 0.0);
    EXPECT_EQ(rep.dispatch.rank_series[r].size(), static_cast<std::size_t>(o.iters));
    // The compact output holds one row per (token, destination) pair received.
    EXPECT_EQ(m.records[r].out_rows, pairs.received[r]) << "rank " << r;
    EXPECT_GT(m.records[r].window_bytes, 0u);
    // Counters on: the engine moved at least the payload, and the phases cover time.
    EXPECT_GE(rep.dispatch.bytes_rank[r], static_cast<double>(rep.dispatch.payload_bytes[r]));
  }
  EXPECT_EQ(rep.dispatch.total_payload, total_dispatch);
  EXPECT_TRUE(rep.dispatch.counters);
  // The limit: the faster of the memcpy and the streaming copy, measured.
  EXPECT_GT(rep.dispatch.limit_gbps, 0.0);
  EXPECT_TRUE(rep.dispatch.limit_name == "memcpy" || rep.dispatch.limit_name == "streaming copy");
  // Independent count and epx's byte counters agreed: no warning.
  EXPECT_TRUE(rep.warnings.empty()) << rep.warnings.front();
}

}  // namespace
