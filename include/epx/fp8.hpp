// epx/fp8.hpp — the FP8 helpers of docs/spec.md §5 (DeepEP's per_token_cast_to_fp8 and its inverse).
//
// Local (not collective), thread-safe, allocate their outputs.
#pragma once

#include "epx/tensor.hpp"

namespace epx {

inline constexpr int kFp8BlockCols = 128;  ///< one float32 scale per 128 consecutive columns

struct Fp8Tensor {
  Tensor data;    ///< [S, H] fp8_e4m3
  Tensor scales;  ///< [S, H/128] float32
};

/// Quantises `x` ([S, H] float32, H % 128 == 0) per row and 128-column block:
/// amax = max(|x|) clamped below at 1e-4, q = e4m3(x * (448 / amax)), scale = amax / 448.
/// With `ue8m0` the scale is 2^ceil(log2(amax / 448)) and q = e4m3(x / scale).
/// Throws kDtypeMismatch / kShapeMismatch on a bad input.
Fp8Tensor cast_to_fp8(const TensorView& x, bool ue8m0 = false);

/// dequant(q, scale) = f32(q) * scale: `q` [S, H] fp8_e4m3, `scales` [S, H/128] float32
/// → [S, H] float32.
Tensor dequant_fp8(const TensorView& q, const TensorView& scales);

}  // namespace epx
