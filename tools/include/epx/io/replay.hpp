// Pieces of `epx replay` that tests and `epx bench --routing` reuse.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "epx/buffer.hpp"

namespace epx::tools {

/// IN/meta.json of docs/spec.md §7, with num_max_tokens_per_rank defaulted to the largest S_r
/// (read from the ranks' topk_idx.npy shapes).
struct ReplayMeta {
  int num_ranks = 0, num_experts = 0, hidden = 0, num_topk = 0;
  std::int64_t max_tokens_per_rank = 0;
};
/// meta.json is read whole with a bound (kMaxMetaBytes; devices and FIFOs refused) and must be
/// one JSON object with nothing after it. The default C reads only the .npy headers.
ReplayMeta read_replay_meta(const std::filesystem::path& in);
/// meta.json alone (no .npy header read): without num_max_tokens_per_rank, `*max_tokens_given`
/// is false and max_tokens_per_rank 0 (the caller takes the largest S_r, e.g. all-gathered).
ReplayMeta read_replay_meta_file(const std::filesystem::path& in, bool* max_tokens_given);
inline constexpr std::size_t kMaxMetaBytes = std::size_t{1} << 20;

/// Checks every rank's input headers against meta.json before anything is loaded or
/// allocated: topk_idx [S_r, K] <i8 with S_r <= C, topk_weights [S_r, K] <f4, x [S_r, H] <u2
/// or x_fp8 [S_r, H] |u1 + x_scales [S_r, H/128] <f4 (so a `hidden` far above the files'
/// real width is refused here). `x_optional`: x and the weights may be absent (epx bench
/// --routing). Returns S_r per rank. Throws epx::Error naming the rank and the file.
std::vector<std::int64_t> check_replay_inputs(const std::filesystem::path& in, const ReplayMeta& meta, bool x_optional);
/// The same for rank `r` alone (ranks from a launcher each read their own inputs); `fp8`:
/// x_fp8 + x_scales instead of x. Returns S_r.
std::int64_t check_replay_rank_inputs(const std::filesystem::path& in, const ReplayMeta& meta, int r, bool fp8,
                                      bool x_optional);

/// What one rank of a dispatch + combine of this shape needs at least: the window (P*C
/// received rows + C*min(K,P) replies of 2H bytes, + the output pool: `output_pool_bytes`,
/// -1 = auto = P*C rows of 2H) and, in total, the window plus inputs and outputs (the
/// expert's y and — without an output pool, where recv_x is a heap copy — recv_x, of
/// max(P*C, W) rows; combined_x). `inputs`: x, topk_idx, topk_weights alone. Saturating.
struct RankFootprint {
  std::uint64_t window = 0, total = 0, inputs = 0;
};
RankFootprint rank_footprint(int P, int H, int K, std::int64_t S, std::int64_t C, std::int64_t W,
                             std::int64_t output_pool_bytes);

/// Throws kCapacityExceeded (before anything big is allocated) if P ranks of `f` do not fit
/// in the available memory, and with `shm` P windows in /dev/shm's free space.
void check_footprint(const std::string& who, const RankFootprint& f, int P, bool shm);

/// docs/spec.md §7's fixed expert function on a dispatch output: y = bf16(v * g(n)) per row, with
/// v = f32(row) (FP8: f32(q) * scale), g(n) = float((n + 1) * 256^(n mod 4)), n = the
/// row's local expert (expanded) or the sum of its valid recv_topk_idx (compact).
/// Padding rows give zero rows. Returns [rows, H] bf16.
Tensor replay_expert(const DispatchResult& d, RecvLayout layout, int hidden, int num_topk);

}  // namespace epx::tools
