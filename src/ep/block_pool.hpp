// The output pool's allocator: blocks of a byte range of the window (Geometry's region
// kOutputs), each one dispatch output. A receiver reserves a block before the call's header
// exchange (the largest free extent up to the size it may need; senders learn its place
// from the header), keeps what the call's output needs as the storage of the returned
// Tensors, and releases the rest. A kept block returns to the pool when the last Tensor over
// it dies, from any thread; a pool that died first (the Buffer is gone) is not touched.
// Offsets are the pool's own (0 = the region's first byte): Geometry turns them into window
// offsets. Extents are whole 4 KiB pages.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace epx::detail {

class BlockPool {
 public:
  BlockPool() = default;
  /// The pool over `bytes` bytes at `base` (a multiple of 4096). Every kept block also holds
  /// `keep_alive` (the memory's owner: the Buffer's endpoint) until it returns.
  BlockPool(std::byte* base, std::size_t bytes, std::shared_ptr<void> keep_alive = {});

  /// A reserved extent, released on destruction unless kept.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept;
    Reservation& operator=(Reservation&& o) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();
    std::size_t offset() const noexcept { return offset_; }  ///< in the pool
    std::size_t bytes() const noexcept { return bytes_; }    ///< 0: nothing reserved
    /// Keeps the first `bytes` (<= bytes(), a multiple of 4096, > 0) as a block and
    /// releases the rest; the block returns when the last copy of the result dies.
    std::shared_ptr<std::byte> keep(std::size_t bytes);

   private:
    friend class BlockPool;
    struct State;
    std::shared_ptr<State> pool_;
    std::size_t offset_ = 0, bytes_ = 0;
  };

  /// The largest free extent, cut to at most `max_bytes` (rounded up to 4096); nothing
  /// reserved (bytes() == 0) when the pool is full or `max_bytes` is 0.
  Reservation reserve(std::size_t max_bytes);
  /// Bytes not reserved or kept (for tests and stats).
  std::size_t free_bytes() const;
  std::size_t total_bytes() const noexcept { return total_; }

 private:
  std::shared_ptr<Reservation::State> state_;
  std::size_t total_ = 0;
};

}  // namespace epx::detail
