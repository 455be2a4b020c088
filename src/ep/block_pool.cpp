#include "block_pool.hpp"

#include <algorithm>
#include <iterator>

namespace epx::detail {

namespace {
std::size_t pages(std::size_t v) { return (v + 4095) / 4096 * 4096; }
}  // namespace

struct BlockPool::Reservation::State {
  std::mutex mutex;
  std::byte* base = nullptr;
  std::shared_ptr<void> keep_alive;  // the window's owner: lives while a kept block does
  std::map<std::size_t, std::size_t> free;  // offset -> bytes, coalesced
  std::size_t free_bytes = 0;

  void give_back(std::size_t offset, std::size_t bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mutex);
    free_bytes += bytes;
    auto next = free.lower_bound(offset);
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {  // merge with the extent before
        offset = prev->first;
        bytes += prev->second;
        free.erase(prev);
      }
    }
    if (next != free.end() && offset + bytes == next->first) {  // and the one after
      bytes += next->second;
      free.erase(next);
    }
    free.emplace(offset, bytes);
  }
};

BlockPool::BlockPool(std::byte* base, std::size_t bytes, std::shared_ptr<void> keep_alive)
    : state_(std::make_shared<Reservation::State>()), total_(bytes) {
  state_->base = base;
  state_->keep_alive = std::move(keep_alive);
  if (bytes > 0) state_->free.emplace(0, bytes);
  state_->free_bytes = bytes;
}

BlockPool::Reservation BlockPool::reserve(std::size_t max_bytes) {
  Reservation r;
  if (!state_ || max_bytes == 0) return r;
  max_bytes = pages(max_bytes);
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto best = state_->free.end();
  for (auto it = state_->free.begin(); it != state_->free.end(); ++it)
    if (best == state_->free.end() || it->second > best->second) best = it;
  if (best == state_->free.end()) return r;
  r.pool_ = state_;
  r.offset_ = best->first;
  r.bytes_ = std::min(max_bytes, best->second);
  const std::size_t left = best->second - r.bytes_;
  state_->free.erase(best);
  if (left > 0) state_->free.emplace(r.offset_ + r.bytes_, left);
  state_->free_bytes -= r.bytes_;
  return r;
}

std::size_t BlockPool::free_bytes() const {
  if (!state_) return 0;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->free_bytes;
}

BlockPool::Reservation::Reservation(Reservation&& o) noexcept
    : pool_(std::move(o.pool_)), offset_(o.offset_), bytes_(o.bytes_) {
  o.bytes_ = 0;
}

BlockPool::Reservation& BlockPool::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    if (pool_) pool_->give_back(offset_, bytes_);
    pool_ = std::move(o.pool_);
    offset_ = o.offset_;
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

BlockPool::Reservation::~Reservation() {
  if (pool_) pool_->give_back(offset_, bytes_);
}

std::shared_ptr<std::byte> BlockPool::Reservation::keep(std::size_t bytes) {
  bytes = std::min(pages(bytes), bytes_);
  std::shared_ptr<State> pool = std::move(pool_);
  pool->give_back(offset_ + bytes, bytes_ - bytes);
  std::byte* at = pool->base + offset_;
  std::weak_ptr<State> weak = pool;
  const std::size_t offset = offset_;
  bytes_ = 0;
  return std::shared_ptr<std::byte>(at, [weak, offset, bytes, alive = pool->keep_alive](std::byte*) {
    (void)alive;  // held, not used: the window stays mapped while the block lives
    if (auto p = weak.lock()) p->give_back(offset, bytes);
  });
}

}  // namespace epx::detail
