#include "stream.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "epx/spi/copy.hpp"
#include "epx/spi/cpu_relax.hpp"

namespace epx::pp {

namespace {

/// The top bit of a post's first word: the sender claimed it.
constexpr std::uint64_t kClaimed = std::uint64_t{1} << 63;

/// Looks before the transport's own wait (which spins longer, then yields, and owns the
/// timeout and the peer-failure checks): kSpinLooks a pause apart (the peer is running and
/// about to write), then kYieldLooks with the core yielded between them.
constexpr int kSpinLooks = 64;
constexpr int kYieldLooks = 512;

std::atomic_ref<std::uint64_t> word(const std::byte* base, std::size_t offset) {
  // A mapped peer's window is a writable mapping (the transport's puts are stores through it).
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(base) + offset));
}

std::byte* writable(const std::byte* p) { return const_cast<std::byte*>(p); }

/// Sets the post's claimed bit when it is the receive of this message with its byte count.
bool claim(const StreamSend& s, const std::byte* peer) {
  auto post = word(peer, s.l.post_offset(s.me));
  std::uint64_t want = s.n + 1;
  if (post.load(std::memory_order_acquire) != want) return false;
  if (word(peer, s.l.post_offset(s.me) + 8).load(std::memory_order_relaxed) != s.nbytes) return false;
  return post.compare_exchange_strong(want, want | kClaimed, std::memory_order_acq_rel);
}

/// The header (byte count, number, where the ring took over) into the slot, then arrived.
void announce(const StreamSend& s, std::byte* slot, std::uint64_t ring_from) {
  const SlotHeader h{s.nbytes, s.n, ring_from};
  std::memcpy(slot, &h, sizeof h);
  s.t.signal(s.dst, Layout::arrived_signal(s.me), s.n + 1, 0);
}

}  // namespace

void wait_until(Transport& t, std::size_t slot, std::size_t flag_offset, std::uint64_t target, const WaitPoint& where,
                bool yield) {
  const std::byte* own = t.window();
  auto look = [&] {
    return flag_offset == kNoFlag ? t.read_signal(slot) : word(own, flag_offset).load(std::memory_order_acquire);
  };
  for (int i = 0; i < kSpinLooks + kYieldLooks; ++i) {
    if (look() >= target) return;
    if (yield || i >= kSpinLooks) sched_yield();
    else spi::cpu_relax();
  }
  if (flag_offset == kNoFlag) t.wait_signal(slot, target, where);
  else t.wait_flag(flag_offset, target, where);
}

void copy_message(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes < kDefaultChunkBytes * kRingChunks) std::memcpy(dst, src, bytes);
  else bulk_copy(dst, src, bytes);
}

std::uint64_t stream_send(const StreamSend& s) {
  const std::byte* peer = s.t.peer_window(s.dst);
  const std::size_t cb = s.l.chunk_bytes();
  const std::uint64_t chunks = (s.nbytes + cb - 1) / cb;
  std::byte* slot = writable(peer) + s.l.slot_offset(s.dst, s.me, s.n);
  std::uint64_t ring_from = kNoRing;
  for (std::uint64_t c = 0; c < chunks; ++c) {
    const std::byte* from = s.x + c * cb;
    const std::size_t bytes = std::min(cb, s.nbytes - static_cast<std::size_t>(c) * cb);
    if (ring_from == kNoRing && claim(s, peer)) announce(s, slot, ring_from = c);
    if (ring_from == kNoRing) {
      stream_copy(slot + kHeaderBytes + c * cb, from, bytes);
      continue;
    }
    if (s.ring_sent >= kRingChunks)
      wait_until(s.t, 0, s.l.consumed_offset(s.dst), s.ring_sent - kRingChunks + 1,
                 {"pp send (waiting for the receiver to take a chunk)", s.dst}, s.yield);
    std::memcpy(writable(peer) + s.l.ring_offset(s.dst, s.me, s.ring_sent), from, bytes);
    s.ring_sent += 1;
    word(peer, s.l.produced_offset(s.me)).store(s.ring_sent, std::memory_order_release);
  }
  if (ring_from == kNoRing) announce(s, slot, kNoRing);
  return ring_from;
}

void stream_recv(const StreamRecv& r) {
  const std::byte* own = r.t.window();
  const std::byte* sender = r.t.peer_window(r.src);
  const std::size_t cb = r.l.chunk_bytes();
  const std::uint64_t chunks = (r.nbytes + cb - 1) / cb;
  auto produced = word(own, r.l.produced_offset(r.src));
  auto consumed = word(sender, r.l.consumed_offset(r.me));
  std::uint64_t next_slot = 0, next_ring = r.ring_from;
  auto bytes_of = [&](std::uint64_t c) { return std::min(cb, r.nbytes - static_cast<std::size_t>(c) * cb); };
  while (next_ring < chunks || next_slot < r.ring_from) {
    if (next_ring < chunks && produced.load(std::memory_order_acquire) > r.ring_received) {
      bulk_copy(r.out + next_ring * cb, own + r.l.ring_offset(r.me, r.src, r.ring_received), bytes_of(next_ring));
      r.ring_received += 1;
      consumed.store(r.ring_received, std::memory_order_release);
      next_ring += 1;
    } else if (next_slot < r.ring_from) {  // nothing in the ring yet: the slot's chunks meanwhile
      bulk_copy(r.out + next_slot * cb, r.payload + next_slot * cb, bytes_of(next_slot));
      next_slot += 1;
    } else {
      wait_until(r.t, 0, r.l.produced_offset(r.src), r.ring_received + 1,
                 {"pp recv (waiting for the sender's next chunk)", r.src}, r.yield);
    }
  }
}

void post_receive(Transport& t, const Layout& l, int src, std::uint64_t n, std::size_t nbytes) {
  word(t.window(), l.post_offset(src) + 8).store(nbytes, std::memory_order_relaxed);
  word(t.window(), l.post_offset(src)).store(n + 1, std::memory_order_release);
}

bool withdraw_receive(Transport& t, const Layout& l, int src, std::uint64_t n) {
  std::uint64_t posted = n + 1;
  return word(t.window(), l.post_offset(src)).compare_exchange_strong(posted, 0, std::memory_order_acq_rel);
}

}  // namespace epx::pp
