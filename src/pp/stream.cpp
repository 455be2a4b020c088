#include "stream.hpp"

#include <algorithm>
#include <cstring>

#include "epx/spi/copy.hpp"
#include "epx/spi/wait.hpp"

namespace epx::pp {

namespace {

/// The top bit of a post's first word: the sender claimed it.
constexpr std::uint64_t kClaimed = std::uint64_t{1} << 63;

std::atomic_ref<std::uint64_t> word(const std::byte* base, std::size_t offset) {
  // A mapped peer's window is a writable mapping (the transport's puts are stores through it).
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(base) + offset));
}

std::byte* writable(const std::byte* p) { return const_cast<std::byte*>(p); }

/// A claimed post: whether the sender claimed it, and its planned tensor (0: none).
struct Claim {
  bool claimed = false;
  std::uint64_t direct = 0;
};

/// Sets the post's claimed bit when it is the receive of message n with its byte count.
Claim claim(const Layout& l, const std::byte* peer, int me, std::uint64_t n, std::size_t nbytes) {
  auto post = word(peer, l.post_offset(me));
  std::uint64_t want = n + 1;
  if (post.load(std::memory_order_acquire) != want) return {};
  if (word(peer, l.post_offset(me) + 8).load(std::memory_order_relaxed) != nbytes) return {};
  const std::uint64_t direct = word(peer, l.post_offset(me) + 16).load(std::memory_order_relaxed);
  // The receiver writes words 1 and 2 before word 0 (release) and never posts message n again
  // once it withdrew it, so the CAS succeeding means the words read belong to this post.
  if (!post.compare_exchange_strong(want, want | kClaimed, std::memory_order_acq_rel)) return {};
  return {true, direct};
}

/// The header into the slot, then arrived (ordered after every earlier store): the credit
/// channel's publish of message h.seq (under flag: into the slot's flag word, `flag`).
void announce(spi::CreditChannels& ch, int dst, std::byte* slot, const SlotHeader& h, std::size_t flag) {
  std::memcpy(slot, &h, sizeof h);
  ch.publish(dst, 0, flag);
}

}  // namespace

void copy_message(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes < kDefaultChunkBytes * kRingChunks) std::memcpy(dst, src, bytes);
  else bulk_copy(dst, src, bytes);
}

SlotHeader stream_send(const StreamSend& s) {
  const std::byte* peer = s.t.peer_window(s.dst);
  const std::size_t cb = s.l.chunk_bytes();
  const std::uint64_t chunks = (s.nbytes + cb - 1) / cb;
  std::byte* slot = writable(peer) + s.l.slot_offset(s.dst, s.me, s.n);
  SlotHeader h{s.nbytes, s.n, kNoRing, 0};
  for (std::uint64_t c = 0; c < chunks; ++c) {
    const std::byte* from = s.x + c * cb;
    const std::size_t bytes = std::min(cb, s.nbytes - static_cast<std::size_t>(c) * cb);
    if (h.ring_from == kNoRing) {
      if (const Claim k = claim(s.l, peer, s.me, s.n, s.nbytes); k.claimed) {
        h.ring_from = c;
        if (k.direct != 0) {  // every later byte straight into the planned tensor, then the header
          const std::size_t done = static_cast<std::size_t>(c) * cb;
          stream_copy(writable(peer) + (k.direct - 1) + done, s.x + done, s.nbytes - done);
          h.direct = k.direct;
          break;
        }
        announce(s.ch, s.dst, slot, h, s.l.flag_offset(s.dst, s.me, s.n));
      }
    }
    if (h.ring_from == kNoRing) {
      stream_copy(slot + kHeaderBytes + c * cb, from, bytes);
      continue;
    }
    if (s.ring_sent >= kRingChunks)
      spi::await_flag(s.t, s.l.consumed_offset(s.dst), s.ring_sent - kRingChunks + 1,
                      {"pp send (waiting for the receiver to take a chunk)", s.dst}, s.yield);
    std::memcpy(writable(peer) + s.l.ring_offset(s.dst, s.me, s.ring_sent), from, bytes);
    s.ring_sent += 1;
    word(peer, s.l.produced_offset(s.me)).store(s.ring_sent, std::memory_order_release);
  }
  if (h.ring_from == kNoRing || h.direct != 0) announce(s.ch, s.dst, slot, h, s.l.flag_offset(s.dst, s.me, s.n));
  return h;
}

SlotHeader small_send(Transport& t, spi::CreditChannels& ch, const Layout& l, int me, int dst, std::uint64_t n,
                      const std::byte* x, std::size_t nbytes) {
  std::byte* peer = writable(t.peer_window(dst));
  std::byte* slot = peer + l.slot_offset(dst, me, n);
  SlotHeader h{nbytes, n, kNoRing, 0};
  if (const Claim k = nbytes > 0 ? claim(l, peer, me, n, nbytes) : Claim{}; k.direct != 0) {
    h.ring_from = 0;
    h.direct = k.direct;
    copy_message(peer + (k.direct - 1), x, nbytes);
  } else {  // unclaimed, or claimed for a receive that is not planned: the slot (plain stores)
    if (nbytes > 0) copy_message(slot + kHeaderBytes, x, nbytes);
  }
  announce(ch, dst, slot, h, l.flag_offset(dst, me, n));
  return h;
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
      spi::await_flag(r.t, r.l.produced_offset(r.src), r.ring_received + 1,
                      {"pp recv (waiting for the sender's next chunk)", r.src}, r.yield);
    }
  }
}

void post_receive(Transport& t, const Layout& l, int src, std::uint64_t n, std::size_t nbytes, std::uint64_t direct) {
  word(t.window(), l.post_offset(src) + 8).store(nbytes, std::memory_order_relaxed);
  word(t.window(), l.post_offset(src) + 16).store(direct, std::memory_order_relaxed);
  word(t.window(), l.post_offset(src)).store(n + 1, std::memory_order_release);
}

bool withdraw_receive(Transport& t, const Layout& l, int src, std::uint64_t n) {
  std::uint64_t posted = n + 1;
  return word(t.window(), l.post_offset(src)).compare_exchange_strong(posted, 0, std::memory_order_acq_rel);
}

}  // namespace epx::pp
