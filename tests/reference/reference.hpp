// tests/reference/reference.hpp — the independent reference of docs/spec.md (dispatch layout,
// dispatch, the fixed expert function, combine, bf16 / FP8 E4M3 conversions, cast_to_fp8).
//
// Written apart from the engine and on purpose naive: plain loops that follow docs/spec.md
// literally, over ALL ranks' inputs at once (no communication, no threads), optimised for
// clarity, not speed. Nothing from include/epx or src/ is used here, so the unit tests can
// cross-check the library's own conversions against these.
//
// Conventions
// - bf16 values are their 16 raw bits (uint16_t), FP8 E4M3 (float8_e4m3fn) their 8 raw bits.
// - Every 2-D array is a flat row-major std::vector ([rows * cols]).
// - Invalid input (topk_idx outside [-1, E), a duplicate expert in one token, E % P != 0,
//   vector sizes that do not match the shapes, alignment < 1, ...) throws
//   std::invalid_argument. A too small `worst` throws std::runtime_error (see dispatch()).
#pragma once

#include <cstdint>
#include <vector>

namespace epx::ref {

// ---------------------------------------------------------------------------------------
// Problem description: every rank's input of one dispatch/combine.

struct RankInput {
  std::int64_t num_tokens = 0;          ///< S_r
  std::vector<std::int64_t> topk_idx;   ///< [S_r * K], values in [-1, E)
  std::vector<float> topk_weights;      ///< [S_r * K]
  std::vector<std::uint16_t> x;         ///< [S_r * H] bf16 bits (when !fp8)
  std::vector<std::uint8_t> x_fp8;      ///< [S_r * H] e4m3 bits (when fp8)
  std::vector<float> x_scales;          ///< [S_r * H/128] (when fp8)
};

struct Problem {
  int num_ranks = 0;    ///< P
  int num_experts = 0;  ///< E (E % P == 0)
  int hidden = 0;       ///< H
  int num_topk = 0;     ///< K
  bool fp8 = false;     ///< x given as x_fp8 + x_scales instead of bf16 x
  std::vector<RankInput> ranks;  ///< size P
};

/// Throws std::invalid_argument naming rank/token/slot if `p` is not a valid input (docs/spec.md §1, §6).
void validate(const Problem& p);

// ---------------------------------------------------------------------------------------
// docs/spec.md §2: get_dispatch_layout of one rank.

struct Layout {
  std::vector<std::int32_t> num_tokens_per_rank;    ///< [P]
  std::vector<std::int32_t> num_tokens_per_expert;  ///< [E]
  std::vector<std::uint8_t> is_token_in_rank;       ///< [S * P], 0/1
};

/// docs/spec.md §2 for the input of `rank`.
Layout layout(const Problem& p, int rank);

// ---------------------------------------------------------------------------------------
// docs/spec.md §3: dispatch.

struct DispatchOptions {
  bool expanded = false;   ///< false: compact layout (§3.1); true: expanded layout (§3.2)
  int alignment = 1;       ///< expert_alignment A >= 1
  std::int64_t worst = 0;  ///< num_worst_tokens W; 0 = variable output size
};

struct DispatchOut {
  std::int64_t rows = 0;                     ///< N (or W when worst > 0)
  std::vector<std::uint16_t> recv_x;         ///< [rows*H] bf16 (when !fp8); padding rows all-zero bits
  std::vector<std::uint8_t> recv_x_fp8;      ///< [rows*H] (fp8); padding zero
  std::vector<float> recv_x_scales;          ///< [rows*H/128] (fp8); padding zero
  std::vector<std::int64_t> recv_topk_idx;   ///< compact only: [rows*K]; padding rows all -1
  std::vector<float> recv_topk_weights;      ///< compact only: [rows*K]; padding 0
  std::vector<float> recv_weights;           ///< expanded only: [rows]; padding 0
  std::vector<std::int64_t> recv_src;        ///< [rows*2] compact (s,t) / [rows*3] expanded (s,t,k); padding -1
  std::vector<std::int64_t> num_recv_tokens_per_expert;          ///< [L] unaligned
  std::vector<std::int64_t> num_recv_tokens_per_expert_aligned;  ///< [L] each rounded up to alignment
  std::vector<std::int64_t> expert_offsets;  ///< expanded only: [L+1] = o_0..o_L; empty for compact
};

/// ceil(n / a) * a.
std::int64_t align_up(std::int64_t n, std::int64_t a);

/// Rows `rank` needs for this dispatch without `worst`: compact N = received tokens,
/// expanded o_L = sum of align(n_j).
std::int64_t rows_needed(const Problem& p, int rank, const DispatchOptions& o);

/// Dispatch output on `rank`. Expanded rows inside an expert are in deterministic order
/// ((s,t) ascending). Padding rows are always zero-filled (x, scales), weights 0, src -1,
/// compact recv_topk_idx -1.
/// If any rank needs more than `worst` rows (worst > 0), throws std::runtime_error naming
/// the lowest such rank and both numbers (needed rows and worst).
DispatchOut dispatch(const Problem& p, int rank, const DispatchOptions& o);

/// dispatch() of every rank, index = rank.
std::vector<DispatchOut> dispatch_all(const Problem& p, const DispatchOptions& o);

// ---------------------------------------------------------------------------------------
// docs/spec.md §7: the fixed expert function.

/// c = g(n) = float((n + 1) * 256^(n mod 4)), computed exactly in integers, then rounded
/// once to float (round to nearest even).
float expert_factor(std::int64_t n);

/// The fixed expert function applied to `rank`'s dispatch output `d`: y rows [rows*H] bf16,
/// y = bf16(v * c) in float32 with v = f32(x) (FP8: f32(q) * scale, float32); n = local
/// expert j (expanded) or the sum of the row's valid recv_topk_idx values (compact).
/// Padding rows (recv_src == -1) give zero rows.
std::vector<std::uint16_t> expert_fn(const Problem& p, const DispatchOut& d, const DispatchOptions& o);

// ---------------------------------------------------------------------------------------
// docs/spec.md §4: combine.

/// Combine on `rank` (docs/spec.md §4). y[d] = the bf16 rows given to combine on each rank d
/// ([rows_d * H], rows of d's dispatch output, padding rows ignored). bias0 / bias1:
/// nullptr or per-rank [S_r * H] bf16. `weighted`: expanded layout only (throws
/// std::invalid_argument for compact). Returns [S_rank * H] bf16.
///
/// Order of float32 additions, literally:
///   acc = f32(bias0) (0.0f if absent); acc = acc + f32(bias1) (0.0f if absent);
///   expanded: for each group G (slots of the token on one destination, ascending k) in
///     ascending order of their largest k: acc = acc + f32(p_G), where
///     p_G = y[row] unchanged if |G| == 1 and unweighted, otherwise
///     p_G = bf16(((0.0f + a_k1) + a_k2) + ...) with a_k = f32(y[row_k]) (times the row's
///     routing weight in float32 when weighted);
///   compact: for each destination d ascending with is_token_in_rank[t,d]:
///     acc = acc + f32(y_d[row_d(s,t)]);
///   out = bf16(acc).
std::vector<std::uint16_t> combine(const Problem& p, const DispatchOptions& o,
                                   const std::vector<std::vector<std::uint16_t>>& y,
                                   const std::vector<std::vector<std::uint16_t>>* bias0,
                                   const std::vector<std::vector<std::uint16_t>>* bias1, bool weighted,
                                   int rank);

/// Same as above with every rank's dispatch output already computed (outs = dispatch_all()),
/// so a loop over all ranks does not recompute the dispatches.
///
/// With `node_of_rank` ([P], the node of each rank), docs/spec.md §4's node-first order instead
/// (combine reduced inside each node first): the partials above (compact: f32(y_d[row]);
/// expanded: f32(p_G), one per destination) are grouped by the node of their destination;
///   q_n = the partial unchanged if node n holds one of them, else
///   q_n = bf16(((0.0f + f32(partial_d1)) + f32(partial_d2)) + ...) over its d ascending;
///   acc = f32(bias0) + f32(bias1) as above, then acc = acc + f32(q_n) for n ascending;
///   out = bf16(acc).
std::vector<std::uint16_t> combine(const Problem& p, const DispatchOptions& o, const std::vector<DispatchOut>& outs,
                                   const std::vector<std::vector<std::uint16_t>>& y,
                                   const std::vector<std::vector<std::uint16_t>>* bias0,
                                   const std::vector<std::vector<std::uint16_t>>* bias1, bool weighted,
                                   int rank, const std::vector<int>* node_of_rank = nullptr);

// ---------------------------------------------------------------------------------------
// Own conversions (independent of epx/dtype.hpp).

/// f32(b): exact widening (decoded from sign / exponent / mantissa with ldexp).
float bf16_to_f32(std::uint16_t b);
/// bf16(f): round to nearest, ties to even (decided by exact comparison with the two
/// neighbouring bf16 values); overflow rounds to ±inf; NaN → quiet NaN keeping sign and top
/// payload bits ((bits >> 16) | 0x40).
std::uint16_t f32_to_bf16(float f);
/// Exact value of an E4M3 code; NaN (sign kept) for 0x7f / 0xff.
float e4m3_to_f32(std::uint8_t q);
/// e4m3(f): nearest finite code by search over the table of all codes, ties to the even code,
/// saturating at ±448 (also for ±inf); NaN → 0x7f | sign; sign kept for zero results.
std::uint8_t f32_to_e4m3(float f);

/// docs/spec.md §5 per_token_cast_to_fp8 of x [rows * hidden] float32 (hidden % 128 == 0):
/// q [rows * hidden], scales [rows * hidden/128]. Per 128-column block:
/// amax = max(max|x|, 1e-4f); default: q = e4m3(x * (448.0f / amax)), scale = amax / 448.0f;
/// ue8m0: scale = 2^ceil(log2(amax / 448.0f)) (exact), q = e4m3(x / scale).
void cast_to_fp8(const std::vector<float>& x, std::int64_t rows, int hidden, bool ue8m0,
                 std::vector<std::uint8_t>& q, std::vector<float>& scales);

/// dequant(q, scale) = f32(q) * scale (float32), [rows * hidden].
std::vector<float> dequant_fp8(const std::vector<std::uint8_t>& q, const std::vector<float>& scales,
                               std::int64_t rows, int hidden);

}  // namespace epx::ref
