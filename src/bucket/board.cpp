#include "board.hpp"

#include <atomic>

#include "epx/spi/wait.hpp"

namespace epx::detail {

Board::Board(Transport& t, const BucketLayout& layout, bool yield)
    : t_(t), layout_(layout), yield_(yield), epoch_(static_cast<std::size_t>(layout.num_boards), 0) {}

std::byte* Board::next_slot(int g) {
  const std::uint64_t e = ++epoch_[static_cast<std::size_t>(g)];
  return t_.window() + layout_.board_offset(g, static_cast<int>(e % 2));
}

void Board::exchange(int g, const std::vector<int>& members, int me) {
  const std::uint64_t e = epoch_[static_cast<std::size_t>(g)];
  const int n = static_cast<int>(members.size());
  const std::size_t mine = layout_.board_flag_slot(g, t_.rank());
  for (int s = 1; s < n; ++s) t_.signal(members[static_cast<std::size_t>((me + s) % n)], mine, e, 0);
  for (int s = 1; s < n; ++s) {
    const int from = members[static_cast<std::size_t>((me + n - s) % n)];
    spi::await_signal(t_, layout_.board_flag_slot(g, from), e, WaitPoint{"bucket header", from}, yield_);
  }
}

const std::byte* Board::slot(int g, int rank) const noexcept {
  const std::uint64_t e = epoch_[static_cast<std::size_t>(g)];
  return t_.peer_window(rank) + layout_.board_offset(g, static_cast<int>(e % 2));
}

namespace {
std::atomic_ref<std::uint64_t> result_flag(const std::byte* slot) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(slot) + kHeaderWireBytes));
}
}  // namespace

const std::byte* Board::published_result(int g, const std::vector<int>& members) const noexcept {
  const std::uint64_t e = epoch_[static_cast<std::size_t>(g)];
  for (int r : members) {
    const std::byte* s = slot(g, r);
    if (result_flag(s).load(std::memory_order_acquire) == e) return s + kHeaderBytes + layout_.chunk_bytes;
  }
  return nullptr;
}

std::byte* Board::my_result(int g) noexcept {
  return const_cast<std::byte*>(slot(g, t_.rank())) + kHeaderBytes + layout_.chunk_bytes;
}

void Board::publish_result(int g) noexcept {
  result_flag(slot(g, t_.rank())).store(epoch_[static_cast<std::size_t>(g)], std::memory_order_release);
}

}  // namespace epx::detail
