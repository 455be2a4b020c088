// plan_dynamic_replicas / route_through_replicas (epx/lb.hpp): balance on Zipf routings,
// exact shares (the planned rows are the routed ones), placement rules, determinism.
#include <gtest/gtest.h>

#include <algorithm>

#include "epx/error.hpp"
#include "epx/lb.hpp"
#include "reference/fixtures.hpp"

namespace epx {
namespace {

using std::size_t;
size_t at(std::int64_t i) { return static_cast<size_t>(i); }

constexpr int kP = 8, kL = 4, kK = 4, kE = kP * kL;

ref::Problem zipf_problem(double s, std::uint64_t seed) {
  ref::FixtureOptions f;
  f.num_ranks = kP;
  f.num_experts = kE;
  f.num_topk = kK;
  f.hidden = 8;
  f.tokens = 256;
  f.zipf = s;
  f.seed = seed;
  return ref::make_problem(f);
}

std::vector<std::int64_t> counts_of(const ref::Problem& p) {
  std::vector<std::int64_t> c;
  for (const auto& r : p.ranks) {
    auto x = count_expert_slots(r.topk_idx, kE);
    c.insert(c.end(), x.begin(), x.end());
  }
  return c;
}

// The physical expert's logical expert and rank, from the documented layout.
std::int64_t logical_of(const DynamicReplicaPlan& plan, std::int64_t phys) {
  const int L = plan.home_experts, B = plan.slots;
  const std::int64_t d = phys / (L + B), j = phys % (L + B);
  return j < L ? d * L + j : plan.placement.mapping[at(d * B + (j - L))];
}

TEST(LbPlanner, ImbalanceFallsWithTheBudgetAndNeverExceedsNone) {
  for (double s : {1.0, 1.25, 1.5}) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      const auto counts = counts_of(zipf_problem(s, seed));
      double previous = 0;
      bool previous_full = true;  // the smaller budget used every slot: a larger one must do better
      for (int B = 0; B <= 4; ++B) {
        const DynamicReplicaPlan plan = plan_dynamic_replicas(counts, kP, kL, B);
        SCOPED_TRACE("zipf " + std::to_string(s) + " seed " + std::to_string(seed) + " budget " + std::to_string(B));
        EXPECT_LE(plan.imbalance_with, plan.imbalance_without);
        if (B == 0) {
          EXPECT_EQ(plan.imbalance_with, plan.imbalance_without);
          EXPECT_EQ(plan.replicas_used, 0);
        } else if (previous_full) {
          EXPECT_LT(plan.imbalance_with, previous);
        } else {  // the greedy stopped before its budget (equal shares: no single replica helps)
          EXPECT_LE(plan.imbalance_with, previous);
        }
        if (B >= 1) {
          EXPECT_LT(plan.imbalance_with, 1.05);  // from 3.5-4.8 without replicas
        }
        if (B >= 2) {  // the best any plan can do: the rows spread to within one of the mean
          std::int64_t total = 0;
          for (std::int64_t x : plan.rows_without) total += x;
          EXPECT_EQ(*std::max_element(plan.rows_with.begin(), plan.rows_with.end()), (total + kP - 1) / kP);
        }
        EXPECT_GT(plan.imbalance_without, 1.5);  // Zipf: really skewed
        previous = plan.imbalance_with;
        previous_full = plan.replicas_used == kP * B;
      }
    }
  }
}

TEST(LbPlanner, RoutingDeliversExactlyThePlannedRowsAndKeepsTheLogicalExpert) {
  const ref::Problem p = zipf_problem(1.2, 7);
  const auto counts = counts_of(p);
  const DynamicReplicaPlan plan = plan_dynamic_replicas(counts, kP, kL, 3);
  const int per_rank = kL + 3;
  std::vector<std::int64_t> rows(kP, 0), per_phys(at(kP * per_rank), 0);
  for (int r = 0; r < kP; ++r) {
    const auto& logical = p.ranks[at(r)].topk_idx;
    const auto phys = route_through_replicas(plan, r, logical, kK);
    ASSERT_EQ(phys, route_through_replicas(plan, r, logical, kK));  // deterministic
    for (size_t i = 0; i < logical.size(); ++i) {
      if (logical[i] < 0) {
        EXPECT_EQ(phys[i], -1);
        continue;
      }
      ASSERT_GE(phys[i], 0);
      ASSERT_LT(phys[i], kP * per_rank);
      EXPECT_EQ(logical_of(plan, phys[i]), logical[i]);
      for (size_t k = i - i % kK; k < i; ++k) EXPECT_NE(phys[k], phys[i]) << "a token names a physical expert twice";
      ++rows[at(phys[i] / per_rank)];
      ++per_phys[at(phys[i])];
    }
  }
  EXPECT_EQ(rows, plan.rows_with);
  // Each replica takes exactly its planned rows, and e's replicas together all of n_e.
  for (std::int64_t e = 0; e < kE; ++e) {
    std::int64_t sum = 0;
    for (std::int64_t j = plan.replica_offsets[at(e)]; j < plan.replica_offsets[at(e) + 1]; ++j) {
      EXPECT_EQ(per_phys[at(plan.replica_phys[at(j)])], plan.replica_rows[at(j)]) << "expert " << e << " replica " << j;
      sum += plan.replica_rows[at(j)];
    }
    EXPECT_EQ(sum, plan.expert_slots[at(e)]);
  }
}

TEST(LbPlanner, PlacementRulesAndDeterminism) {
  const auto counts = counts_of(zipf_problem(1.5, 11));
  const DynamicReplicaPlan a = plan_dynamic_replicas(counts, kP, kL, 2);
  const DynamicReplicaPlan b = plan_dynamic_replicas(std::vector<std::int64_t>(counts), kP, kL, 2);
  EXPECT_EQ(a.placement.mapping, b.placement.mapping);
  EXPECT_EQ(a.replica_phys, b.replica_phys);
  EXPECT_EQ(a.rows_with, b.rows_with);
  std::int64_t used = 0;
  for (int d = 0; d < kP; ++d)
    for (int s = 0; s < 2; ++s) {
      const std::int64_t e = a.placement.mapping[at(d * 2 + s)];
      if (e < 0) continue;
      ++used;
      EXPECT_NE(e / kL, d) << "a replica on its own home rank";
      for (int s2 = 0; s2 < s; ++s2) EXPECT_NE(a.placement.mapping[at(d * 2 + s2)], e) << "two replicas on one rank";
    }
  EXPECT_EQ(used, a.replicas_used);
  // Loads are the exact shares: rows_with sums to every routed slot, like rows_without.
  std::int64_t with = 0, without = 0;
  for (int d = 0; d < kP; ++d) {
    with += a.rows_with[at(d)];
    without += a.rows_without[at(d)];
  }
  EXPECT_EQ(with, without);
}

TEST(LbPlanner, RejectsBadInput) {
  const auto counts = counts_of(zipf_problem(1.0, 1));
  EXPECT_THROW(plan_dynamic_replicas({1, 2, 3}, kP, kL, 1), Error);
  auto neg = counts;
  neg[5] = -1;
  EXPECT_THROW(plan_dynamic_replicas(neg, kP, kL, 1), Error);
  EXPECT_THROW(plan_dynamic_replicas(counts, kP, kL, -1), Error);
  const DynamicReplicaPlan plan = plan_dynamic_replicas(counts, kP, kL, 1);
  const ref::Problem other = zipf_problem(1.0, 2);
  EXPECT_THROW(route_through_replicas(plan, 0, other.ranks[0].topk_idx, kK), Error);  // not the counted routing
  EXPECT_THROW(count_expert_slots({0, kE}, kE), Error);
}

}  // namespace
}  // namespace epx
