// Two kernels for the same sums: AVX2 (chosen at run time when the CPU has it) and portable
// scalar code. Both add the terms of a column in the same order with separate multiply and
// add (no fused multiply-add: the build uses -ffp-contract=off), so they agree bit for bit;
// tests/unit/reduce_row_test.cpp checks that against the scalar definition on NaNs,
// infinities, signed zeros and ties.
#include "reduce_row.hpp"

#include <vector>

#include "epx/dtype.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define EPX_HAVE_AVX2_KERNEL 1
#endif

namespace epx::detail {
namespace {

}  // namespace

// Term by term over the whole row, the float32 accumulators in a per-thread scratch row.
void reduce_row_portable(std::uint16_t* out, const RowTerms& terms, std::size_t n) {
  thread_local std::vector<float> acc;
  acc.resize(n);
  for (std::size_t c = 0; c < n; ++c) acc[c] = terms.first ? bf16_to_f32(terms.first[c]) : 0.0f;
  for (int j = 0; j < terms.count; ++j) {
    const std::uint16_t* r = terms.rows[j];
    if (terms.weights) {
      const float w = terms.weights[j];
      for (std::size_t c = 0; c < n; ++c) acc[c] += bf16_to_f32(r[c]) * w;
    } else {
      for (std::size_t c = 0; c < n; ++c) acc[c] += bf16_to_f32(r[c]);
    }
  }
  for (std::size_t c = 0; c < n; ++c) out[c] = f32_to_bf16(acc[c]);
}

namespace {

#ifdef EPX_HAVE_AVX2_KERNEL
// 8 bf16 -> 8 floats (exact: the bits move to the high half).
__attribute__((target("avx2"))) inline __m256 load8(const std::uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// 8 floats -> 8 bf16, as f32_to_bf16: round to nearest even, NaN quieted with its sign.
__attribute__((target("avx2"))) inline void store8(std::uint16_t* p, __m256 a) {
  const __m256i u = _mm256_castps_si256(a);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), is_nan);
  // Pack the eight 32-bit values (each < 2^16) to 16 bits: packus works per 128-bit lane,
  // so gather quadwords 0 and 2 afterwards.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// 32 columns at a time, all terms, accumulators in registers.
__attribute__((target("avx2"))) void reduce_row_avx2(std::uint16_t* out, const RowTerms& t, std::size_t n) {
  constexpr std::size_t kBlock = 32;
  const std::size_t full = n - n % kBlock;
  for (std::size_t c = 0; c < full; c += kBlock) {
    __m256 a[4];
    for (int i = 0; i < 4; ++i) a[i] = t.first ? load8(t.first + c + 8 * i) : _mm256_setzero_ps();
    for (int j = 0; j < t.count; ++j) {
      const std::uint16_t* r = t.rows[j] + c;
      if (t.weights) {
        const __m256 w = _mm256_set1_ps(t.weights[j]);
        for (int i = 0; i < 4; ++i) a[i] = _mm256_add_ps(a[i], _mm256_mul_ps(load8(r + 8 * i), w));
      } else {
        for (int i = 0; i < 4; ++i) a[i] = _mm256_add_ps(a[i], load8(r + 8 * i));
      }
    }
    for (int i = 0; i < 4; ++i) store8(out + c + 8 * i, a[i]);
  }
  for (std::size_t c = full; c < n; ++c) {  // the tail, column by column in the same order
    float acc = t.first ? bf16_to_f32(t.first[c]) : 0.0f;
    for (int j = 0; j < t.count; ++j)
      acc += t.weights ? bf16_to_f32(t.rows[j][c]) * t.weights[j] : bf16_to_f32(t.rows[j][c]);
    out[c] = f32_to_bf16(acc);
  }
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");
#endif

}  // namespace

void reduce_row(std::uint16_t* out, const RowTerms& terms, std::size_t n) {
#ifdef EPX_HAVE_AVX2_KERNEL
  if (kHasAvx2) return reduce_row_avx2(out, terms, n);
#endif
  reduce_row_portable(out, terms, n);
}

}  // namespace epx::detail
