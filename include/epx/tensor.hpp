// epx/tensor.hpp — tensors as epx sees them: a dtype, a shape (up to 3 dims, C order)
// and bytes.
//
// `TensorView` is non-owning and read-only: the caller keeps the memory alive for the
// duration of the call it is passed to. `Tensor` owns its bytes (returned by epx calls).
// An empty view (`data == nullptr`, no dims) means "not given" for optional inputs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "epx/dtype.hpp"

namespace epx {

inline constexpr int kMaxDims = 3;

/// Shape of a tensor, C order. `ndim == 0` with `dims` unused means a scalar / absent.
struct Shape {
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> dims{};

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d);
  std::int64_t numel() const noexcept;
  std::int64_t operator[](int i) const noexcept { return dims[static_cast<std::size_t>(i)]; }
  bool operator==(const Shape& o) const noexcept;
  /// "[4, 7168]"
  std::string str() const;
};

/// Non-owning, read-only view of a C-order tensor.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  Shape shape;

  TensorView() = default;
  TensorView(const void* d, DType t, Shape s) : data(d), dtype(t), shape(s) {}
  bool empty() const noexcept { return data == nullptr && shape.ndim == 0; }
  template <class T>
  const T* as() const noexcept { return static_cast<const T*>(data); }
};

/// Owning C-order tensor. Move-only; bytes are uninitialised unless made with `zeros`.
/// The bytes may come from a pool (epx's outputs do: a heap pool, or a Buffer's output
/// pool in its shared window): they return to it when the last tensor sharing them is
/// destroyed, so steady-state calls do not page-fault fresh memory.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  static Tensor zeros(DType dtype, Shape shape);
  /// A tensor over `storage` (at least numel * dtype_size bytes), which it keeps alive.
  static Tensor adopt(std::shared_ptr<std::byte> storage, DType dtype, Shape shape);
  /// Another tensor over the same bytes (shared: they live until both are gone).
  Tensor alias() const { return adopt(bytes_, dtype_, shape_); }

  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  std::int64_t numel() const noexcept { return shape_.numel(); }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const noexcept { return shape_.ndim > 0; }

  void* data() noexcept { return bytes_.get(); }
  const void* data() const noexcept { return bytes_.get(); }
  template <class T>
  T* as() noexcept { return reinterpret_cast<T*>(bytes_.get()); }
  template <class T>
  const T* as() const noexcept { return reinterpret_cast<const T*>(bytes_.get()); }
  TensorView view() const noexcept { return TensorView(bytes_.get(), dtype_, shape_); }

 private:
  DType dtype_ = DType::kBF16;
  Shape shape_;
  std::shared_ptr<std::byte> bytes_;
};

}  // namespace epx
