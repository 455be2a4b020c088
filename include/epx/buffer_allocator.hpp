// epx/buffer_allocator.hpp — plan named symmetric tensors before a buffer is built
// (DeepEP V2.5's BufferAllocator).
//
//   epx::BufferAllocator plan;
//   plan.allocate("grads", {1 << 20}, epx::DType::kF32);     // offset 0
//   plan.allocate("params", {4096, 512}, epx::DType::kBF16); // offset 4 MiB (2 MiB aligned)
//   epx::BucketBuffer bucket(transport, {epx::world(P)}, plan);   // collective
//   epx::MutableView grads = bucket.tensor("grads");          // a view of bucket's window
//
// Local and cheap: a plan is a list of (name, shape, dtype) at offsets aligned to
// kBufferAlignment from the start of the buffer's user region. A buffer built from a plan
// checks, collectively, that every rank planned the same list (names, shapes, dtypes, in
// the same order): a differing plan throws kInvalidArgument on every rank naming the first
// differing entry and the rank (BufferBase::agree_plan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "epx/tensor.hpp"

namespace epx {

/// Offsets of planned tensors are multiples of this (DeepEP's 2 MiB).
inline constexpr std::size_t kBufferAlignment = std::size_t{2} << 20;

/// One planned tensor: where it lies in the buffer's user region.
struct PlannedTensor {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  std::size_t offset = 0;  ///< bytes from the start of the user region; multiple of kBufferAlignment
  std::size_t nbytes = 0;  ///< shape.numel() * dtype_size(dtype)
};

/// "grads:[1048576]:float32@0": one entry as BufferAllocator::describe() and the plan
/// agreement show it.
std::string to_string(const PlannedTensor& t);

/// A writable view of a tensor inside a buffer's window (valid until the buffer's destroy()).
struct MutableView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(shape.numel()) * dtype_size(dtype); }
  TensorView view() const noexcept { return TensorView(data, dtype, shape); }
};

class BufferAllocator {
 public:
  BufferAllocator() = default;

  /// Local: appends a tensor of `shape` / `dtype` at the next offset aligned to
  /// kBufferAlignment and returns its index. Throws kInvalidArgument for an empty or
  /// duplicate name, a negative dimension, or a size that overflows.
  std::size_t allocate(const std::string& name, const Shape& shape, DType dtype);

  /// Bytes of the user region the plan needs: the end of its last tensor rounded up to
  /// kBufferAlignment (0 for an empty plan).
  std::size_t total_bytes() const noexcept { return total_; }

  const std::vector<PlannedTensor>& tensors() const noexcept { return tensors_; }
  /// Index of `name`, or -1.
  std::ptrdiff_t find(const std::string& name) const noexcept;
  /// The tensor `name`; throws kInvalidArgument "<who>: no planned tensor 'name' (the plan
  /// has: a, b)" when there is none (`who`: e.g. "rank 3: bucket.tensor").
  const PlannedTensor& at(const std::string& name, const std::string& who) const;

  /// The plan as one string, entry by entry ("grads:[1048576]:float32@0;..."): what
  /// BufferBase::agree_plan compares between ranks.
  std::string describe() const;

 private:
  std::vector<PlannedTensor> tensors_;
  std::size_t total_ = 0;
};

}  // namespace epx
