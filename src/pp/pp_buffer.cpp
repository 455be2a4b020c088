// PPBuffer: per ordered pair, a FIFO of slots in the receiver's window (layout.hpp). A send
// waits for a free slot (the receiver's released count), puts header and payload, then
// signals the receiver's arrived count (ordered after the puts). A receive waits for that
// count, checks the header, copies (or lends the slot) and signals the released count back.
#include "epx/pp.hpp"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>

#include "epx/spi/copy.hpp"
#include "layout.hpp"

namespace epx {

namespace {

std::string r_of(int r) { return "rank " + std::to_string(r); }

std::string links_value(const std::vector<std::pair<int, int>>& links) {
  if (links.empty()) return "all";
  std::string s;
  for (const auto& [a, b] : links) s += "{" + std::to_string(a) + "," + std::to_string(b) + "}";
  return s;
}

std::string config_problem(const PPConfig& c) {
  if (c.num_max_tensor_bytes == 0) return "pp: num_max_tensor_bytes must be at least 1";
  if (c.num_max_inflight_tensors < 1 || c.num_max_inflight_tensors > kMaxPPInflight)
    return "pp: num_max_inflight_tensors = " + std::to_string(c.num_max_inflight_tensors) + ", expected 1.." +
           std::to_string(kMaxPPInflight);
  return "";
}

/// Looks at this rank's `slot` before the transport's own wait (which spins longer, then
/// yields, and owns the timeout and the peer-failure checks): kSpinLooks looks a pause apart
/// (the peer is running and about to signal), then kYieldLooks looks with the core yielded
/// between them (the peer may need this very core: ranks outnumber cores, or the scheduler
/// has not spread them yet). With more ranks than cores every look yields.
constexpr int kSpinLooks = 64;
constexpr int kYieldLooks = 512;

void wait_for(Transport& t, std::size_t slot, std::uint64_t target, const WaitPoint& where, bool oversubscribed) {
  for (int i = 0; i < kSpinLooks + kYieldLooks; ++i) {
    if (t.read_signal(slot) >= target) return;
    if (oversubscribed || i >= kSpinLooks) sched_yield();
    else _mm_pause();
  }
  t.wait_signal(slot, target, where);
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace

std::vector<std::pair<int, int>> pp_ring_links(int num_ranks) {
  std::vector<std::pair<int, int>> l;
  for (int r = 0; r < num_ranks; ++r) l.emplace_back(r, (r + 1) % num_ranks);
  return l;
}

std::vector<std::pair<int, int>> pp_chain_links(int num_ranks, int stages) {
  if (stages < 1 || num_ranks % stages != 0)
    throw Error(ErrorCode::kInvalidArgument, "pp_chain_links: " + std::to_string(num_ranks) +
                                                 " ranks do not split into pipelines of " + std::to_string(stages));
  std::vector<std::pair<int, int>> l;
  for (int r = 0; r < num_ranks; ++r)
    if ((r + 1) % stages != 0) l.emplace_back(r, r + 1);
  if (stages == 1)
    for (int r = 0; r < num_ranks; ++r) l.emplace_back(r, r);
  return l;
}

struct PPBuffer::Impl {
  pp::Layout layout;
  std::vector<std::uint64_t> sent, received, released;  // per peer
  std::vector<std::deque<bool>> held;  // per source: messages received, not released in order (true = released)
  std::vector<PPPeerStats> stats;
  pp::SlotHeader header{};  // the send's header, put from here
  bool yield = false;       // more ranks than this machine's cores: waits yield at once

  Impl(int P, const PPConfig& c)
      : layout(P, c.num_max_tensor_bytes, c.num_max_inflight_tensors, c.links),
        sent(static_cast<std::size_t>(P)), received(static_cast<std::size_t>(P)),
        released(static_cast<std::size_t>(P)), held(static_cast<std::size_t>(P)),
        stats(static_cast<std::size_t>(P)) {}
};

std::size_t PPBuffer::get_buffer_size_hint(int num_ranks, const PPConfig& config) {
  return pp::Layout(num_ranks, config.num_max_tensor_bytes, config.num_max_inflight_tensors, config.links).window_bytes();
}

PPBuffer::PPBuffer(Transport& transport, const PPConfig& config) : BufferBase(transport, "pp"), config_(config) {
  std::string problem = config_problem(config);
  if (problem.empty()) {
    try {
      impl_ = std::make_unique<Impl>(num_ranks(), config);
      impl_->yield = static_cast<unsigned>(num_ranks()) > std::max(1u, std::thread::hardware_concurrency());
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  agree({{"num_max_tensor_bytes", std::to_string(config.num_max_tensor_bytes)},
         {"num_max_inflight_tensors", std::to_string(config.num_max_inflight_tensors)},
         {"links", links_value(config.links)}},
        problem);
  try {
    allocate(impl_->layout.window_bytes(), impl_->layout.num_signals());
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCapacityExceeded || !config.links.empty()) throw;
    throw Error(e.code(), std::string(e.what()) + " (every rank has slots for every other: pass PPConfig::links, "
                                                  "e.g. pp_ring_links or pp_chain_links, to link only the stages that talk)",
                e.origin_rank());
  }
}

PPBuffer::~PPBuffer() = default;

const PPPeerStats& PPBuffer::stats(int peer) const {
  if (peer < 0 || peer >= num_ranks())
    throw Error(ErrorCode::kInvalidArgument, r_of(rank()) + ": pp.stats: rank " + std::to_string(peer) +
                                                 " is outside 0.." + std::to_string(num_ranks() - 1), rank());
  return impl_->stats[static_cast<std::size_t>(peer)];
}

namespace {

void check_peer(const pp::Layout& l, int me, int peer, const char* call, const char* role) {
  if (peer < 0 || peer >= l.num_ranks())
    throw Error(ErrorCode::kInvalidArgument, r_of(me) + ": " + call + ": " + role + " " + std::to_string(peer) +
                                                 " is outside 0.." + std::to_string(l.num_ranks() - 1), me);
  if (!l.linked(me, peer))
    throw Error(ErrorCode::kInvalidArgument, r_of(me) + ": " + call + ": rank " + std::to_string(peer) +
                                                 " is not linked to this rank (PPConfig::links)", me);
}

}  // namespace

std::uint64_t PPBuffer::in_flight(int dst_rank) {
  Transport& t = endpoint("pp.in_flight");
  check_peer(impl_->layout, rank(), dst_rank, "pp.in_flight", "dst_rank");
  const auto d = static_cast<std::size_t>(dst_rank);
  return impl_->sent[d] - t.read_signal(impl_->layout.released_signal(dst_rank));
}

void PPBuffer::send(const TensorView& x, int dst_rank) {
  Transport& t = endpoint("pp.send");
  Impl& m = *impl_;
  const int me = rank();
  check_peer(m.layout, me, dst_rank, "pp.send", "dst_rank");
  const std::size_t nbytes = static_cast<std::size_t>(x.shape.numel()) * dtype_size(x.dtype);
  if (nbytes > config_.num_max_tensor_bytes)
    throw Error(ErrorCode::kCapacityExceeded, r_of(me) + ": pp.send to rank " + std::to_string(dst_rank) + ": " +
                                                  std::to_string(nbytes) + " bytes, the slots hold at most " +
                                                  std::to_string(config_.num_max_tensor_bytes) +
                                                  " (num_max_tensor_bytes); nothing was sent", me);
  if (nbytes > 0 && x.data == nullptr)
    throw Error(ErrorCode::kInvalidArgument, r_of(me) + ": pp.send: x has no data", me);
  const auto d = static_cast<std::size_t>(dst_rank);
  const std::uint64_t n = m.sent[d];
  const auto M = static_cast<std::uint64_t>(m.layout.inflight());
  PPPeerStats& st = m.stats[d];
  if (n >= M) {
    const std::size_t slot = m.layout.released_signal(dst_rank);
    if (t.read_signal(slot) < n - M + 1) {
      const std::uint64_t t0 = now_ns();
      try {
        wait_for(t, slot, n - M + 1, {"pp send (waiting for a free slot)", dst_rank}, impl_->yield);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kTimeout) throw;
        throw Error(ErrorCode::kTimeout,
                    r_of(me) + ": pp.send to rank " + std::to_string(dst_rank) + ": message " + std::to_string(n) +
                        " found all " + std::to_string(M) + " slots of the pair full for " +
                        std::to_string(t.timeout().count()) + " ms: rank " + std::to_string(dst_rank) +
                        "'s receives are behind (it released " + std::to_string(t.read_signal(slot)) + " of the " +
                        std::to_string(n) + " messages sent to it)",
                    dst_rank);
      }
      st.send_wait_ns += now_ns() - t0;
    }
  }
  const std::size_t off = m.layout.slot_offset(dst_rank, me, n);
  m.header = {nbytes, n};
  t.put(dst_rank, off, &m.header, sizeof m.header, 0);
  if (nbytes > 0) t.put(dst_rank, off + pp::kHeaderBytes, x.data, nbytes, 0);
  const TransportCaps& caps = t.caps();
  if (!caps.ordered_signal_per_queue && !caps.put_completes_on_return) t.quiet(0);
  t.signal(dst_rank, pp::Layout::arrived_signal(me), n + 1, 0);
  t.quiet(0);  // x and the header may be reused once send returns
  m.sent[d] = n + 1;
  st.sent += 1;
  st.bytes_sent += nbytes;
}

namespace {

/// The view token of message `seq` from `src` (never 0).
std::uint64_t token_of(int src, std::uint64_t seq) { return (seq + 1) << 12 | static_cast<std::uint64_t>(src); }

}  // namespace

PPView PPBuffer::peek(int src_rank, std::size_t expect_nbytes, const char* what) {
  Transport& t = endpoint("pp.recv");
  Impl& m = *impl_;
  const int me = rank();
  check_peer(m.layout, me, src_rank, "pp.recv", "src_rank");
  const auto s = static_cast<std::size_t>(src_rank);
  const std::uint64_t n = m.received[s];
  const auto M = static_cast<std::uint64_t>(m.layout.inflight());
  if (n - m.released[s] >= M)
    throw Error(ErrorCode::kInvalidArgument,
                r_of(me) + ": pp.recv from rank " + std::to_string(src_rank) + ": all " + std::to_string(M) +
                    " slots of the pair hold views not released yet (messages " + std::to_string(m.released[s]) +
                    ".." + std::to_string(n - 1) + "); release one before receiving message " + std::to_string(n),
                me);
  const std::size_t slot = pp::Layout::arrived_signal(src_rank);
  if (t.read_signal(slot) < n + 1) {
    const std::uint64_t t0 = now_ns();
    try {
      wait_for(t, slot, n + 1, {"pp recv (waiting for a message)", src_rank}, impl_->yield);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
      throw Error(ErrorCode::kTimeout,
                  r_of(me) + ": pp.recv from rank " + std::to_string(src_rank) + ": message " + std::to_string(n) +
                      " did not arrive within " + std::to_string(t.timeout().count()) + " ms (rank " +
                      std::to_string(src_rank) + " has sent " + std::to_string(t.read_signal(slot)) + " messages)",
                  src_rank);
    }
    m.stats[s].recv_wait_ns += now_ns() - t0;
  }
  std::byte* base = window() + m.layout.slot_offset(me, src_rank, n);
  pp::SlotHeader h;
  std::memcpy(&h, base, sizeof h);
  if (h.seq != n)
    throw Error(ErrorCode::kInternal, r_of(me) + ": pp.recv from rank " + std::to_string(src_rank) + ": slot holds message " +
                                          std::to_string(h.seq) + ", expected " + std::to_string(n), me);
  if (expect_nbytes != kAnyBytes && h.nbytes != expect_nbytes)
    throw Error(ErrorCode::kShapeMismatch,
                r_of(me) + ": pp.recv from rank " + std::to_string(src_rank) + ": message " + std::to_string(n) +
                    " has " + std::to_string(h.nbytes) + " bytes, " + what + " has " + std::to_string(expect_nbytes) +
                    " (the message stays first in the FIFO)",
                me);
  PPView v;
  v.data = base + pp::kHeaderBytes;
  v.nbytes = static_cast<std::size_t>(h.nbytes);
  v.src = src_rank;
  v.seq = n;
  v.token = token_of(src_rank, n);
  v.keep = endpoint_ref();
  return v;
}

void PPBuffer::recv(const MutableView& out, int src_rank) {
  const std::size_t want = out.nbytes();
  if (want > 0 && out.data == nullptr)
    throw Error(ErrorCode::kInvalidArgument, r_of(rank()) + ": pp.recv: the receive tensor has no data", rank());
  const std::string what = "the receive tensor " + out.shape.str() + " " + to_string(out.dtype);
  PPView v = peek(src_rank, want, what.c_str());
  take(v);
  if (want > 0) bulk_copy(out.data, v.data, want);
  release(v);
}

PPView PPBuffer::recv_view(int src_rank, std::size_t expect_nbytes) {
  PPView v = peek(src_rank, expect_nbytes, "the view asked for");
  take(v);
  return v;
}

void PPBuffer::take(const PPView& v) {
  const auto s = static_cast<std::size_t>(v.src);
  impl_->received[s] += 1;
  impl_->held[s].push_back(false);
  PPPeerStats& st = impl_->stats[s];
  st.received += 1;
  st.bytes_received += v.nbytes;
}

void PPBuffer::release(PPView& v) {
  Transport& t = endpoint("pp.release");
  Impl& m = *impl_;
  const int me = rank();
  const int src = v.src;
  const bool ours = v.token != 0 && src >= 0 && src < num_ranks() && m.layout.linked(me, src) &&
                    v.token == token_of(src, v.seq) &&
                    v.data == window() + m.layout.slot_offset(me, src, v.seq) + pp::kHeaderBytes;
  const auto s = static_cast<std::size_t>(ours ? src : 0);
  const bool held = ours && v.seq >= m.released[s] && v.seq < m.received[s] &&
                    !m.held[s][static_cast<std::size_t>(v.seq - m.released[s])];
  if (!held)
    throw Error(ErrorCode::kBadHandle, r_of(me) + ": pp.release: the view (rank " + std::to_string(src) + ", message " +
                                           std::to_string(v.seq) + ") is not a held view of this buffer (released "
                                           "already, or from another buffer)", me);
  m.held[s][static_cast<std::size_t>(v.seq - m.released[s])] = true;
  const std::uint64_t before = m.released[s];
  while (!m.held[s].empty() && m.held[s].front()) {
    m.held[s].pop_front();
    m.released[s] += 1;
  }
  if (m.released[s] != before) t.signal(src, m.layout.released_signal(me), m.released[s], 0);
  v = PPView{};
}

}  // namespace epx
