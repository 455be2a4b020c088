#include "epx/io/tensor_io.hpp"

#include "epx/error.hpp"

namespace epx::tools {

TensorView view_npy(const NpyArray& a, const std::string& what, DType byte_dtype) {
  DType t;
  if (a.descr == "<u2")
    t = DType::kBF16;
  else if (a.descr == "|u1")
    t = byte_dtype;
  else if (a.descr == "<f4")
    t = DType::kF32;
  else if (a.descr == "<i8")
    t = DType::kI64;
  else if (a.descr == "<i4")
    t = DType::kI32;
  else if (a.descr == "|b1")
    t = DType::kBool;
  else
    throw Error(ErrorCode::kDtypeMismatch, what + ": dtype '" + a.descr +
                                               "' is not one epx reads (bf16 '<u2', fp8 '|u1', '<f4', '<i8')");
  if (a.shape.size() > static_cast<std::size_t>(kMaxDims) || a.shape.empty())
    throw Error(ErrorCode::kShapeMismatch, what + ": expected a 1-, 2- or 3-D array, got " +
                                               std::to_string(a.shape.size()) + " dimensions");
  Shape s;
  for (std::int64_t d : a.shape) s.dims[static_cast<std::size_t>(s.ndim++)] = d;
  return TensorView(a.data.data(), t, s);
}

void write_tensor(const std::filesystem::path& path, const Tensor& t) {
  std::vector<std::int64_t> shape(t.shape().dims.begin(), t.shape().dims.begin() + t.shape().ndim);
  write_npy(path, numpy_typestr(t.dtype()), shape, t.data(), t.nbytes());
}

void write_i64(const std::filesystem::path& path, const std::vector<std::int64_t>& v) {
  write_npy(path, "<i8", {static_cast<std::int64_t>(v.size())}, v.data(), v.size() * sizeof(std::int64_t));
}

}  // namespace epx::tools
