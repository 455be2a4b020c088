// Dispatch through replicas: each (token, slot) of a logical routing picks one physical
// replica of its expert, deterministically, before the routing plan is built.
#include <algorithm>
#include <string>

#include "epx/eplb.hpp"
#include "epx/error.hpp"

namespace epx {

std::vector<std::int64_t> map_to_replicas(const std::vector<std::int64_t>& topk_idx, int num_topk,
                                          const EplbPlan& plan, const ReplicaRouting& routing) {
  const int P = routing.num_ranks;
  if (P < 1 || plan.num_replicas % P != 0)
    throw Error(ErrorCode::kInvalidArgument, "map_to_replicas: num_replicas = " + std::to_string(plan.num_replicas) +
                                                 " is not a multiple of num_ranks = " + std::to_string(P));
  if (routing.layer < 0 || routing.layer >= plan.layers)
    throw Error(ErrorCode::kInvalidArgument, "map_to_replicas: layer " + std::to_string(routing.layer) +
                                                 " outside [0, " + std::to_string(plan.layers) + ")");
  if (num_topk < 1 || topk_idx.size() % static_cast<std::size_t>(num_topk) != 0)
    throw Error(ErrorCode::kInvalidArgument, "map_to_replicas: topk_idx size is not a multiple of num_topk");
  const int per_rank = plan.num_replicas / P;
  const int per_server = std::max(1, routing.ranks_per_server);
  const std::size_t E = static_cast<std::size_t>(plan.logical_experts);
  const std::size_t R = static_cast<std::size_t>(plan.max_replicas);
  const std::int64_t* log2phy = plan.log2phy.data() + static_cast<std::size_t>(routing.layer) * E * R;
  const std::int64_t* logcnt = plan.logcnt.data() + static_cast<std::size_t>(routing.layer) * E;

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

  std::vector<std::int64_t> out(topk_idx.size());
  const std::size_t K = static_cast<std::size_t>(num_topk);
  for (std::size_t i = 0; i < topk_idx.size(); ++i) {
    const std::int64_t e = topk_idx[i];
    const std::size_t t = i / K;
    if (e == -1) {
      out[i] = -1;
      continue;
    }
    if (e < -1 || e >= plan.logical_experts)
      throw Error(ErrorCode::kInvalidArgument,
                  "rank " + std::to_string(routing.rank) + ": topk_idx[" + std::to_string(t) + ", " +
                      std::to_string(i % K) + "] = " + std::to_string(e) + " is outside [-1, " +
                      std::to_string(plan.logical_experts) + ")");
    const std::int64_t* replicas = log2phy + static_cast<std::size_t>(e) * R;
    const std::int64_t count = logcnt[e];
    std::int64_t matching = 0;
    for (std::int64_t j = 0; j < count; ++j) matching += preferred(replicas[j]);
    if (matching == 0 || matching == count) {
      out[i] = replicas[t % static_cast<std::size_t>(count)];
      continue;
    }
    std::int64_t pick = static_cast<std::int64_t>(t % static_cast<std::size_t>(matching));
    for (std::int64_t j = 0; j < count; ++j)
      if (preferred(replicas[j]) && pick-- == 0) out[i] = replicas[j];
  }
  return out;
}

}  // namespace epx
