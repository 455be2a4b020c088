// reduce_row (Highway SIMD: AVX2 / AVX-512 on x86, NEON on aarch64 — CI runs this file under
// qemu too) and reduce_row_portable against docs/spec.md §4's sums written out column by column here
// (the flat sum and the expanded layout's grouped one, partials rounded to bf16), on values chosen to catch a wrong order, a fused multiply-add,
// a wrong rounding or a lost NaN: NaNs, infinities, signed zeros, rounding ties, subnormals
// and random bits. Every result is bit for bit, except that a NaN result only has to be a
// NaN: IEEE 754 leaves the sign and payload of a NaN sum open, and compilers may swap
// the operands of an addition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "epx/dtype.hpp"
#include "reduce_row.hpp"
#ifndef HWY_COMPILE_ONLY_STATIC
#include "hwy/targets.h"
#endif

namespace {

using epx::bf16_to_f32;
using epx::f32_to_bf16;
using epx::detail::RowTerms;

std::vector<std::uint16_t> expected(const RowTerms& t, std::size_t n) {
  std::vector<std::uint16_t> out(n);
  for (std::size_t c = 0; c < n; ++c) {
    float acc = t.first ? bf16_to_f32(t.first[c]) : 0.0f;
    for (int j = 0; j < t.count; ++j) {
      float v = bf16_to_f32(t.rows[j][c]);
      if (t.weights) {
        volatile float product = v * t.weights[j];  // rounded to float32 before the add
        v = product;
      }
      acc += v;
    }
    out[c] = f32_to_bf16(acc);
  }
  return out;
}

// Runs `check` once per SIMD target the CPU has and the build compiled (x86: AVX-512, AVX2,
// SSE4, ... each chosen in turn), then restores the normal choice; once where the build has
// a single static target (the aarch64 cross build: NEON).
template <class Check>
void on_every_target(Check check) {
#ifndef HWY_COMPILE_ONLY_STATIC
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(epx::detail::reduce_row_target());
    check();
  }
  hwy::SetSupportedTargetsForTest(0);
#else
  check();
#endif
}

bool is_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

// Random bf16 bits, with a good share of special values.
std::uint16_t pick(std::mt19937& rng) {
  static const std::uint16_t special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x0001, 0x8001,
                                          0x3f80, 0xbf80, 0x7f7f, 0xff7f, 0x4b80, 0x3b80, 0x3380};
  const std::uint32_t r = rng();
  if (r % 4 == 0) return special[(r >> 8) % (sizeof special / sizeof special[0])];
  if (r % 4 == 1) return static_cast<std::uint16_t>(0x3f00 + ((r >> 8) & 0x1ff));  // near 1: many ties
  return static_cast<std::uint16_t>(r >> 16);
}

void BothKernelsMatchTheSpecSumBitForBit() {
  std::printf("reduce_row runs on %s\n", epx::detail::reduce_row_target());  // CI's log: which SIMD target was checked
  std::mt19937 rng(7);
  for (std::size_t n : {1u, 7u, 31u, 32u, 33u, 100u, 7168u}) {
    for (int count : {0, 1, 2, 5, 10}) {
      for (bool with_first : {false, true}) {
        for (bool weighted : {false, true}) {
          std::vector<std::vector<std::uint16_t>> rows(static_cast<std::size_t>(count), std::vector<std::uint16_t>(n));
          std::vector<const std::uint16_t*> ptrs;
          for (auto& r : rows) {
            for (auto& v : r) v = pick(rng);
            ptrs.push_back(r.data());
          }
          std::vector<std::uint16_t> first(n);
          for (auto& v : first) v = pick(rng);
          std::vector<float> weights;
          for (int j = 0; j < count; ++j) weights.push_back(bf16_to_f32(pick(rng)) * 0.37f);
          const RowTerms t{with_first ? first.data() : nullptr, ptrs.data(), weighted ? weights.data() : nullptr, count};
          const std::vector<std::uint16_t> want = expected(t, n);
          std::vector<std::uint16_t> fast(n, 0xdead), portable(n, 0xbeef);
          epx::detail::reduce_row(fast.data(), t, n);
          epx::detail::reduce_row_portable(portable.data(), t, n);
          for (std::size_t c = 0; c < n; ++c) {
            if (is_nan(want[c])) {  // IEEE leaves a NaN sum's sign and payload to the hardware
              ASSERT_TRUE(is_nan(fast[c]) && is_nan(portable[c])) << "n=" << n << " count=" << count << " column " << c;
              continue;
            }
            ASSERT_EQ(fast[c], want[c]) << "reduce_row: n=" << n << " count=" << count << " first=" << with_first
                                        << " weighted=" << weighted << " column " << c;
            ASSERT_EQ(portable[c], want[c]) << "reduce_row_portable: n=" << n << " count=" << count
                                            << " first=" << with_first << " weighted=" << weighted << " column " << c;
          }
        }
      }
    }
  }
}

// A sum whose result depends on the order: (2^30 - 2^30) + 1 = 1 but (2^30 + 1) - 2^30 = 0 in
// float32, so a kernel that reorders or pairs up terms fails here.
void AddsTermsInTheGivenOrder() {
  const std::size_t n = 200;  // SIMD blocks (32 columns with AVX2, 64 with AVX-512) and a tail
  std::vector<std::uint16_t> big(n, 0x4e80), minus_big(n, 0xce80), one(n, 0x3f80);
  const std::uint16_t* cancel_first[] = {big.data(), minus_big.data(), one.data()};
  const std::uint16_t* one_first[] = {big.data(), one.data(), minus_big.data()};
  std::vector<std::uint16_t> a(n), b(n);
  epx::detail::reduce_row(a.data(), RowTerms{nullptr, cancel_first, nullptr, 3}, n);
  epx::detail::reduce_row(b.data(), RowTerms{nullptr, one_first, nullptr, 3}, n);
  for (std::size_t c = 0; c < n; ++c) {
    EXPECT_EQ(a[c], 0x3f80) << c;
    EXPECT_EQ(b[c], 0x0000) << c;
  }
}

// docs/spec.md §4, expanded layout at the source: f32(first) + the lead rows, then per group the
// bf16-rounded partial (from 0.0f, weighted when asked), a lone unweighted row as itself.
std::vector<std::uint16_t> expected_grouped(const RowTerms& t, std::size_t n) {
  std::vector<std::uint16_t> out(n);
  for (std::size_t c = 0; c < n; ++c) {
    float acc = t.first ? bf16_to_f32(t.first[c]) : 0.0f;
    for (int j = 0; j < t.lead; ++j) acc += bf16_to_f32(t.rows[j][c]);
    int b = t.lead;
    for (int g = 0; g < t.groups; ++g) {
      const int e = t.group_end[g];
      if (e - b == 1 && t.weights == nullptr) {
        acc += bf16_to_f32(t.rows[b][c]);
      } else {
        float p = 0.0f;
        for (int j = b; j < e; ++j) {
          volatile float v = t.weights ? bf16_to_f32(t.rows[j][c]) * t.weights[j] : bf16_to_f32(t.rows[j][c]);
          p += v;
        }
        acc += bf16_to_f32(f32_to_bf16(p));
      }
      b = e;
    }
    out[c] = f32_to_bf16(acc);
  }
  return out;
}

void GroupedSumsRoundEachPartialLikeTheExpertRank() {
  std::mt19937 rng(11);
  // Group sizes per case: lone rows (pass through unless weighted), pairs, a group of 8.
  const std::vector<std::vector<int>> shapes = {{1}, {2}, {1, 1, 1}, {3, 1, 2}, {8}, {1, 2, 1, 4}};
  for (std::size_t n : {1u, 33u, 100u, 7168u}) {
    for (const auto& sizes : shapes) {
      for (int lead : {0, 1, 2}) {
        for (bool weighted : {false, true}) {
          std::vector<std::int32_t> ends;
          int count = lead;
          for (int sz : sizes) ends.push_back(count += sz);
          std::vector<std::vector<std::uint16_t>> rows(static_cast<std::size_t>(count), std::vector<std::uint16_t>(n));
          std::vector<const std::uint16_t*> ptrs;
          for (auto& r : rows) {
            for (auto& v : r) v = pick(rng);
            ptrs.push_back(r.data());
          }
          std::vector<std::uint16_t> first(n);
          for (auto& v : first) v = pick(rng);
          std::vector<float> weights;
          for (int j = 0; j < count; ++j) weights.push_back(bf16_to_f32(pick(rng)) * 0.37f);
          RowTerms t{first.data(), ptrs.data(), weighted ? weights.data() : nullptr, count};
          t.group_end = ends.data();
          t.groups = static_cast<int>(ends.size());
          t.lead = lead;
          const std::vector<std::uint16_t> want = expected_grouped(t, n);
          std::vector<std::uint16_t> fast(n, 0xdead), portable(n, 0xbeef);
          epx::detail::reduce_row(fast.data(), t, n);
          epx::detail::reduce_row_portable(portable.data(), t, n);
          for (std::size_t c = 0; c < n; ++c) {
            if (is_nan(want[c])) {
              ASSERT_TRUE(is_nan(fast[c]) && is_nan(portable[c])) << "n=" << n << " column " << c;
              continue;
            }
            ASSERT_EQ(fast[c], want[c]) << "reduce_row (" << epx::detail::reduce_row_target() << "): n=" << n
                                        << " groups=" << t.groups << " lead=" << lead << " weighted=" << weighted
                                        << " column " << c;
            ASSERT_EQ(portable[c], want[c]) << "reduce_row_portable: n=" << n << " groups=" << t.groups << " lead=" << lead
                                            << " weighted=" << weighted << " column " << c;
          }
        }
      }
    }
  }
}

// RowTerms::stream: the same bits with streaming stores, into a vector-aligned row (streamed)
// and one two bytes off (written plainly: streaming needs alignment), tails included.
void StreamingStoresWriteTheSameBits() {
  std::mt19937 rng(5);
  for (std::size_t n : {64u, 100u, 7168u}) {
    std::vector<std::vector<std::uint16_t>> rows(5, std::vector<std::uint16_t>(n));
    std::vector<const std::uint16_t*> ptrs;
    for (auto& r : rows) {
      for (auto& v : r) v = pick(rng);
      ptrs.push_back(r.data());
    }
    const std::int32_t ends[] = {2, 3, 5};
    RowTerms t{nullptr, ptrs.data(), nullptr, 5};
    t.group_end = ends;
    t.groups = 3;
    std::vector<std::uint16_t> plain(n);
    epx::detail::reduce_row(plain.data(), t, n);
    t.stream = true;
    alignas(64) static std::uint16_t out[7168 + 64];
    for (std::size_t skew : {0u, 1u}) {
      std::fill(out, out + n + skew, 0xdead);
      epx::detail::reduce_row(out + skew, t, n);
      for (std::size_t c = 0; c < n; ++c)
        if (!(is_nan(plain[c]) && is_nan(out[skew + c]))) {
          ASSERT_EQ(out[skew + c], plain[c]) << "n=" << n << " skew=" << skew << " column " << c;
        }
    }
  }
}

TEST(ReduceRow, BothKernelsMatchTheSpecSumBitForBit) { on_every_target(BothKernelsMatchTheSpecSumBitForBit); }
TEST(ReduceRow, AddsTermsInTheGivenOrder) { on_every_target(AddsTermsInTheGivenOrder); }
TEST(ReduceRow, GroupedSumsRoundEachPartialLikeTheExpertRank) { on_every_target(GroupedSumsRoundEachPartialLikeTheExpertRank); }
TEST(ReduceRow, StreamingStoresWriteTheSameBits) { on_every_target(StreamingStoresWriteTheSameBits); }

}  // namespace
