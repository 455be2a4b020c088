#include <algorithm>

#include "epx/plan.hpp"

namespace epx {

std::optional<RoutingIssue> check_topk_idx(const std::int64_t* topk_idx, const RoutingShape& shape) {
  const int K = shape.num_topk;
  // The message is built only for the slot that fails: this scan runs on every fresh dispatch.
  auto issue = [&](std::int64_t t, int k, const std::string& what) {
    return RoutingIssue{t, k, "topk_idx[" + std::to_string(t) + ", " + std::to_string(k) + "] = " +
                                  std::to_string(topk_idx[t * K + k]) + " " + what};
  };
  for (std::int64_t t = 0; t < shape.num_tokens; ++t) {
    const std::int64_t* row = topk_idx + t * K;
    for (int k = 0; k < K; ++k) {
      const std::int64_t e = row[k];
      if (e < -1 || e >= shape.num_experts)
        return issue(t, k, "is outside [-1, " + std::to_string(shape.num_experts) + ")");
      if (e < 0) continue;
      for (int j = 0; j < k; ++j)
        if (row[j] == e) return issue(t, k, "repeats slot " + std::to_string(j) + " (each expert at most once per token)");
    }
  }
  return std::nullopt;
}

RoutingPlan build_routing_plan(const std::int64_t* topk_idx, const RoutingShape& shape) {
  RoutingPlan plan;
  build_routing_plan(topk_idx, shape, plan);
  return plan;
}

void build_routing_plan(const std::int64_t* topk_idx, const RoutingShape& shape, RoutingPlan& plan) {
  const std::int64_t S = shape.num_tokens;
  const int K = shape.num_topk, P = shape.num_ranks, L = shape.local_experts();
  plan.shape = shape;
  plan.entry_rank.clear();
  plan.entry_max_slot.clear();
  plan.token_begin.assign(static_cast<std::size_t>(S) + 1, 0);
  plan.segment_begin.assign(static_cast<std::size_t>(P) + 1, 0);
  plan.slots_per_expert.assign(static_cast<std::size_t>(shape.num_experts), 0);
  plan.slot_rank_in_expert.assign(static_cast<std::size_t>(S * K), -1);
  plan.entry_rank.reserve(static_cast<std::size_t>(S) * static_cast<std::size_t>(std::min(K, P)));
  plan.entry_max_slot.reserve(plan.entry_rank.capacity());

  // Pass 1, per token: unique destination ranks (ascending), the largest slot on each,
  // and each slot's rank among this rank's slots for its expert.
  std::vector<std::pair<int, int>> dst;  // (rank, k), at most K per token
  dst.reserve(static_cast<std::size_t>(K));
  const auto uL = static_cast<std::uint32_t>(L);
  for (std::int64_t t = 0; t < S; ++t) {
    const std::int64_t* row = topk_idx + t * K;
    dst.clear();
    for (int k = 0; k < K; ++k) {
      if (row[k] < 0) continue;
      const auto e = static_cast<std::size_t>(row[k]);
      plan.slot_rank_in_expert[static_cast<std::size_t>(t * K + k)] = plan.slots_per_expert[e]++;
      // 0 <= e < E (check_topk_idx; E fits an int): a 32-bit division, cheaper than a 64-bit one.
      const std::pair<int, int> at{static_cast<int>(static_cast<std::uint32_t>(e) / uL), k};
      // Insertion into (rank, k) order: at most K entries, most already in place.
      dst.push_back(at);
      for (std::size_t j = dst.size() - 1; j > 0 && at < dst[j - 1]; --j) std::swap(dst[j], dst[j - 1]);
    }
    for (std::size_t i = 0; i < dst.size(); ++i) {
      const bool last_of_rank = i + 1 == dst.size() || dst[i + 1].first != dst[i].first;
      if (!last_of_rank) continue;  // sorted by (rank, k): the last one has the largest k
      plan.entry_rank.push_back(dst[i].first);
      plan.entry_max_slot.push_back(dst[i].second);
      ++plan.segment_begin[static_cast<std::size_t>(dst[i].first) + 1];
    }
    plan.token_begin[static_cast<std::size_t>(t) + 1] = static_cast<std::int32_t>(plan.entry_rank.size());
  }

  // Pass 2: segments per destination (counting sort keeps tokens ascending).
  for (int d = 0; d < P; ++d) plan.segment_begin[static_cast<std::size_t>(d) + 1] += plan.segment_begin[static_cast<std::size_t>(d)];
  const std::size_t entries = plan.entry_rank.size();
  plan.segment_token.resize(entries);
  plan.entry_position.resize(entries);
  std::vector<std::int32_t> fill(plan.segment_begin.begin(), plan.segment_begin.end() - 1);
  for (std::int64_t t = 0; t < S; ++t) {
    for (std::int32_t i = plan.token_begin[static_cast<std::size_t>(t)]; i < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++i) {
      const auto d = static_cast<std::size_t>(plan.entry_rank[static_cast<std::size_t>(i)]);
      plan.entry_position[static_cast<std::size_t>(i)] = fill[d] - plan.segment_begin[d];
      plan.segment_token[static_cast<std::size_t>(fill[d]++)] = static_cast<std::int32_t>(t);
    }
  }
}

}  // namespace epx
