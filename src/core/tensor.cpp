#include "epx/tensor.hpp"

#include <cstring>

#include "epx/error.hpp"

namespace epx {

Shape::Shape(std::initializer_list<std::int64_t> d) {
  if (d.size() > kMaxDims) throw Error(ErrorCode::kInternal, "Shape: more than 3 dims");
  for (std::int64_t v : d) dims[static_cast<std::size_t>(ndim++)] = v;
}

std::int64_t Shape::numel() const noexcept {
  if (ndim == 0) return 0;
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[static_cast<std::size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const noexcept {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[static_cast<std::size_t>(i)] != o.dims[static_cast<std::size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(shape) {
  const std::size_t n = nbytes();
  bytes_ = std::shared_ptr<std::byte>(new std::byte[n > 0 ? n : 1], std::default_delete<std::byte[]>());
}

Tensor Tensor::adopt(std::shared_ptr<std::byte> storage, DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.bytes_ = std::move(storage);
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t(dtype, shape);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

}  // namespace epx
