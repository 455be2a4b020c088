#include "epx/fp8.hpp"

#include <algorithm>
#include <cmath>

#include "epx/error.hpp"

namespace epx {

namespace {

void check_fp8_shapes(const TensorView& x, const char* what) {
  if (x.shape.ndim != 2)
    throw Error(ErrorCode::kShapeMismatch,
                std::string(what) + ": expected a 2-D [S, H] tensor, got shape " + x.shape.str());
  if (x.shape[1] % kFp8BlockCols != 0)
    throw Error(ErrorCode::kShapeMismatch, std::string(what) + ": H = " + std::to_string(x.shape[1]) +
                                               " is not a multiple of 128");
}

// 2^ceil(log2(v)) for v > 0, exact (frexp instead of log2f, which may round).
float pow2_ceil(float v) {
  int e;
  const float m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}

}  // namespace

Fp8Tensor cast_to_fp8(const TensorView& x, bool ue8m0) {
  if (x.dtype != DType::kF32)
    throw Error(ErrorCode::kDtypeMismatch,
                std::string("cast_to_fp8: x must be float32, got ") + to_string(x.dtype));
  check_fp8_shapes(x, "cast_to_fp8");
  const std::int64_t rows = x.shape[0], cols = x.shape[1], blocks = cols / kFp8BlockCols;
  Fp8Tensor out{Tensor(DType::kFP8E4M3, {rows, cols}), Tensor(DType::kF32, {rows, blocks})};
  const float* in = x.as<float>();
  auto* q = out.data.as<std::uint8_t>();
  auto* sc = out.scales.as<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* blk = in + r * cols + b * kFp8BlockCols;
      std::uint8_t* qb = q + r * cols + b * kFp8BlockCols;
      float amax = 0.0f;
      for (int i = 0; i < kFp8BlockCols; ++i) amax = std::max(amax, std::fabs(blk[i]));
      amax = std::max(amax, 1e-4f);
      if (ue8m0) {
        const float scale = pow2_ceil(amax / 448.0f);
        for (int i = 0; i < kFp8BlockCols; ++i) qb[i] = f32_to_e4m3(blk[i] / scale);
        sc[r * blocks + b] = scale;
      } else {
        const float inv = 448.0f / amax;
        for (int i = 0; i < kFp8BlockCols; ++i) qb[i] = f32_to_e4m3(blk[i] * inv);
        sc[r * blocks + b] = amax / 448.0f;
      }
    }
  }
  return out;
}

Tensor dequant_fp8(const TensorView& q, const TensorView& scales) {
  if (q.dtype != DType::kFP8E4M3 || scales.dtype != DType::kF32)
    throw Error(ErrorCode::kDtypeMismatch, "dequant_fp8: expected fp8_e4m3 data and float32 scales");
  check_fp8_shapes(q, "dequant_fp8");
  const std::int64_t rows = q.shape[0], cols = q.shape[1], blocks = cols / kFp8BlockCols;
  if (!(scales.shape == Shape{rows, blocks}))
    throw Error(ErrorCode::kShapeMismatch, "dequant_fp8: scales must be " + Shape{rows, blocks}.str() +
                                               ", got " + scales.shape.str());
  Tensor out(DType::kF32, {rows, cols});
  const auto* qd = q.as<std::uint8_t>();
  const float* sc = scales.as<float>();
  float* o = out.as<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      o[r * cols + c] = e4m3_to_f32(qd[r * cols + c]) * sc[r * blocks + c / kFp8BlockCols];
  return out;
}

}  // namespace epx
