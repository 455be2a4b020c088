// tests/unit/fp8_test.cpp — the library's FP8 helpers (epx/fp8.hpp, docs/spec.md §5) against the
// reference's cast_to_fp8 / dequant_fp8, bit for bit, plus their error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "epx/error.hpp"
#include "epx/fp8.hpp"
#include "reference/reference.hpp"

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

/// Random rows with blocks of very different magnitudes, plus hand-made special blocks.
std::vector<float> make_input(std::int64_t rows, int hidden, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  std::vector<float> x(at(rows * hidden));
  const int blocks = hidden / 128;
  for (std::int64_t r = 0; r < rows; ++r)
    for (int b = 0; b < blocks; ++b) {
      const double factor = std::ldexp(1.0, static_cast<int>(rng() % 41) - 20);  // 2^-20 .. 2^20
      for (int i = 0; i < 128; ++i) x[at(r * hidden + b * 128 + i)] = static_cast<float>((uniform() * 2 - 1) * factor);
    }
  auto block = [&](std::int64_t r, int b) { return x.begin() + r * hidden + b * 128; };
  if (rows >= 8 && blocks >= 2) {
    std::fill(block(0, 1), block(0, 1) + 128, 0.0f);  // all-zero block → amax 1e-4
    std::fill(block(1, 0), block(1, 0) + 128, -0.0f);  // all -0.0
    for (int i = 0; i < 128; ++i) block(2, 0)[i] = static_cast<float>(i - 64) * 1e-7f;  // amax < 1e-4
    for (int i = 0; i < 128; ++i) block(3, 1)[i] = static_cast<float>(i) - 100.0f;
    block(3, 1)[5] = 448.0f;  // amax exactly 448: scale 1 in both modes
    for (int i = 0; i < 128; ++i) block(4, 0)[i] = static_cast<float>(i % 7) * 8.0f - 20.0f;
    block(4, 0)[9] = 56.0f;  // amax 56: ue8m0 scale exactly 2^-3
    for (int i = 0; i < 128; ++i) block(5, 0)[i] = static_cast<float>(i % 7) * 8.0f - 20.0f;
    block(5, 0)[9] = std::nextafter(56.0f, 100.0f);  // amax just above 56: ue8m0 scale 2^-2
    for (int i = 0; i < 128; ++i) block(6, 1)[i] = (i % 2 == 0 ? 1.0f : -1.0f) * std::ldexp(1.0f, -140);  // denormals
    block(6, 1)[3] = -0.0f;
    block(7, 0)[0] = 3e30f;  // one huge value among ordinary ones
  }
  return x;
}

void expect_same_cast(const std::vector<float>& x, std::int64_t rows, int hidden, bool ue8m0) {
  std::vector<std::uint8_t> q;
  std::vector<float> scales;
  epx::ref::cast_to_fp8(x, rows, hidden, ue8m0, q, scales);
  const epx::Fp8Tensor lib =
      epx::cast_to_fp8(epx::TensorView(x.data(), epx::DType::kF32, epx::Shape{rows, hidden}), ue8m0);
  ASSERT_EQ(lib.data.dtype(), epx::DType::kFP8E4M3);
  ASSERT_EQ(lib.data.shape(), (epx::Shape{rows, hidden}));
  ASSERT_EQ(lib.scales.dtype(), epx::DType::kF32);
  ASSERT_EQ(lib.scales.shape(), (epx::Shape{rows, hidden / 128}));
  const auto* lq = lib.data.as<std::uint8_t>();
  const auto* ls = lib.scales.as<float>();
  for (std::int64_t i = 0; i < rows * (hidden / 128); ++i)
    ASSERT_EQ(bits(ls[i]), bits(scales[at(i)])) << "scale " << i << " ue8m0 " << ue8m0;
  for (std::int64_t i = 0; i < rows * hidden; ++i)
    ASSERT_EQ(lq[i], q[at(i)]) << "element " << i << " (row " << i / hidden << ") ue8m0 " << ue8m0;

  // Dequantisation of the (identical) result.
  const std::vector<float> ref_deq = epx::ref::dequant_fp8(q, scales, rows, hidden);
  const epx::Tensor deq = epx::dequant_fp8(lib.data.view(), lib.scales.view());
  ASSERT_EQ(deq.dtype(), epx::DType::kF32);
  ASSERT_EQ(deq.shape(), (epx::Shape{rows, hidden}));
  for (std::int64_t i = 0; i < rows * hidden; ++i)
    ASSERT_EQ(bits(deq.as<float>()[i]), bits(ref_deq[at(i)])) << "dequant " << i;
}

// --------------------------------------------------------------------------------------
// The reference itself, on hand-checked blocks.

TEST(Fp8Reference, SpecialBlocks) {
  const std::vector<float> x = make_input(8, 256, 1);
  std::vector<std::uint8_t> q;
  std::vector<float> s;
  epx::ref::cast_to_fp8(x, 8, 256, false, q, s);
  EXPECT_EQ(s[1], 1e-4f / 448.0f);  // all-zero block: amax clamped to 1e-4
  for (int i = 0; i < 128; ++i) EXPECT_EQ(q[at(128 + i)], 0x00);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(q[at(256 + i)], 0x80);  // -0.0 keeps its sign
  EXPECT_EQ(s[2 * 2], 1e-4f / 448.0f);                             // amax 6.4e-6 < 1e-4
  EXPECT_EQ(s[3 * 2 + 1], 1.0f);                                   // amax 448
  EXPECT_EQ(q[at(3 * 256 + 128 + 5)], 0x7e);
  EXPECT_EQ(q[at(3 * 256 + 128 + 100)], 0x00);  // 0 → 0
  EXPECT_EQ(q[at(3 * 256 + 128 + 101)], 0x38);  // 1 → 1.0

  epx::ref::cast_to_fp8(x, 8, 256, true, q, s);
  EXPECT_EQ(s[1], std::ldexp(1.0f, -22));  // 1e-4 / 448 = 2.23e-7 → 2^-22
  EXPECT_EQ(s[3 * 2 + 1], 1.0f);
  EXPECT_EQ(s[4 * 2], 0.125f);  // amax 56 → 56/448 = 2^-3 exactly
  EXPECT_EQ(s[5 * 2], 0.25f);   // amax just above 56 → ceil → 2^-2
  EXPECT_EQ(q[at(4 * 256 + 9)], 0x7e);  // 56 / 0.125 = 448
}

TEST(Fp8Reference, DequantIsQTimesScale) {
  std::vector<std::uint8_t> q(256);
  for (int i = 0; i < 256; ++i) q[at(i)] = static_cast<std::uint8_t>(i % 128);  // same codes in both blocks
  const std::vector<float> scales = {0.5f, 3.0f};
  const std::vector<float> d = epx::ref::dequant_fp8(q, scales, 1, 256);
  EXPECT_EQ(d[0x38], 0.5f);
  EXPECT_EQ(d[128 + 0x38], 3.0f);
  EXPECT_EQ(d[128 + 0x7e], 1344.0f);
  EXPECT_TRUE(std::isnan(d[0x7f]));
}

// --------------------------------------------------------------------------------------
// Library vs reference.

TEST(Fp8, CastMatchesReferenceDefaultScales) {
  const std::vector<float> x = make_input(64, 512, 2024);
  expect_same_cast(x, 64, 512, false);
}

TEST(Fp8, CastMatchesReferenceUe8m0) {
  const std::vector<float> x = make_input(64, 512, 2025);
  expect_same_cast(x, 64, 512, true);
}

TEST(Fp8, CastMatchesReferenceManyShapes) {
  std::uint64_t seed = 99;
  for (std::int64_t rows : {1, 3, 17})
    for (int hidden : {128, 384, 1024})
      for (bool ue8m0 : {false, true}) {
        const std::vector<float> x = make_input(rows, hidden, ++seed);
        expect_same_cast(x, rows, hidden, ue8m0);
      }
}

TEST(Fp8, CastMatchesReferenceAroundPowersOfTwo) {
  // amax / 448 at, just below and just above every power of two the scales can take.
  std::vector<float> x;
  std::int64_t rows = 0;
  for (int e = -22; e <= 20; ++e)
    for (int step : {-1, 0, 1}) {
      float amax = 448.0f * std::ldexp(1.0f, e);
      if (step < 0) amax = std::nextafter(amax, 0.0f);
      if (step > 0) amax = std::nextafter(amax, 1e30f);
      for (int i = 0; i < 128; ++i) x.push_back(amax * static_cast<float>(i - 64) / 64.0f);
      x[at(rows * 128)] = -amax;
      ++rows;
    }
  expect_same_cast(x, rows, 128, false);
  expect_same_cast(x, rows, 128, true);
}

// --------------------------------------------------------------------------------------
// Errors.

TEST(Fp8, CastRejectsWrongDtype) {
  std::vector<std::uint16_t> x(2 * 128, 0);
  try {
    epx::cast_to_fp8(epx::TensorView(x.data(), epx::DType::kBF16, epx::Shape{2, 128}), false);
    FAIL() << "no error";
  } catch (const epx::Error& e) {
    EXPECT_EQ(e.code(), epx::ErrorCode::kDtypeMismatch) << e.what();
  }
}

TEST(Fp8, CastRejectsHiddenNotMultipleOf128) {
  std::vector<float> x(2 * 100, 1.0f);
  EXPECT_THROW(epx::cast_to_fp8(epx::TensorView(x.data(), epx::DType::kF32, epx::Shape{2, 100}), false),
               epx::Error);
  std::vector<float> y(2 * 200, 1.0f);
  EXPECT_THROW(epx::cast_to_fp8(epx::TensorView(y.data(), epx::DType::kF32, epx::Shape{2, 200}), true),
               epx::Error);
}

TEST(Fp8, CastRejectsWrongRank) {
  std::vector<float> x(256, 1.0f);
  EXPECT_THROW(epx::cast_to_fp8(epx::TensorView(x.data(), epx::DType::kF32, epx::Shape{256}), false), epx::Error);
  EXPECT_THROW(epx::cast_to_fp8(epx::TensorView(x.data(), epx::DType::kF32, epx::Shape{1, 2, 128}), false),
               epx::Error);
}

TEST(Fp8, DequantRejectsBadInputs) {
  std::vector<std::uint8_t> q(2 * 256, 0x38);
  std::vector<float> s(2 * 2, 1.0f);
  const epx::TensorView qv(q.data(), epx::DType::kFP8E4M3, epx::Shape{2, 256});
  const epx::TensorView sv(s.data(), epx::DType::kF32, epx::Shape{2, 2});
  EXPECT_NO_THROW(epx::dequant_fp8(qv, sv));
  // q not fp8
  EXPECT_THROW(epx::dequant_fp8(epx::TensorView(q.data(), epx::DType::kBool, epx::Shape{2, 256}), sv), epx::Error);
  // scales not float32
  EXPECT_THROW(epx::dequant_fp8(qv, epx::TensorView(s.data(), epx::DType::kI32, epx::Shape{2, 2})), epx::Error);
  // scales of the wrong shape
  EXPECT_THROW(epx::dequant_fp8(qv, epx::TensorView(s.data(), epx::DType::kF32, epx::Shape{2, 1})), epx::Error);
  EXPECT_THROW(epx::dequant_fp8(qv, epx::TensorView(s.data(), epx::DType::kF32, epx::Shape{1, 2})), epx::Error);
  // H % 128 != 0
  EXPECT_THROW(epx::dequant_fp8(epx::TensorView(q.data(), epx::DType::kFP8E4M3, epx::Shape{2, 200}),
                                epx::TensorView(s.data(), epx::DType::kF32, epx::Shape{2, 2})),
               epx::Error);
}

}  // namespace
