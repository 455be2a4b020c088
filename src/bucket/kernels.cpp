#include "kernels.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "epx/dtype.hpp"

namespace epx::detail {

namespace {

// Inlined into an AVX2 and a portable copy of each kernel, picked at run time (AVX2 where the
// CPU has it: twice the adds per instruction of SSE2, which is all the build may assume; not
// target_clones: its ifunc resolvers run before ThreadSanitizer is up and crash it).
#define EPX_INLINE inline __attribute__((always_inline))

EPX_INLINE float round_bf16(float v) noexcept { return bf16_to_f32(f32_to_bf16(v)); }

EPX_INLINE void init(float* __restrict acc, const ReduceSource& s, std::size_t off, std::size_t n) noexcept {
  switch (s.kind) {
    case SourceKind::kF32:
      std::memcpy(acc, static_cast<const float*>(s.data) + off, n * sizeof(float));
      break;
    case SourceKind::kF32ToBF16: {
      const float* __restrict p = static_cast<const float*>(s.data) + off;
      for (std::size_t e = 0; e < n; ++e) acc[e] = round_bf16(p[e]);
      break;
    }
    case SourceKind::kBF16Bits: {
      const std::uint16_t* __restrict p = static_cast<const std::uint16_t*>(s.data) + off;
      for (std::size_t e = 0; e < n; ++e) acc[e] = bf16_to_f32(p[e]);
      break;
    }
  }
}

EPX_INLINE void add(float* __restrict acc, const ReduceSource& s, std::size_t off, std::size_t n) noexcept {
  switch (s.kind) {
    case SourceKind::kF32: {
      const float* __restrict p = static_cast<const float*>(s.data) + off;
      for (std::size_t e = 0; e < n; ++e) acc[e] = acc[e] + p[e];
      break;
    }
    case SourceKind::kF32ToBF16: {
      const float* __restrict p = static_cast<const float*>(s.data) + off;
      for (std::size_t e = 0; e < n; ++e) acc[e] = acc[e] + round_bf16(p[e]);
      break;
    }
    case SourceKind::kBF16Bits: {
      const std::uint16_t* __restrict p = static_cast<const std::uint16_t*>(s.data) + off;
      for (std::size_t e = 0; e < n; ++e) acc[e] = acc[e] + bf16_to_f32(p[e]);
      break;
    }
  }
}

EPX_INLINE void reduce_block_body(float* acc, const ReduceSource* srcs, int n, std::size_t off, std::size_t count,
                                  float scale) noexcept {
  init(acc, srcs[0], off, count);
  for (int j = 1; j < n; ++j) add(acc, srcs[j], off, count);
  if (scale != 1.0f)
    for (std::size_t e = 0; e < count; ++e) acc[e] = acc[e] * scale;
}

__attribute__((target("avx2"))) void reduce_block_avx2(float* acc, const ReduceSource* srcs, int n, std::size_t off,
                                                       std::size_t count, float scale) noexcept {
  reduce_block_body(acc, srcs, n, off, count, scale);
}

void reduce_block_portable(float* acc, const ReduceSource* srcs, int n, std::size_t off, std::size_t count,
                           float scale) noexcept {
  reduce_block_body(acc, srcs, n, off, count, scale);
}

EPX_INLINE void pack_body(std::uint16_t* __restrict dst, const float* __restrict src, std::size_t count) noexcept {
  for (std::size_t e = 0; e < count; ++e) dst[e] = f32_to_bf16(src[e]);
}

__attribute__((target("avx2"))) void pack_avx2(std::uint16_t* dst, const float* src, std::size_t count) noexcept {
  pack_body(dst, src, count);
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");

}  // namespace

void reduce_block(float* acc, const ReduceSource* srcs, int n, std::size_t off, std::size_t count, float scale) noexcept {
  if (kHasAvx2) return reduce_block_avx2(acc, srcs, n, off, count, scale);
  reduce_block_portable(acc, srcs, n, off, count, scale);
}

float* reduce_accumulator() {
  thread_local std::vector<float> acc(kReduceBlock);
  return acc.data();
}

void reduce_into(float* out, const ReduceSource* srcs, int n, std::size_t count, float scale) noexcept {
  float* acc = reduce_accumulator();
  for (std::size_t off = 0; off < count; off += kReduceBlock) {
    const std::size_t m = std::min(kReduceBlock, count - off);
    reduce_block(acc, srcs, n, off, m, scale);
    std::memcpy(out + off, acc, m * sizeof(float));
  }
}

void pack_bf16(std::uint16_t* dst, const float* src, std::size_t count) noexcept {
  if (kHasAvx2) return pack_avx2(dst, src, count);
  pack_body(dst, src, count);
}

}  // namespace epx::detail
