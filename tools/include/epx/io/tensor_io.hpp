// .npy files as epx tensors, with docs/spec.md §7's dtype conventions: bf16 as '<u2' (raw bits),
// FP8 as '|u1' (raw bits), float32 '<f4', int64 '<i8', bool '|u1'.
#pragma once

#include <filesystem>
#include <string>

#include "epx/tensor.hpp"
#include "epx/io/npy.hpp"

namespace epx::tools {

/// A view of `a` (which must outlive it). '|u1' maps to `byte_dtype` (fp8 data or bool).
/// Throws kIo naming `what` for dtypes or ranks epx does not take.
TensorView view_npy(const NpyArray& a, const std::string& what, DType byte_dtype = DType::kFP8E4M3);

/// Writes `t` to `path` in docs/spec.md §7's encoding.
void write_tensor(const std::filesystem::path& path, const Tensor& t);
/// Writes a 1-D int64 array.
void write_i64(const std::filesystem::path& path, const std::vector<std::int64_t>& v);

}  // namespace epx::tools
