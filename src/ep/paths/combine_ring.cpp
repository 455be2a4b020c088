// Combine, ring path (spi::Path::kRing: the bounded reply area, ring_rows > 0). A source's
// tokens come back in rounds of C = max(1, ring_rows / 2) tokens. The reply area holds two
// rounds (while the source reduces one, the experts fill the other), each with C rows per
// expert rank: 2·P·C rows, the same as the dispatch rings' P·ring_rows. Round i of source s
// lives in half i % 2. An expert rank puts its rows for round i of s once s has reduced
// round i - 2 (s's credit), then signals the round; s reduces round i once every rank
// signalled it and hands the half back. Rounds per source: ceil(S_s / C), S_s from its
// combine header. Signals reuse the ring slots: tails from the experts, credits from the
// sources, values epoch << 32 | rounds (monotonic across calls, like the dispatch ring's
// counts). Both sides run in one loop on the rank thread (send); receive has nothing left.
#include <algorithm>

#include "../path.hpp"
#include "ring_progress.hpp"

namespace epx::detail {
namespace {

// An expert rank's view of one source: its rounds, those sent, and the next of my received
// rows from it.
struct Source {
  int peer;
  std::int64_t rounds, sent, next_row;
};

// One ring combine on the rank thread: the expert side (rounds of replies to every source
// its credit allows) and the source side (each round reduced once every rank signalled it).
class RingCombine {
 public:
  RingCombine(PathContext& m, const HandleState& h, const CombineArgs& a, const Peers& peers, Tensor& out)
      : m_(m), h_(h), a_(a), out_(out), S_(h.plan.shape.num_tokens), C_(m.setup.geo.reply_round_tokens()),
        H_(static_cast<std::size_t>(m.setup.config.hidden)), row_bytes_(H_ * sizeof(std::uint16_t)), stamp_(m.call.epoch << 32),
        my_rounds_(rounds_of(S_)), round_start_(static_cast<std::size_t>(m.setup.P), 0), rows_of_(static_cast<std::size_t>(m.setup.P)),
        first_row_(static_cast<std::size_t>(m.setup.P)), timer_(m.timer(0, Phase::kPutIssue)),
        send_(m.sender(0, 0, channel_bytes(), m.setup.reply_order)), replies_(m.replies(h, a, (reserve_stage(m, h), 0))) {
    for (int s : m.setup.reply_order)
      sources_.push_back({s, rounds_of(peers.header[static_cast<std::size_t>(s)]->tokens), 0,
                          h.recv_begin[static_cast<std::size_t>(s)]});
  }

  void run() {
    progress_until_done(m_.setup.transport.timeout(), m_.setup.rank, "combine ring", sources_.empty() ? -1 : sources_.front().peer,
                        [this] { return pass(); }, [this] { return waiting(); });
    send_.flush();
  }

 private:
  std::int64_t rounds_of(std::int64_t tokens) const { return (tokens + C_ - 1) / C_; }
  std::int64_t count_of(std::uint64_t v) const { return v >= stamp_ ? static_cast<std::int64_t>(v - stamp_) : 0; }
  std::int64_t tail_of(int d) { return count_of(m_.setup.transport.read_signal(m_.setup.geo.ring_tail_signal(d))); }

  // Expanded replies are partial sums built in reply_stage, which Replies finds at its construction.
  static void reserve_stage(PathContext& m, const HandleState& h) {
    if (h.layout == RecvLayout::kExpanded)
      m.call.reply_stage.resize(static_cast<std::size_t>(m.setup.W * Impl::kReplyStageRows) * static_cast<std::size_t>(m.setup.config.hidden));
  }

  // Bytes of replies to each source (decides the Sender's queues).
  std::vector<std::uint64_t> channel_bytes() const {
    std::vector<std::uint64_t> bytes(static_cast<std::size_t>(m_.setup.P));
    for (int s : m_.setup.reply_order) {
      const auto us = static_cast<std::size_t>(s);
      bytes[us] = static_cast<std::uint64_t>(h_.recv_begin[us + 1] - h_.recv_begin[us]) * row_bytes_;
    }
    return bytes;
  }

  // Expert side: my replies to the next round of src's tokens, into that round's half, then its tail.
  void send_round(Source& src) {
    const auto us = static_cast<std::size_t>(src.peer);
    const std::int64_t end_token = (src.sent + 1) * C_, end = h_.recv_begin[us + 1];
    const std::int64_t first = src.next_row;
    std::int64_t r = first;
    while (r < end && h_.recv_token[static_cast<std::size_t>(r)] < end_token) ++r;
    const std::int64_t dst = m_.setup.geo.reply_ring_row(src.sent, m_.setup.rank);
    if (h_.layout == RecvLayout::kCompact)
      send_.put_rows(src.peer, Region::kReplies, dst, replies_.of(first), r - first, row_bytes_);
    else
      for (std::int64_t i = first; i < r; ++i) send_.put_rows(src.peer, Region::kReplies, dst + (i - first), replies_.of(i), 1, row_bytes_);
    src.next_row = r;
    ++src.sent;
    send_.signal(src.peer, m_.setup.geo.ring_tail_signal(m_.setup.rank), stamp_ + static_cast<std::uint64_t>(src.sent));
  }

  // Source side: the round's rows at every expert rank d (my segment at d is token-ascending:
  // the round's rows start where the last one ended), reduced, then the half handed back.
  void reduce_round() {
    const std::int64_t t0 = reduced_ * C_, t1 = std::min(S_, t0 + C_);
    const RoutingPlan& plan = h_.plan;
    const auto* replies_base = reinterpret_cast<const std::uint16_t*>(m_.setup.transport.window() + m_.setup.geo.region(Region::kReplies));
    for (int d = 0; d < m_.setup.P; ++d) {
      const auto ud = static_cast<std::size_t>(d);
      const std::int32_t* seg = plan.segment_token.data() + plan.segment_begin[ud];
      std::int64_t p = round_start_[ud];
      rows_of_[ud] = replies_base + static_cast<std::size_t>(m_.setup.geo.reply_ring_row(reduced_, d)) * H_;
      first_row_[ud] = -p;
      while (p < plan.tokens_to(d) && seg[p] < t1) ++p;
      round_start_[ud] = p;
    }
    m_.setup.payload.values([&] {
      m_.run_workers([&](int w) {
        const auto [u0, u1] = split_range(t1 - t0, w, m_.setup.W);
        m_.reduce_tokens(h_, a_, t0 + u0, t0 + u1, rows_of_, first_row_, out_.as<std::uint16_t>(), nullptr);
      });
    });
    ++reduced_;
    for (int i = 0; i < m_.setup.P; ++i)
      m_.setup.transport.signal((m_.setup.rank + i) % m_.setup.P, m_.setup.geo.ring_credit_signal(m_.setup.rank), stamp_ + static_cast<std::uint64_t>(reduced_), 0);
  }

  Progress pass() {
    Progress p;
    for (Source& src : sources_) {
      if (src.sent == src.rounds) continue;
      p.pending = true;
      // Half sent % 2 is free once the source has reduced round sent - 2.
      if (src.sent >= 2 && count_of(m_.setup.transport.read_signal(m_.setup.geo.ring_credit_signal(src.peer))) < src.sent - 1) continue;
      send_round(src);
      p.moved = true;
    }
    if (reduced_ < my_rounds_) {
      p.pending = true;
      bool all = true;
      for (int d = 0; d < m_.setup.P && all; ++d) all = tail_of(d) > reduced_;
      if (all) {
        reduce_round();
        p.moved = true;
      }
    }
    return p;
  }

  std::string waiting() {
    std::string what;
    for (const Source& src : sources_)
      if (src.sent < src.rounds) what += " credit from rank " + std::to_string(src.peer);
    for (int d = 0; d < m_.setup.P && reduced_ < my_rounds_; ++d)
      if (tail_of(d) <= reduced_) what += " replies from rank " + std::to_string(d);
    return what;
  }

  PathContext& m_;
  const HandleState& h_;
  const CombineArgs& a_;
  Tensor& out_;
  const std::int64_t S_, C_;
  const std::size_t H_, row_bytes_;
  const std::uint64_t stamp_;
  std::vector<Source> sources_;
  // Source side: my rounds reduced, and per expert rank d the segment position of the first
  // token of the round being reduced.
  const std::int64_t my_rounds_;
  std::int64_t reduced_ = 0;
  std::vector<std::int64_t> round_start_;
  std::vector<const std::uint16_t*> rows_of_;
  std::vector<std::int64_t> first_row_;
  Impl::PhaseTimer timer_;
  Impl::Sender send_;
  Impl::Replies replies_;
};

void combine_through_ring(PathContext& m, const HandleState& h, const CombineArgs& a, const Peers& peers, Tensor& out) {
  RingCombine(m, h, a, peers, out).run();
}

class Ring final : public CombinePath {
 public:
  void send(PathContext m, const CombineStep& s) const override { combine_through_ring(m, *s.h, *s.a, *s.peers, *s.out); }
  void receive(PathContext, const CombineStep&) const override {}  // send reduced every round
};

}  // namespace

const CombinePath& ring_combine() {
  static const Ring unit;
  return unit;
}

}  // namespace epx::detail
