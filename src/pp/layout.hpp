// The one owner of a PPBuffer's offsets and signal slots (implementer header).
//
// Rank d's window: for each rank s linked to d (ascending), an inbox of `inflight` slots;
// message n of the pair (s, d) lies in slot n % inflight of s's inbox. A slot is a 64-byte
// header (the sender's byte count and the message number) and the payload. Every rank's
// window has the size of the largest (most linked ranks x slots x slot bytes).
//
// Signal slots of rank r: arrived(s) = messages s has put into r's inbox of s (s's puts are
// ordered before it); released(d) = messages of the pair (r, d) d has released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace epx::pp {

inline constexpr std::size_t kHeaderBytes = 64;

struct SlotHeader {
  std::uint64_t nbytes;
  std::uint64_t seq;
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

class Layout {
 public:
  /// `links` as PPConfig::links (empty: every pair); throws kInvalidArgument for a rank
  /// outside 0..num_ranks-1, naming the link.
  Layout(int num_ranks, std::size_t max_tensor_bytes, int inflight, const std::vector<std::pair<int, int>>& links);

  int num_ranks() const noexcept { return num_ranks_; }
  int inflight() const noexcept { return inflight_; }
  bool linked(int a, int b) const noexcept { return inbox_index(a, b) >= 0; }
  /// Ranks linked to `r`, ascending.
  std::vector<int> peers_of(int r) const;
  /// Bytes of one slot: header + payload, rounded up to 64.
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  /// Bytes of every rank's window (saturated: a size too big for memory stays too big).
  std::size_t window_bytes() const noexcept { return window_bytes_; }
  /// Offset in `receiver`'s window of the slot holding message `seq` from `sender`.
  std::size_t slot_offset(int receiver, int sender, std::uint64_t seq) const noexcept;

  static std::size_t arrived_signal(int sender) noexcept { return static_cast<std::size_t>(sender); }
  std::size_t released_signal(int receiver) const noexcept {
    return static_cast<std::size_t>(num_ranks_ + receiver);
  }
  std::size_t num_signals() const noexcept { return 2 * static_cast<std::size_t>(num_ranks_); }

 private:
  /// Position of `sender` among `receiver`'s linked ranks, -1 if not linked.
  int inbox_index(int receiver, int sender) const noexcept;

  int num_ranks_;
  int inflight_;
  bool all_ = false;                    // every pair linked: inbox index == sender
  std::vector<std::vector<int>> peers_;  // explicit links: peers_[r] ascending
  std::size_t slot_bytes_ = 0;
  std::size_t window_bytes_ = 0;
};

}  // namespace epx::pp
