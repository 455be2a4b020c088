// Fresh handles' recycled arrays (src/ep/handle_recycler.hpp) and the routing plan built
// into a reused plan (epx/plan.hpp): a dead handle's arrays come back empty with their
// memory, never while it is alive, a handle may outlive its recycler, and a plan built over
// an older, larger one equals the plan built from nothing.
#include "handle_recycler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "epx/plan.hpp"

namespace epx::detail {
namespace {

TEST(HandleRecycler, ADeadHandlesArraysComeBackEmptyWithTheirMemory) {
  HandleRecycler recycler;
  auto h = recycler.make();
  h->recv_slot_row.assign(1000, 7);
  h->plan.segment_token.assign(500, 3);
  const std::int32_t* rows = h->recv_slot_row.data();
  const std::int32_t* tokens = h->plan.segment_token.data();
  h.reset();
  auto next = recycler.make();
  EXPECT_TRUE(next->recv_slot_row.empty());
  EXPECT_TRUE(next->plan.segment_token.empty());
  EXPECT_GE(next->recv_slot_row.capacity(), 1000u);
  EXPECT_EQ(next->recv_slot_row.data(), rows);
  EXPECT_EQ(next->plan.segment_token.data(), tokens);
  EXPECT_EQ(next->out_rows, 0);  // everything else a default HandleState
}

TEST(HandleRecycler, ALiveHandleKeepsItsArrays) {
  HandleRecycler recycler;
  auto alive = recycler.make();
  alive->recv_token.assign(100, 1);
  auto other = recycler.make();
  EXPECT_EQ(other->recv_token.capacity(), 0u);
  EXPECT_EQ(alive->recv_token, std::vector<std::int32_t>(100, 1));
}

TEST(HandleRecycler, AHandleMayOutliveItsRecycler) {
  std::shared_ptr<HandleState> h;
  {
    HandleRecycler recycler;
    h = recycler.make();
    h->recv_slot_weight.assign(10, 0.5f);
  }
  EXPECT_EQ(h->recv_slot_weight.size(), 10u);
  h.reset();  // its recycler is gone: the arrays are freed (ASan/valgrind would see a leak or a bad write)
}

std::vector<std::int64_t> random_topk(std::int64_t S, int K, int E, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(S * K));
  for (std::int64_t t = 0; t < S; ++t) {
    std::vector<int> experts(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) experts[static_cast<std::size_t>(e)] = e;
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int k = 0; k < K; ++k)  // distinct experts, some slots masked
      idx[static_cast<std::size_t>(t * K + k)] = rng() % 5 == 0 ? -1 : experts[static_cast<std::size_t>(k)];
  }
  return idx;
}

TEST(RoutingPlanInto, EqualsAFreshPlanOverAnOlderLargerOne) {
  const RoutingShape big{300, 8, 64, 8}, small{77, 8, 64, 8};
  const std::vector<std::int64_t> a = random_topk(big.num_tokens, 8, 64, 1), b = random_topk(small.num_tokens, 8, 64, 2);
  RoutingPlan reused = build_routing_plan(a.data(), big);
  build_routing_plan(b.data(), small, reused);
  const RoutingPlan fresh = build_routing_plan(b.data(), small);
  EXPECT_EQ(reused.shape.num_tokens, fresh.shape.num_tokens);
  EXPECT_EQ(reused.token_begin, fresh.token_begin);
  EXPECT_EQ(reused.entry_rank, fresh.entry_rank);
  EXPECT_EQ(reused.entry_position, fresh.entry_position);
  EXPECT_EQ(reused.entry_max_slot, fresh.entry_max_slot);
  EXPECT_EQ(reused.segment_begin, fresh.segment_begin);
  EXPECT_EQ(reused.segment_token, fresh.segment_token);
  EXPECT_EQ(reused.slots_per_expert, fresh.slots_per_expert);
  EXPECT_EQ(reused.slot_rank_in_expert, fresh.slot_rank_in_expert);
  // and the fresh plan is the routing's: token t's entries are its distinct ranks, ascending
  for (std::int64_t t = 0; t < small.num_tokens; ++t) {
    std::vector<std::int32_t> ranks;
    for (int k = 0; k < 8; ++k)
      if (const std::int64_t e = b[static_cast<std::size_t>(t * 8 + k)]; e >= 0) ranks.push_back(static_cast<std::int32_t>(e / 8));
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    const std::vector<std::int32_t> got(fresh.entry_rank.begin() + fresh.token_begin[static_cast<std::size_t>(t)],
                                        fresh.entry_rank.begin() + fresh.token_begin[static_cast<std::size_t>(t) + 1]);
    EXPECT_EQ(got, ranks) << "token " << t;
  }
}

}  // namespace
}  // namespace epx::detail
