// epx/spi/channel.hpp — credit channels: the one message protocol between pairs of ranks
// that the bucket and PP buffers use (each with its own window layout).
//
// The channel from rank j to rank k carries messages numbered 0, 1, 2, ... over the
// buffer's life; message m lives in k's window in slot m % slots of j's inbox (where that
// is, the buffer kind's layout says). Two signal slots per peer, in a block starting at
// `signal_base`:
//   arrived[j]  (at k)  = messages j has completed into k's inbox (ordered after their puts)
//   released[k] (at j)  = messages of j's k has released (their slots may be written again)
// A sender waits before message m until released >= m - slots + 1, so a slot is never
// written while its previous message may still be read; then puts and publishes arrived =
// m + 1. A receiver waits for arrived >= m + 1, reads the slot, and releases. Counts are
// monotonic, so slots and signals are reused without clearing.
//
// How arrived is published is the channel's completion protocol (epx/spi/kind_support.hpp):
// explicit quiets the queue before the signal, tail relies on the signal's order after the
// puts, flag writes no signal: the message's own flag word (an 8-byte word of its slot the
// kind names, in the receiver's window) gets m + 1 after its bytes, and the receiver looks
// there (the slot's word, reused every `slots` messages, only grows). The released counts
// are signals under every protocol.
//
// Threading: one thread per rank at a time (the counters are this rank's view).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "epx/dataplane.hpp"
#include "epx/transport.hpp"

namespace epx::spi {

class CreditChannels {
 public:
  /// Signal slots [signal_base, signal_base + num_signals(P)) of `t`'s endpoint are the
  /// channels'. `slots`: messages a pair may have in flight (>= 1). `yield` as await_signal.
  /// `protocol`: how arrived is published (flag: the callers pass each message's flag word).
  CreditChannels(Transport& t, int slots, std::size_t signal_base, bool yield, Protocol protocol = Protocol::kTail);
  Protocol protocol() const noexcept { return protocol_; }
  /// The flag_offset of the calls below when the protocol is not flag.
  static constexpr std::size_t kNoFlag = ~std::size_t{0};

  static std::size_t num_signals(int num_ranks) noexcept { return 2 * static_cast<std::size_t>(num_ranks); }
  std::size_t arrived_signal(int source) const noexcept { return base_ + static_cast<std::size_t>(source); }
  std::size_t released_signal(int receiver) const noexcept { return base_ + static_cast<std::size_t>(P_ + receiver); }
  int slots() const noexcept { return slots_; }

  // --- send side (to `to`) ---
  /// The number of the next message to `to` (its slot: next_to(to) % slots()).
  std::uint64_t next_to(int to) const noexcept { return sent_[static_cast<std::size_t>(to)]; }
  /// Whether `to` has released enough for the next message's slot to be free (no wait).
  bool slot_free(int to) const noexcept;
  /// Waits until the next message's slot at `to` is free (kTimeout / kPeerFailed as the transport's).
  void await_slot(int to, const char* phase);
  /// The next message to `to` is complete in its slot: arrived = its number + 1, ordered
  /// after this thread's earlier puts on `queue` (flag: into the message's flag word at
  /// `flag_offset` of `to`'s window, after this thread's earlier stores; mapped peers).
  void publish(int to, int queue = 0, std::size_t flag_offset = kNoFlag);
  /// Messages to `to` not released yet.
  std::uint64_t in_flight(int to) const noexcept;

  // --- receive side (from `from`) ---
  /// The number of the next message from `from` (its slot: next_from(from) % slots()).
  std::uint64_t next_from(int from) const noexcept { return received_[static_cast<std::size_t>(from)]; }
  /// Whether the next message from `from` has arrived (no wait; flag: its flag word at
  /// `flag_offset` of this rank's window).
  bool arrived(int from, std::size_t flag_offset = kNoFlag) const noexcept;
  /// Messages `from` has published to this rank so far (not known under flag: 0).
  std::uint64_t arrived_count(int from) const noexcept;
  /// Waits until the next message from `from` has arrived (flag: as arrived()).
  void await_message(int from, const char* phase, std::size_t flag_offset = kNoFlag);
  /// Takes the next message from `from` (after it arrived): next_from advances.
  void take(int from) noexcept { ++received_[static_cast<std::size_t>(from)]; }
  /// Tells `from` that its messages [0, count) are released (count only grows).
  void release(int from, std::uint64_t count, int queue = 0);

 private:
  Transport& t_;
  int P_, slots_;
  std::size_t base_;
  bool yield_;
  Protocol protocol_;
  std::vector<std::uint64_t> sent_, received_;
};

}  // namespace epx::spi
