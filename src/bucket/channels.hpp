// The bucket buffer's window past its storage, and the one-way message channels between
// every pair of ranks that live there (the one owner of these offsets and signal slots).
//
// Window (the kind's bytes, BufferBase::allocate):
//   [0, storage)                         the user's storage
//   [slots_offset, + P * 2 * slot_bytes) inbound slots: source rank j, slot s at
//                                        slots_offset + (2 j + s) * slot_bytes
// A slot holds kHeaderBytes of call header, then up to chunk_bytes of payload.
// Signal slots: msg[j] (messages from j), credit[k] (my messages k consumed), done[j].
// On transports whose peer windows are readable in place the window also holds the
// one-shot boards (board.hpp): per group g, two slots of this rank's own (header, inputs,
// result: board_slot_bytes), at board_offset(g, s), and the signal slots board_flag[g][j]
// (member j's call epoch).
//
// A channel j -> k is a credit channel of two slots (epx/spi/channel.hpp, the protocol every
// buffer kind shares) carrying messages numbered 0, 1, 2, ... over all calls of the buffer
// (every group): message m lands in k's slot (j, m % 2); msg[j] is its arrived count,
// credit[k] its released count. Done signals (done[j]) count separately: "every put of this
// call from j to me has landed". Both are published by the buffer's protocol for the channels
// (explicit: a quiet before each signal; tail: the signal ordered after the puts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "epx/spi/channel.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

/// Room for a call header in every slot (fixed fields, 64 tensors, the problem text).
inline constexpr std::size_t kHeaderBytes = 4096;
/// An encoded header's most bytes: a board slot keeps its result flag in the header area's
/// last 64 bytes (board.hpp).
inline constexpr std::size_t kHeaderWireBytes = kHeaderBytes - 64;

struct BucketLayout {
  int num_ranks = 0;
  std::size_t storage_bytes = 0;
  std::size_t chunk_bytes = 0;  ///< payload bytes per slot
  int num_boards = 0;           ///< groups with a one-shot board (0: no board)
  std::size_t slot_bytes() const noexcept { return kHeaderBytes + chunk_bytes; }
  std::size_t slots_offset() const noexcept;
  /// Offset (in the receiver's window) of slot `s` of messages from `source`.
  std::size_t slot_offset(int source, int s) const noexcept;
  /// A board slot: the header area, chunk_bytes of inputs, chunk_bytes of result (all_reduce).
  std::size_t board_slot_bytes() const noexcept { return kHeaderBytes + 2 * chunk_bytes; }
  /// Offset (in every rank's own window) of its board slot `s` (0, 1) of group `g`.
  std::size_t board_offset(int g, int s) const noexcept;
  std::size_t window_bytes() const noexcept;
  std::size_t num_signals() const noexcept {
    return (3 + static_cast<std::size_t>(num_boards)) * static_cast<std::size_t>(num_ranks);
  }
  /// The credit channels' signal slots come first (msg[j] = arrived[j], credit[k] = released[k]).
  static constexpr std::size_t kChannelSignals = 0;
  std::size_t done_slot(int source) const noexcept {
    return spi::CreditChannels::num_signals(num_ranks) + static_cast<std::size_t>(source);
  }
  /// Where `source` publishes the epoch of its latest call on group `g` (in every member's slots).
  std::size_t board_flag_slot(int g, int source) const noexcept {
    return static_cast<std::size_t>((3 + g) * num_ranks + source);
  }
};

/// The channels of this rank (one thread at a time; the counters are this rank's view).
class Channels {
 public:
  /// `yield` as spi::await_signal (ranks outnumber the cores); `protocol` explicit or tail.
  Channels(Transport& t, const BucketLayout& layout, bool yield, Protocol protocol);

  /// Offset in `to`'s window where my next message to it goes (after wait_credit).
  std::size_t out_slot(int to) const noexcept;
  /// Waits until `to` has consumed my message before the previous one (its slot is free).
  void wait_credit(int to, const char* phase);
  /// Signals `to` that my next message (put into out_slot(to)) is complete.
  void send(int to, int queue = 0);

  /// Waits for the next message from `from`; returns its slot in my window.
  const std::byte* receive(int from, const char* phase);
  /// Done with the message receive() returned: its slot may be reused by `from`.
  void consume(int from, int queue = 0);

  /// done round: every put of this call to `to` came before this (ordered signal).
  void send_done(int to, int queue = 0);
  void wait_done(int from, const char* phase);

  /// Microseconds spent in wait_done since the last reset (a call's done phase).
  double done_wait_us = 0;

  Transport& transport() noexcept { return t_; }
  const BucketLayout& layout() const noexcept { return layout_; }
  std::byte* window() noexcept { return t_.window(); }

 private:
  Transport& t_;
  BucketLayout layout_;
  spi::CreditChannels credit_;
  bool yield_;
  std::vector<std::uint64_t> done_sent_, done_received_;
};

}  // namespace epx::detail
