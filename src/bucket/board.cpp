#include "board.hpp"

#include <atomic>

#include "epx/spi/wait.hpp"

namespace epx::detail {

Board::Board(Transport& t, const BucketLayout& layout, bool yield, Protocol protocol)
    : t_(t), layout_(layout), yield_(yield), protocol_(protocol), epoch_(static_cast<std::size_t>(layout.num_boards), 0) {}

namespace {
/// A slot's result flag and ready word: the header area's last 64 bytes (kHeaderWireBytes on).
std::atomic_ref<std::uint64_t> slot_word(const std::byte* slot, std::size_t at) {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(slot) + at));
}
constexpr std::size_t kResultWord = kHeaderWireBytes;
constexpr std::size_t kReadyWord = kHeaderWireBytes + 8;
}  // namespace

std::byte* Board::next_slot(int g) {
  const std::uint64_t e = ++epoch_[static_cast<std::size_t>(g)];
  return t_.window() + layout_.board_offset(g, static_cast<int>(e % 2));
}

void Board::exchange(int g, const std::vector<int>& members, int me) {
  const std::uint64_t e = epoch_[static_cast<std::size_t>(g)];
  const int n = static_cast<int>(members.size());
  if (protocol_ == Protocol::kFlag) {
    slot_word(slot(g, t_.rank()), kReadyWord).store(e, std::memory_order_release);
    for (int s = 1; s < n; ++s) {
      const int from = members[static_cast<std::size_t>((me + n - s) % n)];
      spi::await_word(t_, slot(g, from) + kReadyWord, e, WaitPoint{"bucket header", from}, yield_);
    }
    return;
  }
  if (protocol_ == Protocol::kExplicit) t_.quiet(0);
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
std::atomic_ref<std::uint64_t> result_flag(const std::byte* slot) { return slot_word(slot, kResultWord); }
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
