// The contents of a DispatchHandle: everything a dispatch decided (the routing plan, the
// slots of every row on both sides), shared by its combine and its cached dispatches.
#pragma once

#include <cstdint>
#include <vector>

#include "epx/buffer.hpp"

namespace epx::detail {

/// Everything a dispatch decided, shared by its combine and its cached dispatches.
struct HandleState {
  std::uint64_t buffer_id = 0;
  std::uint64_t dispatch_epoch = 0;  // the collective call that made it (same on every rank)
  int rank = 0;
  RecvLayout layout = RecvLayout::kCompact;
  int alignment = 1;
  std::int64_t worst = 0;
  bool zero_padding = true;  // its padding rows were zeroed: so are its cached dispatches'
  RoutingPlan plan;  // sender side: who sends which row where
  // Sender side, per destination d: first row of my segment in d's receive area.
  std::vector<std::int64_t> send_base;  // [P]
  // Receiver side: rows from source s are [recv_begin[s], recv_begin[s+1]).
  std::vector<std::int64_t> recv_begin;  // [P + 1]
  // Receiver side, per source s: first row of my replies in s's combine area.
  std::vector<std::int64_t> reply_base;  // [P]
  std::int64_t out_rows = 0;             // rows of the dispatch output
  std::vector<std::int64_t> out_rows_at;  // [P] rows of every receiver's output (sizes its output block)
  std::vector<std::int64_t> expert_count;   // [L] unaligned n_j
  std::vector<std::int64_t> expert_offset;  // [L + 1] expanded; o_L = aligned total
  // Sender side, receivers with the expanded layout (fresh dispatch; kept for its cached
  // dispatches and its pull combines): the slots of my segment entry i (segment order, as
  // plan.segment_token) are slot_row[slot_begin[i] .. slot_begin[i+1]) — their rows in the
  // receiver's expanded output, ascending k — and slot_k the k of each. Empty otherwise.
  std::vector<std::int32_t> slot_begin;  // [entries + 1]
  std::vector<std::int32_t> slot_row;    // [slots to expanded receivers]
  std::vector<std::int32_t> slot_k;
  // Receiver side, per received row r and slot k: expanded layout, the output row of the
  // slot; compact layout, its local expert (-1 either way: the expert is not on this rank);
  // and the slot's routing weight (0 when not here). Plus each row's source token.
  std::vector<std::int32_t> recv_token;    // [N]
  std::vector<std::int32_t> recv_relay_row;  // [N] hierarchical: row in the relay's area, -1 if direct
  std::vector<std::int32_t> recv_slot_row; // [N * K]
  std::vector<float> recv_slot_weight;     // [N * K]
  Tensor topk_weights;                     // [S, K] returned by combine
  // Sender side, expanded layout with per-selection replies (CombineReplies::kSelections):
  // the rank of slot (t, k)'s expert, -1 for a masked slot (the combine's groups). Else empty.
  std::vector<std::int32_t> slot_dest;     // [S * K]
  // Hierarchical schedule, sender side: per relay rank r (one per other server), my tokens
  // that go through r, in token order, and my first row in r's relay area.
  std::vector<std::vector<std::int32_t>> relay_tokens;  // [P], empty for non-relays
  std::vector<std::int64_t> relay_base;                 // [P]
  // Relay side: rows relayed for source s are [relayed_begin[s], relayed_begin[s+1]).
  std::vector<std::int64_t> relayed_begin;  // [P + 1]
  // Member side: relayed_begin of each rank d of my server (from the gathered counts; the
  // others empty): where my replies to d's sources lie in d's chunks (paths/combine_relay.cpp).
  std::vector<std::vector<std::int64_t>> relayed_begin_at;  // [P][P + 1]
  // Relay side: per relayed row and lane of my server, the reply row at the source (-1: none).
  std::vector<std::int32_t> relayed_reply_row;  // [relayed rows x lanes]
  // Relay side: per relayed row and lane, the row's slot at that lane's rank (its receive
  // row, the row of its y; -1: none): a node-first combine sums in place from it.
  std::vector<std::int32_t> relayed_slot;  // [relayed rows x lanes]
  // Node-first combine: a relay's sums for source s land in s's relay area (free during a
  // combine) from row sums_at_source[s] on, one per relayed row; the sums for my tokens from
  // relay r, one per token of relay_tokens[r], from row my_sums[r] on. Both = the source's
  // tokens through relays below r (plan_relay, one formula).
  std::vector<std::int64_t> sums_at_source;  // [P] relay side
  std::vector<std::int64_t> my_sums;         // [P] source side
  std::int64_t num_recv() const noexcept { return recv_begin.back(); }
};

}  // namespace epx::detail
