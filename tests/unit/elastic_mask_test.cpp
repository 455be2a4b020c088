// map_to_live_replicas (epx/eplb.hpp): the replica rule of map_to_replicas restricted to the
// replicas on surviving ranks, dense renumbering, dropped pairs counted; checked against the
// plan by plain loops.
#include <gtest/gtest.h>

#include <algorithm>

#include "epx/eplb.hpp"
#include "epx/error.hpp"

namespace epx {
namespace {

constexpr int kP = 4, kLogical = 6, kReplicas = 8, kTopk = 2, kPerRank = kReplicas / kP;

EplbPlan plan() {
  // Expert 0 hottest: it gets replicas; experts 4, 5 have one copy each.
  return rebalance_experts({60, 30, 20, 10, 5, 4}, 1, kLogical, kReplicas, 1, 1, kP);
}

std::vector<std::int64_t> routing() {
  std::vector<std::int64_t> idx;
  for (int t = 0; t < 30; ++t) {
    idx.push_back(t % kLogical);
    idx.push_back(t % 5 == 0 ? -1 : (t + 1 + t / kLogical) % kLogical);  // never t's first expert (t < 30)
  }
  return idx;
}

TEST(ElasticMask, WithNoLostRankItIsMapToReplicas) {
  const EplbPlan p = plan();
  for (ReplicaChoice c : {ReplicaChoice::kSpread, ReplicaChoice::kPreferRank, ReplicaChoice::kPreferServer})
    for (int r = 0; r < kP; ++r) {
      const ReplicaRouting routing_of{0, r, kP, 2, c};
      const MaskedRouting m = map_to_live_replicas(routing(), kTopk, p, routing_of, {});
      EXPECT_EQ(m.topk_idx, map_to_replicas(routing(), kTopk, p, routing_of));
      EXPECT_EQ(m.num_experts, kReplicas);
      EXPECT_EQ(m.dropped_pairs, 0);
      EXPECT_EQ(m.dropped_tokens, 0);
    }
}

TEST(ElasticMask, LiveReplicasOnlyRenumberedDenselyAndDropsCounted) {
  const EplbPlan p = plan();
  const auto idx = routing();
  for (int lost = 0; lost < kP; ++lost) {
    for (ReplicaChoice c : {ReplicaChoice::kSpread, ReplicaChoice::kPreferRank}) {
      const int r = (lost + 1) % kP;
      const MaskedRouting m = map_to_live_replicas(idx, kTopk, p, {0, r, kP, 1, c}, {lost});
      EXPECT_EQ(m.num_experts, kReplicas - kPerRank);
      std::int64_t pairs = 0, tokens = 0;
      for (std::size_t t = 0; t < idx.size() / kTopk; ++t) {
        bool dropped = false;
        for (int k = 0; k < kTopk; ++k) {
          const std::size_t i = t * kTopk + static_cast<std::size_t>(k);
          const std::int64_t e = idx[i], got = m.topk_idx[i];
          if (e < 0) {
            EXPECT_EQ(got, -1);
            continue;
          }
          std::vector<std::int64_t> live;  // the replicas on survivors, in the new numbering
          bool local = false;
          for (int j = 0; j < p.logcnt[static_cast<std::size_t>(e)]; ++j) {
            const std::int64_t s = p.log2phy[static_cast<std::size_t>(e * p.max_replicas + j)];
            const std::int64_t owner = s / kPerRank;
            if (owner == lost) continue;
            live.push_back(s - (owner > lost ? kPerRank : 0));
            local |= owner == r;
          }
          if (live.empty()) {
            EXPECT_EQ(got, -1) << "token " << t << " slot " << k;
            ++pairs;
            dropped = true;
            continue;
          }
          EXPECT_NE(std::find(live.begin(), live.end(), got), live.end()) << "not a live replica: token " << t;
          if (c == ReplicaChoice::kSpread) {
            EXPECT_EQ(got, live[t % live.size()]);
          }
          const int new_r = r < lost ? r : r - 1;
          if (c == ReplicaChoice::kPreferRank && local) {
            EXPECT_EQ(got / kPerRank, new_r) << "skipped the local replica";
          }
          // The logical expert is kept: the old slot of the new number serves e.
          const std::int64_t old_slot = got + (got / kPerRank >= lost ? kPerRank : 0);
          EXPECT_EQ(p.phy2log[static_cast<std::size_t>(old_slot)], e);
        }
        tokens += dropped;
      }
      EXPECT_EQ(m.dropped_pairs, pairs);
      EXPECT_EQ(m.dropped_tokens, tokens);
    }
  }
  // Some rank holds the only copy of a routed expert: that case drops.
  std::int64_t any = 0;
  for (int lost = 0; lost < kP; ++lost) any += map_to_live_replicas(idx, kTopk, p, {0, (lost + 1) % kP, kP}, {lost}).dropped_pairs;
  EXPECT_GT(any, 0);
}

TEST(ElasticMask, BadLostRanksAreRefused) {
  const EplbPlan p = plan();
  EXPECT_THROW(map_to_live_replicas(routing(), kTopk, p, {0, 0, kP}, {kP}), Error);
  EXPECT_THROW(map_to_live_replicas(routing(), kTopk, p, {0, 0, kP}, {1, 1}), Error);
  EXPECT_THROW(map_to_live_replicas(routing(), kTopk, p, {0, 1, kP}, {1}), Error);  // the routing's own rank is lost
  EXPECT_THROW(map_to_live_replicas({7, 0}, kTopk, p, {0, 0, kP}, {1}), Error);
}

}  // namespace
}  // namespace epx
