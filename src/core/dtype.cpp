#include "epx/dtype.hpp"

#include <array>
#include <cmath>

namespace epx {

std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kBF16: return 2;
    case DType::kFP8E4M3: return 1;
    case DType::kF32: return 4;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

const char* to_string(DType t) noexcept {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kF32: return "float32";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

namespace {

float decode_e4m3(std::uint8_t q) {
  const bool neg = (q & 0x80u) != 0;
  const int exp = (q >> 3) & 0xf;
  const int man = q & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) return neg ? -NAN : NAN;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    v = std::ldexp(static_cast<float>(8 + man), exp - 7 - 3);
  }
  return neg ? -v : v;
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = decode_e4m3(static_cast<std::uint8_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

float e4m3_to_f32(std::uint8_t q) noexcept { return e4m3_table()[q]; }

std::uint8_t f32_to_e4m3(float f) noexcept {
  const std::uint8_t sign = std::signbit(f) ? 0x80u : 0x00u;
  if (std::isnan(f)) return sign | 0x7fu;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 448.0) return sign | 0x7eu;  // saturate (also +-inf)
  if (a < std::ldexp(1.0, -6)) {
    // Subnormal range: units of 2^-9; 8 units is the smallest normal (code 0x08).
    const double units = std::nearbyint(a * 512.0);  // default rounding mode: ties to even
    return sign | static_cast<std::uint8_t>(units);
  }
  int e;
  (void)std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  e -= 1;                   // a = 1.xxx * 2^e, e in [-6, 8]
  double man = std::nearbyint(std::ldexp(a, -e) * 8.0) - 8.0;  // 0..8
  if (man >= 8.0) {
    man = 0.0;
    e += 1;
  }
  const int biased = e + 7;
  if (biased > 15 || (biased == 15 && man >= 7.0)) return sign | 0x7eu;
  return sign | static_cast<std::uint8_t>((biased << 3) | static_cast<int>(man));
}

const char* numpy_typestr(DType t) noexcept {
  switch (t) {
    case DType::kBF16: return "<u2";
    case DType::kFP8E4M3: return "|u1";
    case DType::kF32: return "<f4";
    case DType::kI32: return "<i4";
    case DType::kI64: return "<i8";
    case DType::kBool: return "|u1";
  }
  return "|u1";
}

}  // namespace epx
