// Dispatch through replicas: each (token, slot) of a logical routing picks one physical
// replica of its expert, deterministically, before the routing plan is built.
#include <algorithm>
#include <string>

#include "epx/eplb.hpp"
#include "epx/error.hpp"

namespace epx {

namespace {

// pick_replicas' arguments against the plan: kInvalidArgument naming `who` otherwise.
void check_routing(const char* who, const std::vector<std::int64_t>& topk_idx, int num_topk, const EplbPlan& plan,
                   const ReplicaRouting& routing) {
  const int P = routing.num_ranks;
  const std::string fn = who;
  if (P < 1 || plan.num_replicas % P != 0)
    throw Error(ErrorCode::kInvalidArgument, fn + ": num_replicas = " + std::to_string(plan.num_replicas) +
                                                 " is not a multiple of num_ranks = " + std::to_string(P));
  if (routing.layer < 0 || routing.layer >= plan.layers)
    throw Error(ErrorCode::kInvalidArgument, fn + ": layer " + std::to_string(routing.layer) +
                                                 " outside [0, " + std::to_string(plan.layers) + ")");
  if (num_topk < 1 || topk_idx.size() % static_cast<std::size_t>(num_topk) != 0)
    throw Error(ErrorCode::kInvalidArgument, fn + ": topk_idx size is not a multiple of num_topk");
}

// The one replica rule of map_to_replicas and map_to_live_replicas: among the replicas of
// (t, k)'s logical expert that live on a rank not in `lost` (all of them when it is empty),
// in log2phy order, the t-th (mod their count) of those that satisfy the preference, or of
// all of them when none or all do. Writes the physical slot (old numbering) or -1 when the
// expert has no live replica; `dropped` counts those pairs, `dropped_tokens` the tokens
// with at least one.
void pick_replicas(const char* who, const std::vector<std::int64_t>& topk_idx, int num_topk, const EplbPlan& plan,
                   const ReplicaRouting& routing, const std::vector<bool>& lost, std::vector<std::int64_t>& out,
                   std::int64_t& dropped, std::int64_t& dropped_tokens) {
  check_routing(who, topk_idx, num_topk, plan, routing);
  const int P = routing.num_ranks;
  const int per_rank = plan.num_replicas / P;
  const int per_server = std::max(1, routing.ranks_per_server);
  const std::size_t E = static_cast<std::size_t>(plan.logical_experts);
  const std::size_t R = static_cast<std::size_t>(plan.max_replicas);
  const std::int64_t* log2phy = plan.log2phy.data() + static_cast<std::size_t>(routing.layer) * E * R;
  const std::int64_t* logcnt = plan.logcnt.data() + static_cast<std::size_t>(routing.layer) * E;

  auto live = [&](std::int64_t p) { return lost.empty() || !lost[static_cast<std::size_t>(p / per_rank)]; };
  // Does physical slot p satisfy the preference?
  auto preferred = [&](std::int64_t p) {
    const int r = static_cast<int>(p / per_rank);
    switch (routing.choice) {
      case ReplicaChoice::kSpread: return true;
      case ReplicaChoice::kPreferRank: return r == routing.rank;
      case ReplicaChoice::kPreferServer: return r / per_server == routing.rank / per_server;
    }
    return true;
  };

  out.assign(topk_idx.size(), -1);
  dropped = dropped_tokens = 0;
  const std::size_t K = static_cast<std::size_t>(num_topk);
  std::size_t last_dropped_token = ~std::size_t{0};
  for (std::size_t i = 0; i < topk_idx.size(); ++i) {
    const std::int64_t e = topk_idx[i];
    const std::size_t t = i / K;
    if (e == -1) continue;
    if (e < -1 || e >= plan.logical_experts)
      throw Error(ErrorCode::kInvalidArgument,
                  "rank " + std::to_string(routing.rank) + ": topk_idx[" + std::to_string(t) + ", " +
                      std::to_string(i % K) + "] = " + std::to_string(e) + " is outside [-1, " +
                      std::to_string(plan.logical_experts) + ")");
    const std::int64_t* replicas = log2phy + static_cast<std::size_t>(e) * R;
    const std::int64_t count = logcnt[e];
    std::int64_t alive = 0, matching = 0;
    for (std::int64_t j = 0; j < count; ++j)
      if (live(replicas[j])) ++alive, matching += preferred(replicas[j]);
    if (alive == 0) {
      ++dropped;
      if (t != last_dropped_token) ++dropped_tokens, last_dropped_token = t;
      continue;
    }
    const bool any = matching == 0 || matching == alive;  // no preference to follow
    std::int64_t pick = static_cast<std::int64_t>(t % static_cast<std::size_t>(any ? alive : matching));
    for (std::int64_t j = 0; j < count; ++j)
      if (live(replicas[j]) && (any || preferred(replicas[j])) && pick-- == 0) out[i] = replicas[j];
  }
}

}  // namespace

std::vector<std::int64_t> map_to_replicas(const std::vector<std::int64_t>& topk_idx, int num_topk,
                                          const EplbPlan& plan, const ReplicaRouting& routing) {
  std::vector<std::int64_t> out;
  std::int64_t dropped = 0, dropped_tokens = 0;
  pick_replicas("map_to_replicas", topk_idx, num_topk, plan, routing, {}, out, dropped, dropped_tokens);
  return out;
}

MaskedRouting map_to_live_replicas(const std::vector<std::int64_t>& topk_idx, int num_topk, const EplbPlan& plan,
                                   const ReplicaRouting& routing, const std::vector<int>& lost_ranks) {
  const int P = routing.num_ranks;
  std::vector<bool> lost(static_cast<std::size_t>(std::max(P, 0)), false);
  for (int r : lost_ranks) {
    if (r < 0 || r >= P || lost[static_cast<std::size_t>(r)])
      throw Error(ErrorCode::kInvalidArgument, "map_to_live_replicas: lost rank " + std::to_string(r) +
                                                   " is outside [0, " + std::to_string(P) + ") or named twice");
    lost[static_cast<std::size_t>(r)] = true;
  }
  if (routing.rank < 0 || routing.rank >= P || lost[static_cast<std::size_t>(routing.rank)])
    throw Error(ErrorCode::kInvalidArgument, "map_to_live_replicas: the routing's rank " + std::to_string(routing.rank) +
                                                 " is not a surviving rank of [0, " + std::to_string(P) + ")");
  MaskedRouting m;
  pick_replicas("map_to_live_replicas", topk_idx, num_topk, plan, routing, lost, m.topk_idx, m.dropped_pairs,
                m.dropped_tokens);
  // Renumber densely: the slots of the survivors' group, rank by rank in ascending old rank.
  const int per_rank = plan.num_replicas / P;
  std::vector<std::int64_t> lost_below(static_cast<std::size_t>(P) + 1, 0);
  for (int r = 0; r < P; ++r) lost_below[static_cast<std::size_t>(r) + 1] = lost_below[static_cast<std::size_t>(r)] + lost[static_cast<std::size_t>(r)];
  for (std::int64_t& p : m.topk_idx)
    if (p >= 0) p -= per_rank * lost_below[static_cast<std::size_t>(p / per_rank)];
  m.num_experts = per_rank * (P - static_cast<int>(lost_ranks.size()));
  return m;
}

}  // namespace epx
