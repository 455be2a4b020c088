// The bucket collectives' arithmetic (docs/spec.md §8): sums in member order, float32, no fused
// multiply-add (the build has -ffp-contract=off), the scale once at the end.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epx::detail {

/// How a member's contribution is read.
enum class SourceKind : std::uint8_t {
  kF32,         ///< float32 as it is
  kF32ToBF16,   ///< float32, rounded to bf16 and widened back (comm precision bf16, read in place)
  kBF16Bits,    ///< raw bf16 bits, widened (comm precision bf16, as sent)
};

struct ReduceSource {
  const void* data = nullptr;  ///< element 0 of the range being reduced
  SourceKind kind = SourceKind::kF32;
};

/// Elements per block (256 KiB of float32: the accumulator stays in L2). Each member's
/// block of each source is then a run of 64 pages: at 8 KiB blocks the many short runs (8
/// ranks x 8 sources x 8 destinations) made the mapped all_reduce 1.5-2x slower against the
/// copy limit (BENCHMARKS.md, "What we tried": bucket collectives).
inline constexpr std::size_t kReduceBlock = 65536;

/// acc[e] = (v_0[off + e] + v_1[off + e] + ... + v_{n-1}[off + e]) * scale for e < count
/// (count <= kReduceBlock), left to right in float32; the multiply is skipped when
/// scale == 1. n >= 1. `acc` must not alias a source.
void reduce_block(float* acc, const ReduceSource* srcs, int n, std::size_t off, std::size_t count, float scale) noexcept;

/// out[e] = the same sum for e < count, block by block; `out` may be one of the sources
/// (element e is read before it is written). The accumulator is this thread's (kReduceBlock).
void reduce_into(float* out, const ReduceSource* srcs, int n, std::size_t count, float scale) noexcept;

/// This thread's accumulator of kReduceBlock floats (reduce_block's `acc`).
float* reduce_accumulator();

/// dst[e] = bf16(src[e]) (raw bits, round to nearest even): what comm precision bf16 sends.
void pack_bf16(std::uint16_t* dst, const float* src, std::size_t count) noexcept;

/// Bytes one element of a member's contribution takes on the wire.
inline std::size_t wire_bytes(bool bf16) noexcept { return bf16 ? 2 : 4; }

}  // namespace epx::detail
