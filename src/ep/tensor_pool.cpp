#include "tensor_pool.hpp"

#include <cstdlib>
#include <new>

namespace epx::detail {

TensorPool::State::~State() {
  for (auto& [size, block] : free) std::free(block);
}

TensorPool::TensorPool(std::size_t max_cached_bytes) : state_(std::make_shared<State>()) {
  state_->max_cached = max_cached_bytes;
}

Tensor TensorPool::make(DType dtype, Shape shape) {
  const std::size_t want = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  const std::size_t capacity = (want + 4095) / 4096 * 4096 + 4096 * (want == 0);
  std::byte* block = nullptr;
  std::size_t size = capacity;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->free.lower_bound(capacity);
    if (it != state_->free.end() && it->first <= 2 * capacity) {  // don't pin a huge block for a small tensor
      size = it->first;
      block = it->second;
      state_->cached -= size;
      state_->free.erase(it);
    }
  }
  if (block == nullptr) {
    block = static_cast<std::byte*>(std::aligned_alloc(4096, capacity));
    if (block == nullptr) throw std::bad_alloc();
  }
  std::weak_ptr<State> pool = state_;
  std::shared_ptr<std::byte> storage(block, [pool, size](std::byte* p) {
    if (auto s = pool.lock()) {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (s->cached + size <= s->max_cached) {
        s->free.emplace(size, p);
        s->cached += size;
        return;
      }
    }
    std::free(p);
  });
  return Tensor::adopt(std::move(storage), dtype, shape);
}

}  // namespace epx::detail
