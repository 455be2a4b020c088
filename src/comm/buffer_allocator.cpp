#include "epx/buffer_allocator.hpp"

#include "epx/error.hpp"
#include "epx/spi/resources.hpp"

namespace epx {

namespace {
std::size_t align_up(std::size_t v) { return (v + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment; }
}  // namespace

std::size_t BufferAllocator::allocate(const std::string& name, const Shape& shape, DType dtype) {
  const std::string who = "BufferAllocator.allocate('" + name + "'): ";
  if (name.empty()) throw Error(ErrorCode::kInvalidArgument, "BufferAllocator.allocate: the name must not be empty");
  if (find(name) >= 0) throw Error(ErrorCode::kInvalidArgument, who + "a tensor of that name is already planned");
  std::uint64_t numel = 1;
  for (int i = 0; i < shape.ndim; ++i) {
    if (shape[i] < 0) throw Error(ErrorCode::kInvalidArgument, who + "negative dimension in shape " + shape.str());
    numel = detail::mul_sat(numel, static_cast<std::uint64_t>(shape[i]));
  }
  const std::uint64_t bytes = detail::mul_sat(numel, dtype_size(dtype));
  const std::uint64_t end = detail::add_sat(total_, bytes);
  if (end > (std::uint64_t{1} << 56))
    throw Error(ErrorCode::kCapacityExceeded, who + "the plan would need " + detail::format_bytes(end) + " bytes");
  PlannedTensor t;
  t.name = name;
  t.shape = shape;
  t.dtype = dtype;
  t.offset = total_;
  t.nbytes = static_cast<std::size_t>(bytes);
  total_ = align_up(static_cast<std::size_t>(end));
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

std::ptrdiff_t BufferAllocator::find(const std::string& name) const noexcept {
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

const PlannedTensor& BufferAllocator::at(const std::string& name, const std::string& who) const {
  const std::ptrdiff_t i = find(name);
  if (i >= 0) return tensors_[static_cast<std::size_t>(i)];
  std::string names;
  for (const PlannedTensor& p : tensors_) names += (names.empty() ? "" : ", ") + p.name;
  throw Error(ErrorCode::kInvalidArgument,
              who + ": no planned tensor '" + name + "' (the plan has: " + (names.empty() ? "none" : names) + ")");
}

std::string to_string(const PlannedTensor& t) {
  return t.name + ":" + t.shape.str() + ":" + to_string(t.dtype) + "@" + std::to_string(t.offset);
}

std::string BufferAllocator::describe() const {
  std::string s;
  for (const PlannedTensor& t : tensors_) s += (s.empty() ? "" : ";") + to_string(t);
  return s;
}

}  // namespace epx
