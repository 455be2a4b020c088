// Pieces of `epx replay` that tests and `epx bench --routing` reuse.
#pragma once

#include <cstdint>
#include <filesystem>

#include "epx/buffer.hpp"

namespace epx::tools {

/// IN/meta.json of SPEC §7, with num_max_tokens_per_rank defaulted to the largest S_r
/// (read from the ranks' topk_idx.npy shapes).
struct ReplayMeta {
  int num_ranks = 0, num_experts = 0, hidden = 0, num_topk = 0;
  std::int64_t max_tokens_per_rank = 0;
};
ReplayMeta read_replay_meta(const std::filesystem::path& in);

/// SPEC §7's fixed expert function on a dispatch output: y = bf16(v * g(n)) per row, with
/// v = f32(row) (FP8: f32(q) * scale), g(n) = float((n + 1) * 256^(n mod 4)), n = the
/// row's local expert (expanded) or the sum of its valid recv_topk_idx (compact).
/// Padding rows give zero rows. Returns [rows, H] bf16.
Tensor replay_expert(const DispatchResult& d, RecvLayout layout, int hidden, int num_topk);

}  // namespace epx::tools
