// epx/dtype.hpp — element types and the exact bf16 / FP8 E4M3 conversions of docs/spec.md §1.
//
// bf16 values are handled as their 16 raw bits (uint16_t), FP8 E4M3 (float8_e4m3fn:
// bias 7, max 448, no infinities, NaN = S.1111.111) as their 8 raw bits (uint8_t).
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace epx {

enum class DType : std::uint8_t {
  kBF16,     ///< 2 bytes, raw bf16 bits
  kFP8E4M3,  ///< 1 byte, raw float8_e4m3fn bits
  kF32,      ///< 4 bytes
  kI32,      ///< 4 bytes
  kI64,      ///< 8 bytes
  kBool,     ///< 1 byte, 0 or 1
};

/// Bytes per element of `t`.
std::size_t dtype_size(DType t) noexcept;
/// Name of `t`, e.g. "bf16", "fp8_e4m3", "float32".
const char* to_string(DType t) noexcept;

/// NumPy's type string of `t` (docs/spec.md §7: bf16 as "<u2" raw bits, FP8 and bool as "|u1",
/// "<f4", "<i4", "<i8"): the .npy header's descr and __array_interface__'s typestr.
const char* numpy_typestr(DType t) noexcept;

/// f32(b): widens a bf16 exactly.
inline float bf16_to_f32(std::uint16_t b) noexcept {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// bf16(f): rounds to nearest, ties to even; NaN stays NaN (quiet, sign kept).
inline std::uint16_t f32_to_bf16(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// Exact value of an E4M3 byte (NaN for 0x7f / 0xff).
float e4m3_to_f32(std::uint8_t q) noexcept;

/// e4m3(f): rounds to nearest, ties to even, saturates at ±448; NaN maps to NaN (0x7f|sign).
std::uint8_t f32_to_e4m3(float f) noexcept;

}  // namespace epx
