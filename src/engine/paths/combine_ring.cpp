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

void combine_through_ring(Impl& m, const HandleState& h, const CombineArgs& a, const Peers& peers, Tensor& out) {
  const RoutingPlan& plan = h.plan;
  const std::int64_t S = plan.shape.num_tokens;
  const std::int64_t C = m.geo.reply_round_tokens();
  const std::size_t H = static_cast<std::size_t>(m.config.hidden);
  const std::size_t row_bytes = H * sizeof(std::uint16_t);
  const bool payload = m.moves_payload;
  const std::uint64_t stamp = m.epoch << 32;
  auto rounds_of = [&](std::int64_t tokens) { return (tokens + C - 1) / C; };
  auto count_of = [&](std::uint64_t v) -> std::int64_t { return v >= stamp ? static_cast<std::int64_t>(v - stamp) : 0; };
  if (h.layout == RecvLayout::kExpanded) m.reply_stage.resize(static_cast<std::size_t>(m.W * Impl::kReplyStageRows) * H);
  const auto* replies_base = reinterpret_cast<const std::uint16_t*>(m.transport.window() + m.geo.region(Region::kReplies));

  // Expert side, per source s: rounds sent, and the next of my received rows from s.
  struct Source {
    int peer;
    std::int64_t rounds, sent, next_row;
  };
  std::vector<Source> sources;
  std::vector<std::uint64_t> channel_bytes(static_cast<std::size_t>(m.P));
  for (int s : m.reply_order) {
    const auto us = static_cast<std::size_t>(s);
    sources.push_back({s, rounds_of(peers.header[us]->tokens), 0, h.recv_begin[us]});
    channel_bytes[us] = static_cast<std::uint64_t>(h.recv_begin[us + 1] - h.recv_begin[us]) * row_bytes;
  }
  // Source side: my rounds reduced, and per expert m.rank d the segment position of the
  // first token of the round being reduced.
  const std::int64_t my_rounds = rounds_of(S);
  std::int64_t reduced = 0;
  std::vector<std::int64_t> round_start(static_cast<std::size_t>(m.P), 0);
  std::vector<const std::uint16_t*> rows_of(static_cast<std::size_t>(m.P));
  std::vector<std::int64_t> first_row(static_cast<std::size_t>(m.P));

  Impl::PhaseTimer timer(m, 0, Phase::kPutIssue);
  Impl::Sender send(m, 0, 0, channel_bytes, m.reply_order);
  Impl::Replies replies(m, h, a, 0);
  auto send_round = [&](Source& src) {
    const auto us = static_cast<std::size_t>(src.peer);
    const std::int64_t end_token = (src.sent + 1) * C, end = h.recv_begin[us + 1];
    std::int64_t r = src.next_row;
    const std::int64_t first = r;
    while (r < end && h.recv_token[static_cast<std::size_t>(r)] < end_token) ++r;
    const std::int64_t dst = m.geo.reply_ring_row(src.sent, m.rank);
    if (h.layout == RecvLayout::kCompact)
      send.put_rows(src.peer, Region::kReplies, dst, replies.of(first), r - first, row_bytes);
    else
      for (std::int64_t i = first; i < r; ++i) send.put_rows(src.peer, Region::kReplies, dst + (i - first), replies.of(i), 1, row_bytes);
    src.next_row = r;
    ++src.sent;
    send.signal(src.peer, m.geo.ring_tail_signal(m.rank), stamp + static_cast<std::uint64_t>(src.sent));
  };
  auto reduce_round = [&]() {
    const std::int64_t t0 = reduced * C, t1 = std::min(S, t0 + C);
    for (int d = 0; d < m.P; ++d) {
      const auto ud = static_cast<std::size_t>(d);
      // My segment at d is token-ascending: the round's rows start where the last one ended.
      const std::int32_t* seg = plan.segment_token.data() + plan.segment_begin[ud];
      std::int64_t p = round_start[ud];
      rows_of[ud] = replies_base + static_cast<std::size_t>(m.geo.reply_ring_row(reduced, d)) * H;
      first_row[ud] = -p;
      while (p < plan.tokens_to(d) && seg[p] < t1) ++p;
      round_start[ud] = p;
    }
    if (payload)
      m.run_workers([&](int w) {
        const auto [u0, u1] = split_range(t1 - t0, w, m.W);
        m.reduce_tokens(h, a, t0 + u0, t0 + u1, rows_of, first_row, out.as<std::uint16_t>(), nullptr);
      });
    ++reduced;
    for (int i = 0; i < m.P; ++i) m.transport.signal((m.rank + i) % m.P, m.geo.ring_credit_signal(m.rank), stamp + static_cast<std::uint64_t>(reduced), 0);
  };

  auto pass = [&] {
    Progress p;
    for (Source& src : sources) {
      if (src.sent == src.rounds) continue;
      p.pending = true;
      // Half sent % 2 is free once the source has reduced round sent - 2.
      if (src.sent >= 2 && count_of(m.transport.read_signal(m.geo.ring_credit_signal(src.peer))) < src.sent - 1) continue;
      send_round(src);
      p.moved = true;
    }
    if (reduced < my_rounds) {
      p.pending = true;
      bool all = true;
      for (int d = 0; d < m.P && all; ++d) all = count_of(m.transport.read_signal(m.geo.ring_tail_signal(d))) > reduced;
      if (all) {
        reduce_round();
        p.moved = true;
      }
    }
    return p;
  };
  auto waiting = [&] {
    std::string what;
    for (const Source& src : sources)
      if (src.sent < src.rounds) what += " credit from rank " + std::to_string(src.peer);
    for (int d = 0; d < m.P && reduced < my_rounds; ++d)
      if (count_of(m.transport.read_signal(m.geo.ring_tail_signal(d))) <= reduced) what += " replies from rank " + std::to_string(d);
    return what;
  };
  progress_until_done(m.transport.timeout(), m.rank, "combine ring", sources.empty() ? -1 : sources.front().peer, pass, waiting);
  send.flush();
}

class Ring final : public CombinePath {
 public:
  void send(Impl& m, const CombineStep& s) const override { combine_through_ring(m, *s.h, *s.a, *s.peers, *s.out); }
  void receive(Impl&, const CombineStep&) const override {}  // send reduced every round
};

}  // namespace

const CombinePath& ring_combine() {
  static const Ring unit;
  return unit;
}

}  // namespace epx::detail
