// Output memory recycled across calls (a small caching allocator). A fresh multi-MB
// allocation costs a page fault per 4 KiB on first touch (~1.3 GB/s here), more than the
// copy into it; recycled blocks are already faulted in. Blocks return to the pool when the
// last Tensor over them dies (from any thread); they outlive the pool safely.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "epx/tensor.hpp"

namespace epx::detail {

class TensorPool {
 public:
  /// Free blocks kept for reuse, at most this many bytes; larger surpluses are freed.
  explicit TensorPool(std::size_t max_cached_bytes = std::size_t{1} << 30);
  Tensor make(DType dtype, Shape shape);

 private:
  struct State {
    std::mutex mutex;
    std::multimap<std::size_t, std::byte*> free;  // capacity -> block
    std::size_t cached = 0;
    std::size_t max_cached = 0;
    ~State();
  };
  std::shared_ptr<State> state_;
};

}  // namespace epx::detail
