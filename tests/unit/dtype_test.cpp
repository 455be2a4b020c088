// tests/unit/dtype_test.cpp — the library's bf16 / FP8 E4M3 conversions (epx/dtype.hpp)
// against the reference's own, independently written ones (tests/reference), and the
// reference's against hand-known values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "epx/dtype.hpp"
#include "reference/reference.hpp"

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// --------------------------------------------------------------------------------------
// bf16

TEST(DtypeReference, Bf16KnownValues) {
  EXPECT_EQ(bits(epx::ref::bf16_to_f32(0x3f80)), bits(1.0f));
  EXPECT_EQ(bits(epx::ref::bf16_to_f32(0xc000)), bits(-2.0f));
  EXPECT_EQ(bits(epx::ref::bf16_to_f32(0x0000)), bits(0.0f));
  EXPECT_EQ(bits(epx::ref::bf16_to_f32(0x8000)), bits(-0.0f));
  EXPECT_EQ(epx::ref::bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(epx::ref::bf16_to_f32(0x7f7f), std::ldexp(255.0f, 120));
  EXPECT_EQ(epx::ref::bf16_to_f32(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(epx::ref::bf16_to_f32(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits(epx::ref::bf16_to_f32(0x7fc1)), 0x7fc10000u);

  struct Case {
    std::uint32_t in;
    std::uint16_t out;
  };
  const Case cases[] = {
      {0x00000000u, 0x0000}, {0x80000000u, 0x8000},                         // ±0
      {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82},  // ties to even
      {0x3f808001u, 0x3f81}, {0x3f807fffu, 0x3f80}, {0xbf818000u, 0xbf82},
      {0x7f7fffffu, 0x7f80}, {0x7f7f7fffu, 0x7f7f}, {0x7f7f8000u, 0x7f80},  // overflow → inf
      {0xff7f8000u, 0xff80}, {0x7f7effffu, 0x7f7f},
      {0x00000001u, 0x0000}, {0x00008000u, 0x0000}, {0x00018000u, 0x0002},  // float denormals
      {0x00008001u, 0x0001}, {0x007fffffu, 0x0080}, {0x807fffffu, 0x8080},
      {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},                         // inf
      {0x7fc00000u, 0x7fc0}, {0x7f800001u, 0x7fc0}, {0xff800001u, 0xffc0},  // NaN: quiet, sign kept
      {0x7fff0000u, 0x7fff}, {0x7fa00000u, 0x7fe0}, {0xffffffffu, 0xffff},
  };
  for (const Case& c : cases) EXPECT_EQ(epx::ref::f32_to_bf16(from_bits(c.in)), c.out) << std::hex << c.in;
}

TEST(Dtype, Bf16ToF32AllCodes) {
  for (std::uint32_t c = 0; c <= 0xffff; ++c) {
    const auto b = static_cast<std::uint16_t>(c);
    ASSERT_EQ(bits(epx::bf16_to_f32(b)), bits(epx::ref::bf16_to_f32(b))) << std::hex << c;
  }
}

TEST(Dtype, F32ToBf16EdgeCases) {
  const std::uint32_t edges[] = {
      0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf818000u,
      0x7f7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0xff7f8000u, 0x7f7effffu, 0x00000001u, 0x00008000u, 0x00018000u,
      0x00008001u, 0x007fffffu, 0x807fffffu, 0x00800000u, 0x007f8000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
      0x7f800001u, 0xff800001u, 0x7fff0000u, 0x7fa00000u, 0xffffffffu, 0x7fbfffffu, 0x7f808000u, 0x4b800000u,
  };
  for (std::uint32_t u : edges)
    EXPECT_EQ(epx::f32_to_bf16(from_bits(u)), epx::ref::f32_to_bf16(from_bits(u))) << std::hex << u;
  // Every tie and its neighbours for a sweep of exponents.
  for (std::uint32_t e = 0; e < 256; ++e)
    for (std::uint32_t m : {0x00008000u, 0x00018000u, 0x00007fffu, 0x00008001u, 0x0000ffffu, 0x007f8000u}) {
      for (std::uint32_t s : {0u, 0x80000000u}) {
        const std::uint32_t u = s | (e << 23) | m;
        ASSERT_EQ(epx::f32_to_bf16(from_bits(u)), epx::ref::f32_to_bf16(from_bits(u))) << std::hex << u;
      }
    }
}

TEST(Dtype, F32ToBf16RandomBitPatterns) {
  std::mt19937_64 rng(12345);
  for (int i = 0; i < (1 << 20); ++i) {
    const auto u = static_cast<std::uint32_t>(rng());
    ASSERT_EQ(epx::f32_to_bf16(from_bits(u)), epx::ref::f32_to_bf16(from_bits(u))) << std::hex << u;
  }
}

TEST(Dtype, Bf16RoundTrip) {
  for (std::uint32_t c = 0; c <= 0xffff; ++c) {
    const auto b = static_cast<std::uint16_t>(c);
    const float f = epx::ref::bf16_to_f32(b);
    const std::uint16_t expected = std::isnan(f) ? static_cast<std::uint16_t>(b | 0x40) : b;
    ASSERT_EQ(epx::ref::f32_to_bf16(f), expected) << std::hex << c;
    ASSERT_EQ(epx::f32_to_bf16(epx::bf16_to_f32(b)), expected) << std::hex << c;
  }
}

// --------------------------------------------------------------------------------------
// FP8 E4M3

TEST(DtypeReference, E4m3KnownValues) {
  EXPECT_EQ(bits(epx::ref::e4m3_to_f32(0x00)), bits(0.0f));
  EXPECT_EQ(bits(epx::ref::e4m3_to_f32(0x80)), bits(-0.0f));
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(epx::ref::e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x3f), 1.875f);
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x77), 240.0f);
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x78), 256.0f);
  EXPECT_EQ(epx::ref::e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(epx::ref::e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(epx::ref::e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(epx::ref::e4m3_to_f32(0xff)));

  struct Case {
    float in;
    std::uint8_t out;
  };
  const float tiny = std::ldexp(1.0f, -10);  // half the smallest subnormal
  const Case cases[] = {
      {0.0f, 0x00}, {-0.0f, 0x80}, {1.0f, 0x38}, {-1.0f, 0xb8}, {448.0f, 0x7e}, {-448.0f, 0xfe},
      {1.0625f, 0x38},                                 // tie between 1 and 1.125 → even (1)
      {1.1875f, 0x3a},                                 // tie between 1.125 and 1.25 → even (1.25)
      {1.0625001f, 0x39},                              // just above the tie
      {tiny, 0x00},    {-tiny, 0x80},                  // tie between 0 and 2^-9 → 0
      {3 * tiny, 0x02}, {5 * tiny, 0x02}, {7 * tiny, 0x04},
      {15 * tiny, 0x08},                               // tie 7*2^-9 / 2^-6 → 0x08
      {1e-45f, 0x00},  {-1e-45f, 0x80},                // float denormals
      {449.0f, 0x7e},  {464.0f, 0x7e},  {479.0f, 0x7e}, {480.0f, 0x7e}, {1e6f, 0x7e},  // saturate
      {-500.0f, 0xfe}, {std::numeric_limits<float>::max(), 0x7e},
      {std::numeric_limits<float>::infinity(), 0x7e}, {-std::numeric_limits<float>::infinity(), 0xfe},
      {std::numeric_limits<float>::quiet_NaN(), 0x7f}, {-std::numeric_limits<float>::quiet_NaN(), 0xff},
  };
  for (const Case& c : cases) EXPECT_EQ(epx::ref::f32_to_e4m3(c.in), c.out) << c.in;
}

TEST(Dtype, E4m3ToF32AllCodes) {
  for (int c = 0; c < 256; ++c) {
    const auto q = static_cast<std::uint8_t>(c);
    const float lib = epx::e4m3_to_f32(q), ref = epx::ref::e4m3_to_f32(q);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(lib)) << c;
    } else {
      EXPECT_EQ(bits(lib), bits(ref)) << c;
    }
  }
}

TEST(Dtype, F32ToE4m3RoundTripAllCodes) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    const auto q = static_cast<std::uint8_t>(c);
    EXPECT_EQ(epx::ref::f32_to_e4m3(epx::ref::e4m3_to_f32(q)), q) << c;
    EXPECT_EQ(epx::f32_to_e4m3(epx::ref::e4m3_to_f32(q)), q) << c;
  }
}

TEST(Dtype, F32ToE4m3Midpoints) {
  // Every midpoint between adjacent finite codes (exact in float32) goes to the even code;
  // one float step either side goes to the nearer one.
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = epx::ref::e4m3_to_f32(static_cast<std::uint8_t>(c));
    const float hi = epx::ref::e4m3_to_f32(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2.0f;
    const std::uint8_t even = static_cast<std::uint8_t>(c % 2 == 0 ? c : c + 1);
    for (float sign : {1.0f, -1.0f}) {
      const std::uint8_t s = sign < 0 ? 0x80 : 0x00;
      const float m = sign * mid;
      const float below = sign * std::nextafter(mid, 0.0f);
      const float above = sign * std::nextafter(mid, 1000.0f);
      EXPECT_EQ(epx::ref::f32_to_e4m3(m), even | s) << m;
      EXPECT_EQ(epx::ref::f32_to_e4m3(below), c | s) << below;
      EXPECT_EQ(epx::ref::f32_to_e4m3(above), (c + 1) | s) << above;
      EXPECT_EQ(epx::f32_to_e4m3(m), epx::ref::f32_to_e4m3(m)) << m;
      EXPECT_EQ(epx::f32_to_e4m3(below), epx::ref::f32_to_e4m3(below)) << below;
      EXPECT_EQ(epx::f32_to_e4m3(above), epx::ref::f32_to_e4m3(above)) << above;
    }
  }
}

TEST(Dtype, F32ToE4m3EdgeCases) {
  const float tiny = std::ldexp(1.0f, -10);
  const float inf = std::numeric_limits<float>::infinity();
  const float edges[] = {0.0f,    -0.0f,   tiny,    -tiny,   3 * tiny, 5 * tiny, 7 * tiny, 15 * tiny, 1e-45f,
                         -1e-45f, 1e-38f,  448.0f,  -448.0f, 449.0f,   463.99f,  464.0f,   464.01f,   479.0f,
                         480.0f,  -480.0f, 500.0f,  1e6f,    -1e6f,    3e38f,    inf,      -inf,      1.0625f,
                         1.1875f, 0.0f};
  for (float f : edges) EXPECT_EQ(epx::f32_to_e4m3(f), epx::ref::f32_to_e4m3(f)) << f;
  // Saturation and NaN, explicitly.
  EXPECT_EQ(epx::f32_to_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(epx::f32_to_e4m3(-1000.0f), 0xfe);
  EXPECT_EQ(epx::f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(epx::f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
  EXPECT_EQ(epx::f32_to_e4m3(from_bits(0x7f800001u)), 0x7f);  // signalling NaN
  EXPECT_EQ(epx::f32_to_e4m3(-0.0f), 0x80);
}

TEST(Dtype, F32ToE4m3RandomInRange) {
  std::mt19937_64 rng(777);
  for (int i = 0; i < 1000000; ++i) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
    const float f = static_cast<float>(u * 1200.0 - 600.0);
    ASSERT_EQ(epx::f32_to_e4m3(f), epx::ref::f32_to_e4m3(f)) << f;
  }
  // Small magnitudes (subnormal and low normal codes): [-1/32, 1/32).
  for (int i = 0; i < 200000; ++i) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const float f = static_cast<float>((u * 2.0 - 1.0) / 32.0);
    ASSERT_EQ(epx::f32_to_e4m3(f), epx::ref::f32_to_e4m3(f)) << f;
  }
}

TEST(Dtype, F32ToE4m3RandomBitPatterns) {
  std::mt19937_64 rng(4242);
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(static_cast<std::uint32_t>(rng()));
    ASSERT_EQ(epx::f32_to_e4m3(f), epx::ref::f32_to_e4m3(f)) << std::hex << bits(f);
  }
}

}  // namespace
