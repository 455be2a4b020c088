// epx sim ledger: the engine's counters on the real routing against the closed form, and
// against plain-loop counts of the same routing (count_routes).
#include <gtest/gtest.h>

#include <cmath>

#include "epx/bench/routing.hpp"
#include "epx/sim/runner/ledger.hpp"

namespace epx::tools {
namespace {

TEST(SimLedger, ClosedFormByHand) {
  EXPECT_NEAR(expected_unique_ranks(8, 6), 8 * (1 - std::pow(7.0 / 8, 6)), 1e-12);
  EXPECT_NEAR(expected_unique_ranks(8, 6), 4.409637, 1e-6);  // 8 (1 - 0.448795)
  EXPECT_DOUBLE_EQ(expected_unique_ranks(1, 6), 1.0);   // one rank: every token goes there once
  EXPECT_DOUBLE_EQ(expected_unique_ranks(64, 1), 1.0);  // top-1: one destination
  EXPECT_NEAR(expected_unique_ranks(1 << 20, 6), 6.0, 1e-4);  // many ranks: every expert on its own rank
  // Distinct experts: one rank holding all experts, or one expert per rank.
  EXPECT_NEAR(expected_unique_ranks_distinct(1, 256, 6), 1.0, 1e-12);
  EXPECT_NEAR(expected_unique_ranks_distinct(256, 256, 6), 6.0, 1e-12);
  // Without replacement a token reaches a few more ranks than with.
  EXPECT_GT(expected_unique_ranks_distinct(8, 256, 6), expected_unique_ranks(8, 6));
  EXPECT_DOUBLE_EQ(dispatch_row_bytes(7168, 6, true), 7168 + 56 * 4 + 6 * 12);
  EXPECT_DOUBLE_EQ(dispatch_row_bytes(7168, 6, false), 2 * 7168 + 6 * 12);
  EXPECT_DOUBLE_EQ(combine_row_bytes(7168), 2 * 7168);
}

// The measured columns come from the engine (dispatch handle rows, put counters, the sim
// transport's per-peer bytes) on the routing it ran: they must match plain-loop counts of
// that routing exactly where they count the same thing, and the closed form within the
// sampling noise of 2048 tokens per rank.
TEST(SimLedger, EngineCountersMatchTheRoutingAndTheClosedForm) {
  SimOptions o;
  o.ep = {8, 16};
  o.tokens = 2048;
  o.topology = "builtin:servers:4";
  o.progress = false;
  const std::vector<LedgerRow> rows = ledger(o);
  ASSERT_EQ(rows.size(), 2u);
  for (const LedgerRow& r : rows) {
    SCOPED_TRACE("EP" + std::to_string(r.ep));
    const BenchProblem problem = sim_problem(o, r.ep);
    const RouteCount count = count_routes(problem, false, 1);
    double recv = 0, local = 0;
    for (int p = 0; p < r.ep; ++p) {
      recv += static_cast<double>(count.recv_rows[static_cast<std::size_t>(p)]);
      local += static_cast<double>(count.recv_local_rows[static_cast<std::size_t>(p)]);
    }
    const double tokens = static_cast<double>(o.tokens) * r.ep;
    EXPECT_DOUBLE_EQ(r.unique_measured, recv / tokens);  // the engine received every (token, rank) pair once
    EXPECT_DOUBLE_EQ(r.combine_token_bytes_measured, recv / tokens * combine_row_bytes(o.hidden));  // replies: rows only
    EXPECT_NEAR(r.local_fraction_measured, local / recv, 0.002);  // bytes, not rows: the metadata record differs a little
    // The closed form, within sampling noise (distinct experts: the exact expectation).
    EXPECT_NEAR(r.unique_measured, r.unique_distinct, 0.01 * r.unique_distinct);
    EXPECT_NEAR(r.unique_measured, r.unique, 0.02 * r.unique);
    EXPECT_NEAR(r.local_fraction_measured, r.local_fraction, 0.1 * r.local_fraction);
    // Dispatch: the engine's row (x + scales + its metadata record) is within 1% of the logical row.
    EXPECT_NEAR(r.dispatch_token_bytes_measured, r.dispatch_token_bytes, 0.025 * r.dispatch_token_bytes);
    EXPECT_NEAR(r.layer_rank_bytes_measured, r.layer_rank_bytes, 0.025 * r.layer_rank_bytes);
    // Servers of 4: flat crossings from the transport's per-peer bytes, hierarchical from the routing.
    EXPECT_EQ(r.servers, r.ep / 4);
    EXPECT_NEAR(r.cross_flat_measured, r.cross_flat, 0.03 * r.cross_flat);
    EXPECT_NEAR(r.cross_hier_routing, r.cross_hier, 0.03 * r.cross_hier);
    EXPECT_LT(r.cross_hier, r.cross_flat);  // a token crosses to a server once
  }
}

}  // namespace
}  // namespace epx::tools
