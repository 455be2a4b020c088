// The one-shot boards (docs/buffers.md, algorithm one-shot). On transports whose peer
// windows are readable in place every call's header goes into the caller's own window
// (instead of a put into a slot of every other member), and a small call's inputs go with
// it: one round of signals carries the sizes, the arguments' check and the data.
//
// Per group g a rank has two board slots in its own window (BucketLayout::board_offset; a
// header area of kHeaderBytes, chunk_bytes of inputs, chunk_bytes of result), used by the
// parity of the group's call epoch e = 1, 2, ... A member publishes call e by signalling
// board_flag[g][me] = e to every other member (ordered after its writes); every member waits
// until it holds every member's flag e, then reads their slots where they lie.
//
// all_reduce's sum is the same bits on every member (one fold), so it is computed once per
// call where possible: the first member to get there sums into its slot's result area and
// stores the epoch into its result flag (the header area's last 64 bytes, release); a member
// that finds a member's result flag at e copies that result instead of summing P inputs.
//
// The flag protocol (BucketOptions::protocol) publishes call e without signals: the slot's
// ready word (the header area's last 64 bytes, after the result flag) gets e after the header
// and inputs (release), and the members look at it where it lies (spi::await_word). The reuse
// argument below holds for it alike: the word of slot e % 2 only grows (e, e + 2, ...).
//
// Reuse without a second round: a rank writes slot e % 2 again at epoch e + 2. Before that
// its call e + 1 saw every member's flag e + 1, which each member raised only after its
// call e had ended, reading of this rank's slot included (a rank starts no call while one
// is pending). Groups never share a slot, so calls of different groups on overlapping ranks
// cannot meet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "channels.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

class Board {
 public:
  /// `protocol`: how exchange() publishes a slot (explicit, tail: signals; flag: its ready word).
  Board(Transport& t, const BucketLayout& layout, bool yield, Protocol protocol);

  /// This rank's slot for its next call on group g (the epoch advances).
  std::byte* next_slot(int g);
  /// Publishes this rank's slot of the current call of g (filled) to the other members
  /// (world ranks, ascending; `me` is this rank's position) and waits for theirs.
  void exchange(int g, const std::vector<int>& members, int me);
  /// World rank `rank`'s slot of the current call of group g (after exchange).
  const std::byte* slot(int g, int rank) const noexcept;

  /// A member's result of the current call of g, if one published it (else null).
  const std::byte* published_result(int g, const std::vector<int>& members) const noexcept;
  /// This rank's result area of the current call of g (chunk_bytes).
  std::byte* my_result(int g) noexcept;
  /// Publishes my_result(g) (written) to the members.
  void publish_result(int g) noexcept;

 private:
  Transport& t_;
  BucketLayout layout_;
  bool yield_;
  Protocol protocol_;
  std::vector<std::uint64_t> epoch_;  ///< [g]: calls of group g so far
};

}  // namespace epx::detail
