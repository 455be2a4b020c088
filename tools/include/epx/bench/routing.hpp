// `epx bench` inputs: the routing (generated or read from a docs/spec.md §7 directory), x, and an
// independent count of what that routing moves (payload bytes, rows, histograms).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"
#include "epx/tensor.hpp"

namespace epx::tools {

/// One rank's inputs.
struct BenchRankInput {
  std::int64_t tokens = 0;                ///< S_r
  std::vector<std::int64_t> topk_idx;     ///< [S, K]
  std::vector<float> topk_weights;        ///< [S, K]
  Tensor x;                               ///< [S, H] bf16 or fp8_e4m3
  Tensor x_scales;                        ///< [S, H/128] float32 (fp8)
};

/// Every rank's inputs, built before the ranks start (forked ranks inherit them).
struct BenchProblem {
  int ranks = 0, experts = 0, hidden = 0, topk = 0;
  std::int64_t max_tokens = 0;  ///< C
  bool fp8 = false;
  std::string source;           ///< "uniform top-8, seed 1", "zipf s=1.2 ...", "DIR"
  std::vector<BenchRankInput> rank;

  int local_experts() const noexcept { return experts / ranks; }
  /// Bytes of one dispatched x row: H*2 (bf16) or H + H/128*4 (fp8 data + scales).
  std::size_t x_row_bytes() const noexcept;
  /// Bytes of one combine row: H*2 (bf16).
  std::size_t y_row_bytes() const noexcept { return static_cast<std::size_t>(hidden) * 2; }
};

/// DeepSeek-V3's group-limited top-k for one token: experts [g*E/G, (g+1)*E/G) form group g;
/// a group's score is the sum of its two best expert scores (its best alone when a group
/// has one expert); the token keeps its `topk_groups` best groups and writes to `out` the
/// `topk` best experts among theirs, best first. Ties go to the lower index (groups and
/// experts). Requires groups | experts, 1 <= topk_groups <= groups, topk <= topk_groups*E/G.
void group_limited_topk(const double* scores, int experts, int groups, int topk_groups, int topk, std::int64_t* out);

/// The group options against the shape: both 0 (no limit), or groups dividing E, topk_groups
/// in [1, groups], K <= topk_groups x E/groups, and no --skew. Throws kInvalidArgument
/// naming --groups / --topk-groups and the expected value.
void check_group_limit(int groups, int topk_groups, int experts, int topk, double skew);

/// Generates (uniform or Zipf-like, deterministic from the seed; group-limited with
/// o.groups > 0: every expert of a token gets a uniform score in [0, 1) from the rank's
/// stream, then group_limited_topk) or reads (--routing) the
/// problem. Throws epx::Error naming the rank and file on a bad input directory.
BenchProblem make_problem(const BenchOptions& o);

/// What a routing moves, counted with plain loops from topk_idx alone (independent of the
/// engine's plan and counters).
struct RouteCount {
  int ranks = 0, experts = 0, topk = 0;
  bool expanded = false;  ///< the layout is expanded: its rows are one per slot (moved_*), not per (token, rank)
  std::size_t x_row_bytes = 0, y_row_bytes = 0;
  std::vector<std::int64_t> tokens;           ///< [P] S_r
  std::vector<std::int64_t> sent_rows;        ///< [P] (token, unique destination) pairs of the rank
  std::vector<std::int64_t> sent_local_rows;  ///< [P] ... whose destination is the rank itself
  std::vector<std::int64_t> recv_rows;        ///< [P] compact rows received (= combine rows sent back)
  std::vector<std::int64_t> recv_local_rows;  ///< [P] ... of them from the rank itself
  std::vector<std::int64_t> recv_slots;       ///< [P] (t, k) slots routed to the rank's experts
  std::vector<std::int64_t> recv_local_slots; ///< [P] ... of them from the rank's own tokens
  std::vector<std::int64_t> sent_slots;       ///< [P] (t, k) slots of the rank's tokens (k with an expert)
  std::vector<std::int64_t> out_rows;         ///< [P] dispatch output rows in the layout (incl. padding)
  std::vector<std::int64_t> expert_rows;      ///< [E] slots per expert
  /// [P * P] (token, unique destination) rows from source s to destination d at [s * P + d]
  /// (dispatch sends them s -> d, combine returns them d -> s).
  std::vector<std::int64_t> pair_rows;
  /// [P * P] the (t, k) slots of source s's tokens at destination d's experts, at [s * P + d].
  std::vector<std::int64_t> pair_slots;
  /// [P][min(K, P) + 1]: tokens of rank r with n unique destination ranks (n = 0 .. min(K, P)).
  std::vector<std::vector<std::int64_t>> unique_dest_hist;

  std::int64_t dispatch_bytes(int r) const noexcept { return sent_rows[idx(r)] * static_cast<std::int64_t>(x_row_bytes); }
  std::int64_t dispatch_local_bytes(int r) const noexcept {
    return sent_local_rows[idx(r)] * static_cast<std::int64_t>(x_row_bytes);
  }
  std::int64_t combine_bytes(int r) const noexcept { return recv_rows[idx(r)] * static_cast<std::int64_t>(y_row_bytes); }
  std::int64_t combine_local_bytes(int r) const noexcept {
    return recv_local_rows[idx(r)] * static_cast<std::int64_t>(y_row_bytes);
  }
  /// The rows of the layout, what a copy producing the same result moves (the limit copies
  /// these): compact = the payload; expanded = one row per slot — the dispatch fills one
  /// output row per (t, k) with x's row (at the sender: its tokens' slots), the combine's y
  /// has one row per slot (at the expert rank: the slots it received). The payload counts
  /// a (token, rank) row once however many of its slots the rank holds (what a push moves).
  std::int64_t moved_dispatch_bytes(int r) const noexcept {
    return expanded ? sent_slots[idx(r)] * static_cast<std::int64_t>(x_row_bytes) : dispatch_bytes(r);
  }
  std::int64_t moved_combine_bytes(int r) const noexcept {
    return expanded ? recv_slots[idx(r)] * static_cast<std::int64_t>(y_row_bytes) : combine_bytes(r);
  }

 private:
  static std::size_t idx(int r) noexcept { return static_cast<std::size_t>(r); }
};

/// Counts a routing: `topk_idx[r]` is rank r's [tokens[r], K] int64 (values in [-1, E)).
RouteCount count_routes(int ranks, int experts, int topk, const std::vector<const std::int64_t*>& topk_idx,
                        const std::vector<std::int64_t>& tokens, std::size_t x_row_bytes, std::size_t y_row_bytes,
                        bool expanded, int alignment);
RouteCount count_routes(const BenchProblem& p, bool expanded, int alignment);

}  // namespace epx::tools
