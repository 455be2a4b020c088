// PPBuffer: per ordered pair, a FIFO of slots in the receiver's window (layout.hpp). A send
// waits for a free slot (the receiver's released count), puts header and payload, then
// publishes the receiver's arrived count by the buffer's completion protocol (PPConfig::
// protocol: a signal after a quiet, a signal ordered after the puts, or the slot header's flag
// word). A receive waits for that, checks the header, copies (or lends the slot) and signals
// the released count back.
// Large messages between mapped ranks may stream through a ring instead (stream.hpp).
#include "epx/pp.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>

#include "epx/spi/channel.hpp"
#include "epx/spi/cpu_relax.hpp"
#include "epx/spi/kind_support.hpp"
#include "layout.hpp"
#include "stream.hpp"

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
  // The pairs' credit channels (epx/spi/channel.hpp; made once the window exists): message
  // numbers sent and received per peer, arrived and released counts.
  std::unique_ptr<spi::CreditChannels> ch;
  std::vector<std::uint64_t> released;  // per source: messages released in order (views may be held out of order)
  std::vector<std::deque<bool>> held;  // per source: messages received, not released in order (true = released)
  std::vector<PPPeerStats> stats;
  // per peer, streaming (stream.hpp): ring chunks produced to it / consumed from it, and
  // the message whose receive post was withdrawn after a timeout (never posted again)
  std::vector<std::uint64_t> ring_sent, ring_received, withdrawn;
  pp::SlotHeader header{};  // the send's header, put from here
  bool yield = false;       // more ranks than this machine's cores: waits yield at once
  bool mapped = false;      // peers' windows are mapped here: direct copies, streaming
  Protocol protocol = Protocol::kTail;  // how messages complete (spi/kind_support.hpp)

  Impl(int P, const PPConfig& c, std::size_t user_bytes)
      : layout(P, c.num_max_tensor_bytes, c.num_max_inflight_tensors, c.links, c.chunk_bytes, user_bytes),
        released(static_cast<std::size_t>(P)), held(static_cast<std::size_t>(P)),
        stats(static_cast<std::size_t>(P)), ring_sent(static_cast<std::size_t>(P)),
        ring_received(static_cast<std::size_t>(P)), withdrawn(static_cast<std::size_t>(P), pp::kNoRing) {}

  /// Whether message bytes between this rank and `peer` may stream (stream.hpp).
  bool streams(int me, int peer, std::size_t nbytes) const noexcept {
    return mapped && peer != me && layout.stream_min_bytes() > 0 && nbytes >= layout.stream_min_bytes();
  }
};

std::size_t PPBuffer::get_buffer_size_hint(int num_ranks, const PPConfig& config, const BufferAllocator& plan) {
  return pp::Layout(num_ranks, config.num_max_tensor_bytes, config.num_max_inflight_tensors, config.links,
                    config.chunk_bytes, plan.total_bytes())
      .window_bytes();
}

PPBuffer::PPBuffer(Transport& transport, const PPConfig& config) : BufferBase(transport, "pp"), config_(config) {
  init(transport, nullptr);
}

PPBuffer::PPBuffer(Transport& transport, const PPConfig& config, const BufferAllocator& plan)
    : BufferBase(transport, "pp"), config_(config), plan_(plan) {
  init(transport, &plan);
}

void PPBuffer::init(Transport&, const BufferAllocator* plan) {
  const PPConfig& config = config_;
  std::string problem = config_problem(config);
  // The protocol asked for (the config's, else EPX_PP_PROTOCOL's), else the table's pick for
  // this transport; refused after the agreement (every rank then refuses alike).
  std::optional<Protocol> asked;
  try {
    asked = spi::asked_protocol(config.protocol, "EPX_PP_PROTOCOL");
  } catch (const Error& e) {
    if (problem.empty()) problem = "pp: " + std::string(e.what());
  }
  const TransportCaps& caps = endpoint("construct").caps();
  const Protocol protocol = asked ? *asked : spi::pick(spi::Kind::kPP, "slots", caps).value_or(Protocol::kExplicit);
  if (problem.empty()) {
    try {
      impl_ = std::make_unique<Impl>(num_ranks(), config, plan_.total_bytes());
      impl_->yield = spi::ranks_outnumber_cpus(num_ranks());
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  std::vector<AgreedValue> values{{"num_max_tensor_bytes", std::to_string(config.num_max_tensor_bytes)},
                                  {"num_max_inflight_tensors", std::to_string(config.num_max_inflight_tensors)},
                                  {"links", links_value(config.links)},
                                  {"chunk_bytes", std::to_string(config.chunk_bytes)},
                                  {"protocol", to_string(protocol)},
                                  {"planned tensors", std::to_string(plan ? plan->tensors().size() : 0)}};
  if (plan)
    for (AgreedValue& v : plan_values(*plan)) values.push_back(std::move(v));
  agree(values, problem);
  if (const std::string refused = spi::refuse_protocol(spi::Kind::kPP, "slots", protocol, caps); !refused.empty())
    throw Error(ErrorCode::kUnsupported, r_of(rank()) + ": pp.create: " + refused, rank());
  impl_->protocol = protocol;
  try {
    allocate(impl_->layout.window_bytes(), impl_->layout.num_signals());
    Transport& t = endpoint("construct");
    impl_->ch = std::make_unique<spi::CreditChannels>(t, impl_->layout.inflight(), pp::Layout::kChannelSignals, impl_->yield,
                                                      protocol);
    impl_->mapped = t.caps().peer_memory_mapped;
    for (int p = 0; p < num_ranks(); ++p) impl_->mapped = impl_->mapped && t.peer_window(p) != nullptr;
    if (protocol == Protocol::kFlag && !impl_->mapped)  // caps said mapped, a window is not
      throw Error(ErrorCode::kUnsupported, r_of(rank()) + ": pp.create: protocol 'flag' needs every peer's window mapped here",
                  rank());
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCapacityExceeded || !config.links.empty()) throw;
    throw Error(e.code(), std::string(e.what()) + " (every rank has slots for every other: pass PPConfig::links, "
                                                  "e.g. pp_ring_links or pp_chain_links, to link only the stages that talk)",
                e.origin_rank());
  }
}

MutableView PPBuffer::tensor(const std::string& name) {
  const PlannedTensor& p = plan_.at(name, r_of(rank()) + ": pp.tensor");
  endpoint("tensor");
  return MutableView{storage() + p.offset, p.dtype, p.shape};
}

std::byte* PPBuffer::storage() noexcept {
  return destroyed() || plan_.total_bytes() == 0 ? nullptr : window() + impl_->layout.user_offset();
}

std::shared_ptr<std::byte> PPBuffer::storage_ref() {
  endpoint("storage");
  if (plan_.total_bytes() == 0)
    throw Error(ErrorCode::kInvalidArgument, r_of(rank()) + ": pp.storage: the buffer was built without a plan", rank());
  return std::shared_ptr<std::byte>(endpoint_ref(), storage());
}

std::size_t PPBuffer::storage_bytes() const noexcept { return destroyed() ? 0 : plan_.total_bytes(); }

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
  endpoint("in_flight");  // a destroyed buffer is refused
  check_peer(impl_->layout, rank(), dst_rank, "pp.in_flight", "dst_rank");
  return impl_->ch->in_flight(dst_rank);
}

void PPBuffer::move_message(Transport& t, const std::byte* x, std::size_t nbytes, int dst_rank, std::uint64_t n) {
  Impl& m = *impl_;
  const int me = rank();
  const auto d = static_cast<std::size_t>(dst_rank);
  if (m.mapped && dst_rank != me) {
    const pp::SlotHeader h = m.streams(me, dst_rank, nbytes)
                                 ? pp::stream_send({t, *m.ch, m.layout, me, dst_rank, n, x, nbytes, m.ring_sent[d], m.yield})
                                 : pp::small_send(t, *m.ch, m.layout, me, dst_rank, n, x, nbytes);
    if (h.direct != 0) m.stats[d].direct += 1;
    else if (h.ring_from != pp::kNoRing) m.stats[d].streamed += 1;
    return;
  }
  const std::size_t off = m.layout.slot_offset(dst_rank, me, n);
  m.header = {nbytes, n, pp::kNoRing, 0};
  if (m.mapped) {  // this rank: plain stores, read back soon from cache
    std::byte* slot = window() + off;
    std::memcpy(slot, &m.header, sizeof m.header);
    if (nbytes > 0) pp::copy_message(slot + pp::kHeaderBytes, x, nbytes);
    m.ch->publish(dst_rank, 0, m.layout.flag_offset(dst_rank, me, n));
    return;
  }
  // Not mapped: explicit or tail (the table refuses flag here); explicit's quiet is publish's.
  t.put(dst_rank, off, &m.header, sizeof m.header, 0);
  if (nbytes > 0) t.put(dst_rank, off + pp::kHeaderBytes, x, nbytes, 0);
  m.ch->publish(dst_rank, 0);
  t.quiet(0);  // x and the header may be reused once send returns
}

void PPBuffer::send(const TensorView& x, int dst_rank) {
  Transport& t = endpoint("send");
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
  const std::uint64_t n = m.ch->next_to(dst_rank);
  const auto M = static_cast<std::uint64_t>(m.layout.inflight());
  PPPeerStats& st = m.stats[d];
  if (!m.ch->slot_free(dst_rank)) {
    const std::uint64_t t0 = now_ns();
    try {
      m.ch->await_slot(dst_rank, "pp send (waiting for a free slot)");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
      throw Error(ErrorCode::kTimeout,
                  r_of(me) + ": pp.send to rank " + std::to_string(dst_rank) + ": message " + std::to_string(n) +
                      " found all " + std::to_string(M) + " slots of the pair full for " +
                      std::to_string(t.timeout().count()) + " ms: rank " + std::to_string(dst_rank) +
                      "'s receives are behind (it released " + std::to_string(n - m.ch->in_flight(dst_rank)) +
                      " of the " + std::to_string(n) + " messages sent to it)",
                  dst_rank);
    }
    st.send_wait_ns += now_ns() - t0;
  }
  move_message(t, static_cast<const std::byte*>(x.data), nbytes, dst_rank, n);  // publishes message n
  st.sent += 1;
  st.bytes_sent += nbytes;
}

namespace {

/// The view token of message `seq` from `src` (never 0).
std::uint64_t token_of(int src, std::uint64_t seq) { return (seq + 1) << 12 | static_cast<std::uint64_t>(src); }

}  // namespace

void PPBuffer::wait_message(Transport& t, int src_rank, std::uint64_t n, std::size_t post_nbytes, std::uint64_t direct) {
  Impl& m = *impl_;
  const auto s = static_cast<std::size_t>(src_rank);
  const std::size_t flag = m.layout.flag_offset(rank(), src_rank, n);
  if (m.ch->arrived(src_rank, flag)) return;
  const bool post = post_nbytes != kAnyBytes && m.withdrawn[s] != n;
  if (post) pp::post_receive(t, m.layout, src_rank, n, post_nbytes, direct);
  const std::uint64_t t0 = now_ns();
  for (;;) {
    try {
      m.ch->await_message(src_rank, "pp recv (waiting for a message)", flag);
      break;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
      if (post && !pp::withdraw_receive(t, m.layout, src_rank, n)) continue;  // claimed: its bytes are coming
      if (post) m.withdrawn[s] = n;
      throw Error(ErrorCode::kTimeout,
                  r_of(rank()) + ": pp.recv from rank " + std::to_string(src_rank) + ": message " + std::to_string(n) +
                      " did not arrive within " + std::to_string(t.timeout().count()) + " ms (rank " +
                      std::to_string(src_rank) + " has sent " +
                      (m.protocol == Protocol::kFlag ? std::to_string(n) + " or fewer"
                                                     : std::to_string(m.ch->arrived_count(src_rank))) +
                      " messages)",
                  src_rank);
    }
  }
  m.stats[s].recv_wait_ns += now_ns() - t0;
}

PPBuffer::Peeked PPBuffer::peek(int src_rank, std::size_t expect_nbytes, const MutableView* into, std::uint64_t direct) {
  Transport& t = endpoint("recv");
  Impl& m = *impl_;
  const int me = rank();
  check_peer(m.layout, me, src_rank, "pp.recv", "src_rank");
  const auto s = static_cast<std::size_t>(src_rank);
  const std::uint64_t n = m.ch->next_from(src_rank);
  const auto M = static_cast<std::uint64_t>(m.layout.inflight());
  if (n - m.released[s] >= M)
    throw Error(ErrorCode::kInvalidArgument,
                r_of(me) + ": pp.recv from rank " + std::to_string(src_rank) + ": all " + std::to_string(M) +
                    " slots of the pair hold views not released yet (messages " + std::to_string(m.released[s]) +
                    ".." + std::to_string(n - 1) + "); release one before receiving message " + std::to_string(n),
                me);
  const bool post = into != nullptr && (direct != 0 || m.streams(me, src_rank, expect_nbytes));
  wait_message(t, src_rank, n, post ? expect_nbytes : kAnyBytes, direct);
  std::byte* base = window() + m.layout.slot_offset(me, src_rank, n);
  pp::SlotHeader h;
  std::memcpy(&h, base, sizeof h);
  if (h.seq != n || (into == nullptr && h.ring_from != pp::kNoRing) || (h.direct != 0 && h.direct != direct))
    throw Error(ErrorCode::kInternal, r_of(me) + ": pp.recv from rank " + std::to_string(src_rank) + ": slot holds message " +
                                          std::to_string(h.seq) + ", expected " + std::to_string(n), me);
  if (expect_nbytes != kAnyBytes && h.nbytes != expect_nbytes) {
    const std::string what = into ? "the receive tensor " + into->shape.str() + " " + to_string(into->dtype)
                                  : std::string("the view asked for");
    throw Error(ErrorCode::kShapeMismatch,
                r_of(me) + ": pp.recv from rank " + std::to_string(src_rank) + ": message " + std::to_string(n) +
                    " has " + std::to_string(h.nbytes) + " bytes, " + what + " has " + std::to_string(expect_nbytes) +
                    " (the message stays first in the FIFO)",
                me);
  }
  Peeked p{PPView{}, h.ring_from, h.direct != 0};
  p.view.data = base + pp::kHeaderBytes;
  p.view.nbytes = static_cast<std::size_t>(h.nbytes);
  p.view.src = src_rank;
  p.view.seq = n;
  p.view.token = token_of(src_rank, n);
  return p;
}

std::uint64_t PPBuffer::planned_offset(const MutableView& out, int src_rank) {
  const Impl& m = *impl_;
  const std::size_t n = out.nbytes();
  if (n == 0 || plan_.total_bytes() == 0 || destroyed()) return 0;
  const auto* begin = static_cast<const std::byte*>(out.data);
  const std::byte* region = storage();
  const std::byte* end = region + plan_.total_bytes();
  if (begin < region || begin >= end) return 0;
  const auto off = static_cast<std::size_t>(begin - region);
  if (n > plan_.total_bytes() - off)
    throw Error(ErrorCode::kInvalidArgument,
                r_of(rank()) + ": pp.recv from rank " + std::to_string(src_rank) + ": the receive tensor (" +
                    std::to_string(n) + " bytes at offset " + std::to_string(off) +
                    " of the planned tensors) ends past the planned tensors' " + std::to_string(plan_.total_bytes()) +
                    " bytes; nothing was received",
                rank());
  if (!m.mapped || src_rank == rank()) return 0;
  return 1 + m.layout.user_offset() + off;
}

void PPBuffer::recv(const MutableView& out, int src_rank) {
  const std::size_t want = out.nbytes();
  if (want > 0 && out.data == nullptr)
    throw Error(ErrorCode::kInvalidArgument, r_of(rank()) + ": pp.recv: the receive tensor has no data", rank());
  require_alive("pp.recv");
  const std::uint64_t direct = planned_offset(out, src_rank);
  Peeked p = peek(src_rank, want, &out, direct);
  take(p.view);
  auto* into = static_cast<std::byte*>(out.data);
  const auto* payload = static_cast<const std::byte*>(p.view.data);
  if (p.direct) {  // the chunks before the sender saw the post are in the slot
    const std::size_t before = std::min(want, static_cast<std::size_t>(p.ring_from) * impl_->layout.chunk_bytes());
    if (before > 0) pp::copy_message(into, payload, before);
  } else if (p.ring_from != pp::kNoRing) {
    pp::stream_recv({endpoint("recv"), impl_->layout, rank(), src_rank, payload, into, want, p.ring_from,
                     impl_->ring_received[static_cast<std::size_t>(src_rank)], impl_->yield});
  } else if (want > 0) {
    pp::copy_message(into, payload, want);
  }
  release(p.view);
}

PPView PPBuffer::recv_view(int src_rank, std::size_t expect_nbytes) {
  PPView v = peek(src_rank, expect_nbytes, nullptr, 0).view;
  v.keep = endpoint_ref();
  take(v);
  return v;
}

void PPBuffer::take(const PPView& v) {
  const auto s = static_cast<std::size_t>(v.src);
  impl_->ch->take(v.src);
  impl_->held[s].push_back(false);
  PPPeerStats& st = impl_->stats[s];
  st.received += 1;
  st.bytes_received += v.nbytes;
}

void PPBuffer::release(PPView& v) {
  endpoint("release");  // a destroyed buffer is refused
  Impl& m = *impl_;
  const int me = rank();
  const int src = v.src;
  const bool ours = v.token != 0 && src >= 0 && src < num_ranks() && m.layout.linked(me, src) &&
                    v.token == token_of(src, v.seq) &&
                    v.data == window() + m.layout.slot_offset(me, src, v.seq) + pp::kHeaderBytes;
  const auto s = static_cast<std::size_t>(ours ? src : 0);
  const bool held = ours && v.seq >= m.released[s] && v.seq < m.ch->next_from(src) &&
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
  if (m.released[s] != before) m.ch->release(src, m.released[s], 0);
  v = PPView{};
}

}  // namespace epx
