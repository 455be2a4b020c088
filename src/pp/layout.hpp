// The one owner of a PPBuffer's offsets and signal slots (implementer header).
//
// Rank d's window: for each rank s linked to d (ascending), an inbox of `inflight` slots;
// message n of the pair (s, d) lies in slot n % inflight of s's inbox. A slot is a 64-byte
// header (the sender's byte count and the message number) and the payload. Every rank's
// window has the size of the largest (most linked ranks x slots x slot bytes).
//
// Signal slots of rank r: the pairs' credit channels (epx/spi/channel.hpp, slots = inflight):
// arrived(s) = messages s has put into r's inbox of s (s's puts are ordered before it);
// released(d) = messages of the pair (r, d) d has released.
//
// Streaming (messages of at least stream_min_bytes() between mapped peers, pp_buffer.cpp):
// after the slots, every window has a control block per rank p (three cache lines: the post
// of r's receive from p and the ring chunks p has produced, both written in r's window; the
// ring chunks of r's messages to p that p has consumed, written by p in r's window), then for
// each rank linked to r (inbox order) a ring of kRingChunks chunks of chunk_bytes(). The
// control blocks exist in every window (the post also carries a receive into a planned tensor,
// any size); the rings only when messages may stream.
//
// Planned tensors (PPBuffer's BufferAllocator plan): the user region, after everything else,
// at a multiple of 4096; a plan's offsets count from its start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "epx/spi/channel.hpp"

namespace epx::pp {

inline constexpr std::size_t kHeaderBytes = 64;

/// Ring chunks per inbox; messages of at least kRingChunks chunks may stream.
inline constexpr std::uint64_t kRingChunks = 4;
/// Default chunk_bytes (PPConfig::chunk_bytes = 0).
inline constexpr std::size_t kDefaultChunkBytes = std::size_t{256} << 10;
/// SlotHeader::ring_from of a message whose every byte is in its slot.
inline constexpr std::uint64_t kNoRing = ~std::uint64_t{0};

struct SlotHeader {
  std::uint64_t nbytes;
  std::uint64_t seq;
  /// The first chunk that went through the inbox's ring (chunks before it are in the slot),
  /// kNoRing when none did. With `direct`: the first chunk written into the receiver's
  /// planned tensor (chunks before it are in the slot).
  std::uint64_t ring_from;
  /// 0, or 1 + the offset in the receiver's window of the planned tensor the sender wrote
  /// chunks [ring_from, end) into (the receive's post asked for it).
  std::uint64_t direct;
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);
/// Under the flag protocol (PPConfig::protocol) the header's last word is the slot's flag:
/// the message number + 1, stored after the payload and the header (spi::CreditChannels).
inline constexpr std::size_t kFlagWordOffset = kHeaderBytes - 8;
static_assert(sizeof(SlotHeader) <= kFlagWordOffset);

class Layout {
 public:
  /// `links` as PPConfig::links (empty: every pair); throws kInvalidArgument for a rank
  /// outside 0..num_ranks-1, naming the link.
  /// `chunk_bytes` as PPConfig::chunk_bytes (0: kDefaultChunkBytes; else a multiple of 64,
  /// else kInvalidArgument).
  /// `user_bytes`: the planned tensors' region (BufferAllocator::total_bytes()).
  Layout(int num_ranks, std::size_t max_tensor_bytes, int inflight, const std::vector<std::pair<int, int>>& links,
         std::size_t chunk_bytes = 0, std::size_t user_bytes = 0);

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
  /// Offset in `receiver`'s window of that slot's flag word (kFlagWordOffset).
  std::size_t flag_offset(int receiver, int sender, std::uint64_t seq) const noexcept {
    return slot_offset(receiver, sender, seq) + kFlagWordOffset;
  }

  /// Streaming: the chunk size, the smallest message that may stream (0: none may: the
  /// window has no rings because no message is that large).
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }
  std::size_t stream_min_bytes() const noexcept { return rings_ ? chunk_bytes_ * kRingChunks : 0; }
  /// In rank r's window: the post of r's receive of message n from `sender` (word 0: n + 1,
  /// its top bit set once the sender claimed it; word 1: the receive's byte count; word 2:
  /// 0, or 1 + the window offset of the planned tensor it receives into), the
  /// chunks `sender` produced into r's ring, and the chunks `receiver` consumed of r's ring
  /// in its window. 8-aligned words on cache lines of their own.
  std::size_t post_offset(int sender) const noexcept { return control_ + static_cast<std::size_t>(sender) * 192; }
  std::size_t produced_offset(int sender) const noexcept { return post_offset(sender) + 64; }
  std::size_t consumed_offset(int receiver) const noexcept { return post_offset(receiver) + 128; }
  /// Offset in `receiver`'s window of ring chunk `k` (any count: taken modulo kRingChunks) of
  /// its inbox of `sender`.
  std::size_t ring_offset(int receiver, int sender, std::uint64_t k) const noexcept;

  /// The planned tensors' region: its offset in every window and its bytes.
  std::size_t user_offset() const noexcept { return user_at_; }
  std::size_t user_bytes() const noexcept { return user_bytes_; }

  /// The signal slots: the pairs' credit channels' (arrived, released; epx/spi/channel.hpp), from 0.
  static constexpr std::size_t kChannelSignals = 0;
  std::size_t num_signals() const noexcept { return spi::CreditChannels::num_signals(num_ranks_); }

 private:
  /// Position of `sender` among `receiver`'s linked ranks, -1 if not linked.
  int inbox_index(int receiver, int sender) const noexcept;

  int num_ranks_;
  int inflight_;
  bool all_ = false;                    // every pair linked: inbox index == sender
  std::vector<std::vector<int>> peers_;  // explicit links: peers_[r] ascending
  std::size_t slot_bytes_ = 0;
  std::size_t window_bytes_ = 0;
  std::size_t chunk_bytes_ = kDefaultChunkBytes;
  bool rings_ = false;       // max_tensor_bytes >= kRingChunks chunks
  std::size_t control_ = 0;  // the control blocks, after the slots
  std::size_t rings_at_ = 0;  // the rings, after the control blocks
  std::size_t user_at_ = 0;   // the planned tensors, last
  std::size_t user_bytes_ = 0;
};

}  // namespace epx::pp
