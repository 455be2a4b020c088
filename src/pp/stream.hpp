// How PPBuffer's bytes move between ranks whose windows are mapped into each other
// (implementer header; layout.hpp owns every offset).
//
// A message of at least Layout::stream_min_bytes() goes in chunks. While its receiver is not
// waiting for it, the sender copies chunks into the slot with streaming stores (eager: send
// returns once every byte is in the slot). A receiver waiting for it in recv() posts its
// receive (message number and byte count, in its own window); a sender that finds that post
// claims it (compare-and-swap, so a receiver that gives up on a timeout withdraws it first or
// knows it was claimed), writes the header with the chunk it claimed at and signals arrived,
// then moves every later chunk through the inbox's ring of kRingChunks chunks with plain
// (cached) stores, each followed by its `produced` count; the receiver copies each ring chunk
// into the caller's tensor while it is still in cache and counts it `consumed` in the
// sender's window, which frees the ring place. The bytes then cross memory once instead of
// twice (the slot's write and read). While no ring chunk is ready the receiver copies the
// chunks that went into the slot before the claim.
//
// A receive into a planned tensor (in the receiver's own window, any size) posts the tensor's
// offset with it: the sender that claims such a post writes every later byte straight into
// the tensor (streaming stores from stream_min_bytes, plain below), then the header (`direct`,
// the chunk it claimed at) and arrived; the receiver copies only the chunks that went into the
// slot before the claim.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "epx/spi/channel.hpp"
#include "epx/transport.hpp"
#include "layout.hpp"

namespace epx::pp {

/// The copy of a message's bytes out of or into a slot: plain stores below stream_min (the
/// reader takes them soon, from cache), streaming stores above.
void copy_message(void* dst, const void* src, std::size_t bytes) noexcept;

/// One message to a mapped peer (not this rank), at least stream_min_bytes.
struct StreamSend {
  Transport& t;
  spi::CreditChannels& ch;  // announces the message (arrived) once its header is in the slot
  const Layout& l;
  int me, dst;
  std::uint64_t n;  // the message's number on the pair
  const std::byte* x;
  std::size_t nbytes;
  std::uint64_t& ring_sent;  // ring chunks this rank produced to dst, over all messages
  bool yield;
};
/// Moves every byte (slot, then ring or the planned tensor from the claim on), writes the
/// header and signals arrived. Returns the header it wrote.
SlotHeader stream_send(const StreamSend& s);

/// A message below stream_min_bytes to a mapped peer (not this rank): into the planned tensor
/// when the receiver posted one for it, else into the slot; then the header and arrived.
/// Returns the header it wrote.
SlotHeader small_send(Transport& t, spi::CreditChannels& ch, const Layout& l, int me, int dst, std::uint64_t n,
                      const std::byte* x, std::size_t nbytes);

/// This rank's receive of message n from `src` (a mapped peer, not this rank).
struct StreamRecv {
  Transport& t;
  const Layout& l;
  int me, src;
  const std::byte* payload;  // the message's slot payload in this rank's window
  std::byte* out;
  std::size_t nbytes;
  std::uint64_t ring_from;       // the header's
  std::uint64_t& ring_received;  // ring chunks this rank consumed from src, over all messages
  bool yield;
};
/// Copies chunks [0, ring_from) from the slot and the rest from the ring as they come.
void stream_recv(const StreamRecv& r);

/// The post of a receive of message n (`nbytes`) from `src` in this rank's window (`direct`:
/// 0, or 1 + the window offset of the planned tensor it receives into); withdraw returns
/// false when the sender had already claimed it (its bytes are coming).
void post_receive(Transport& t, const Layout& l, int src, std::uint64_t n, std::size_t nbytes, std::uint64_t direct);
bool withdraw_receive(Transport& t, const Layout& l, int src, std::uint64_t n);

}  // namespace epx::pp
