// epx/plan.hpp — routing: the dispatch layout (docs/spec.md §2) and the compact routing plan.
//
// Local (not collective), pure functions of one rank's topk_idx. Everything here is
// O(S·K + P + E): no [S, P] scan per token.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epx/error.hpp"
#include "epx/tensor.hpp"

namespace epx {

/// Sizes of one routing problem on one rank.
struct RoutingShape {
  std::int64_t num_tokens = 0;  ///< S_r
  int num_topk = 0;             ///< K
  int num_experts = 0;          ///< E
  int num_ranks = 0;            ///< P; E % P == 0
  int local_experts() const noexcept { return num_experts / num_ranks; }
};

/// A problem found in topk_idx: which token and slot, and what was wrong.
struct RoutingIssue {
  std::int64_t token = -1;
  int slot = -1;
  std::string message;  ///< e.g. "topk_idx[3, 1] = 300 is outside [-1, 256)"
};

/// Checks every topk_idx value is in [-1, E) and no token names an expert twice.
/// `topk_idx` is [S, K] int64, row-major. Returns the first issue in (token, slot) order.
std::optional<RoutingIssue> check_topk_idx(const std::int64_t* topk_idx, const RoutingShape& shape);

/// docs/spec.md §2, what DeepEP's get_dispatch_layout returns for the same input.
struct DispatchLayout {
  std::vector<std::int32_t> num_tokens_per_rank;    ///< [P]
  std::vector<std::int32_t> num_tokens_per_expert;  ///< [E]
  Tensor is_token_in_rank;                          ///< [S, P] bool
};

/// The compact routing plan of one source rank: per token only its unique destination
/// ranks, and per destination the tokens it sends there (a "segment"), both ascending.
/// A token is sent to a destination once, however many of its experts live there.
struct RoutingPlan {
  RoutingShape shape;
  /// Token t's destinations are entries [token_begin[t], token_begin[t+1]), ascending rank.
  std::vector<std::int32_t> token_begin;     ///< [S + 1]
  std::vector<std::int32_t> entry_rank;      ///< [entries] destination rank
  std::vector<std::int32_t> entry_position;  ///< [entries] index of the token in its destination's segment
  std::vector<std::int32_t> entry_max_slot;  ///< [entries] largest k of the token's slots on that rank
  /// Destination d's segment: tokens segment_token[segment_begin[d] .. segment_begin[d+1]), ascending.
  std::vector<std::int32_t> segment_begin;   ///< [P + 1]
  std::vector<std::int32_t> segment_token;   ///< [entries]
  /// Slots (t, k) per expert, and the index of slot (t, k) among this rank's slots for its
  /// expert (tokens ascending; -1 for a masked slot).
  std::vector<std::int32_t> slots_per_expert;  ///< [E]
  std::vector<std::int32_t> slot_rank_in_expert;  ///< [S * K]

  std::int64_t num_entries() const noexcept { return static_cast<std::int64_t>(entry_rank.size()); }
  std::int32_t tokens_to(int rank) const noexcept {
    return segment_begin[static_cast<std::size_t>(rank) + 1] - segment_begin[static_cast<std::size_t>(rank)];
  }
};

/// Builds the plan of a validated topk_idx ([S, K] int64) in O(S·K + P + E).
RoutingPlan build_routing_plan(const std::int64_t* topk_idx, const RoutingShape& shape);
/// The same plan into `plan`, whose arrays' capacity is reused (a caller that plans every
/// call keeps its pages faulted in); what `plan` held before does not matter.
void build_routing_plan(const std::int64_t* topk_idx, const RoutingShape& shape, RoutingPlan& plan);

/// docs/spec.md §2 from a plan (O(entries + E) plus writing the [S, P] bool output).
DispatchLayout make_dispatch_layout(const RoutingPlan& plan);

}  // namespace epx
