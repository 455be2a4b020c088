// The bucket collectives of docs/spec.md §8 as plain loops, written apart from src/bucket: every
// member's input given, the expected output of one member computed element by element.
#pragma once

#include <cstdint>
#include <vector>

namespace epx::ref {

/// all_gather: concat(src_0, ..., src_{n-1}) (bytes; srcs[i] = member i's, all the same size).
std::vector<std::uint8_t> bucket_all_gather(const std::vector<std::vector<std::uint8_t>>& srcs);

/// reduce_scatter: member `member`'s shard of the sum, acc = v_0 + v_1 + ... (float32, left
/// to right), times scale unless scale == 1; bf16: v_j = f32(bf16(x_j[e])).
std::vector<float> bucket_reduce_scatter(const std::vector<std::vector<float>>& xs, int member, float scale, bool bf16);

/// all_reduce: the whole sum (float32, member order), times scale unless scale == 1.
std::vector<float> bucket_all_reduce(const std::vector<std::vector<float>>& xs, float scale);

}  // namespace epx::ref
