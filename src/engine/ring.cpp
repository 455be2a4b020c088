// The bounded receive area (BufferConfig::ring_rows > 0): instead of a slot for every row
// it may receive (up to P x C rows), a rank keeps a ring of ring_rows rows per source.
// Senders fill it a chunk at a time and publish a cumulative count (the ring's tail);
// the receiver places each arrived row in the output and hands the slots back with a
// cumulative credit. A sender never writes row i before the credit reaches
// i - ring_rows + 1, so unconsumed rows are never overwritten. Both sides run in the same
// loop on every worker (each owns some destinations and some sources), which is what
// keeps two ranks filling each other's rings from waiting on each other.
//
// Counts carry the call's epoch in their high 32 bits, so a value left from an earlier
// call reads as "nothing yet" and the slots need no reset. Row metadata and FP8 scales
// (a few percent of a row) still go to their full-size regions at the planned slots.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine.hpp"
#include "epx/spi/copy.hpp"

namespace epx {

using detail::HandleState;
using detail::Region;
using detail::RowMetaView;
using detail::split_range;

namespace {
// Nothing moved this round: spin a little, then give the core away (with more ranks than
// cores a pure spin starves the peer we wait for). False once `timeout` has passed.
class Idle {
 public:
  explicit Idle(std::chrono::milliseconds timeout) : timeout_(timeout) { reset(); }
  void reset() {
    spins_ = 0;
    deadline_ = std::chrono::steady_clock::now() + timeout_;
  }
  bool step() {
    if (++spins_ < 256) return true;
    sched_yield();
    return std::chrono::steady_clock::now() < deadline_;
  }

 private:
  std::chrono::milliseconds timeout_;
  int spins_ = 0;
  std::chrono::steady_clock::time_point deadline_;
};

struct Progress {
  bool pending = false;  // something is left to send or receive
  bool moved = false;    // this pass sent or received something
};

// Runs `pass` until nothing is pending, idling (spin, then yield) while nothing moves; after
// the timeout without movement throws naming the phase and what `waiting()` lists.
template <class Pass, class Waiting>
void progress_until_done(std::chrono::milliseconds timeout, int rank, const char* phase, int blame, Pass pass, Waiting waiting) {
  Idle idle(timeout);
  while (true) {
    const Progress p = pass();
    if (!p.pending) return;
    if (p.moved) {
      idle.reset();
      continue;
    }
    if (!idle.step())
      throw Error(ErrorCode::kTimeout, "rank " + std::to_string(rank) + ": timed out in phase '" + phase + "' waiting for" + waiting(), blame);
  }
}
}  // namespace

void Buffer::Impl::exchange_through_ring(const HandleState& h, const DispatchArgs& a,
                                         const std::vector<std::int32_t>* expert_base, DispatchResult& out) {
  const RoutingPlan& plan = h.plan;
  const int K = config.num_topk;
  const std::int64_t ring = config.ring_rows;
  const std::int64_t chunk = std::max<std::int64_t>(1, ring / 2);  // half a ring: the other half drains meanwhile
  const bool fp8 = a.x.dtype == DType::kFP8E4M3;
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * dtype_size(a.x.dtype);
  const std::size_t scale_bytes = fp8 ? static_cast<std::size_t>(config.hidden / 128) * sizeof(float) : 0;
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* scales = static_cast<const std::byte*>(a.x_scales.data);
  const bool with_meta = expert_base != nullptr;
  const bool expanded = h.layout == RecvLayout::kExpanded;
  const bool payload = moves_payload;
  const std::uint64_t stamp = epoch << 32;
  auto count_of = [&](std::uint64_t v) -> std::int64_t { return v >= stamp ? static_cast<std::int64_t>(v - stamp) : 0; };
  if (with_meta) meta_stage.resize(static_cast<std::size_t>(plan.num_entries()) * geo.meta_bytes());
  const std::byte* window_base = transport.window();
  std::byte* meta = transport.window() + geo.region(Region::kMeta);
  auto* rx = static_cast<std::byte*>(out.recv_x.data());

  std::vector<std::uint64_t> channel_bytes(static_cast<std::size_t>(P));
  for (int d = 0; d < P; ++d) channel_bytes[static_cast<std::size_t>(d)] = static_cast<std::uint64_t>(plan.tokens_to(d)) * row_bytes;

  run_workers([&](int w) {
    PhaseTimer timer(*this, w, Phase::kPutIssue);
    Sender send(*this, w, 0, channel_bytes, visit_order);
    struct Flow {
      int peer;
      std::int64_t done, total;
    };
    std::vector<Flow> sends, receives;
    for (std::size_t i = static_cast<std::size_t>(w); i < visit_order.size(); i += static_cast<std::size_t>(W)) {
      const int d = visit_order[i];
      sends.push_back({d, 0, plan.tokens_to(d)});
      const int s = (rank - static_cast<int>(i) + P) % P;  // sources in the mirrored order
      receives.push_back({s, 0, h.recv_begin[static_cast<std::size_t>(s) + 1] - h.recv_begin[static_cast<std::size_t>(s)]});
    }

    // One chunk of my segment for d: positions [p0, p1) into ring slots p % ring.
    auto send_chunk = [&](int d, std::int64_t p0, std::int64_t p1) {
      const auto* seg = plan.segment_token.data() + plan.segment_begin[static_cast<std::size_t>(d)];
      const std::int64_t base = geo.send_row(h, d, 0, false);
      for (std::int64_t p = p0; p < p1;) {
        std::int64_t q = p + 1;  // a run: consecutive tokens that don't wrap the ring
        while (q < p1 && seg[q] == seg[q - 1] + 1 && q % ring != 0) ++q;
        const auto t = static_cast<std::size_t>(seg[p]);
        send.put_rows(d, Region::kData, geo.ring_row(rank, p), x + t * row_bytes, q - p, row_bytes);
        if (fp8) send.put_rows(d, Region::kScales, base + p, scales + t * scale_bytes, q - p, scale_bytes);
        p = q;
      }
      if (with_meta) {
        const std::size_t stage_row = static_cast<std::size_t>(plan.segment_begin[static_cast<std::size_t>(d)] + p0);
        for (std::int64_t p = p0; p < p1; ++p)
          fill_meta(geo.meta_row(meta_stage.data(), static_cast<std::int64_t>(stage_row) + (p - p0)), h, a, d, seg[p], *expert_base);
        send.put_rows(d, Region::kMeta, base + p0, meta_stage.data() + stage_row * geo.meta_bytes(), p1 - p0, geo.meta_bytes());
      }
      send.signal(d, geo.ring_tail_signal(rank), stamp + static_cast<std::uint64_t>(p1));
    };
    // Rows [i0, i1) from s: out of the ring into the output, then their slots go back.
    auto place = [&](int s, std::int64_t i0, std::int64_t i1) {
      const std::int64_t first = h.recv_begin[static_cast<std::size_t>(s)];
      for (std::int64_t i = i0; i < i1 && payload; ++i) {
        const std::byte* row = window_base + geo.row(Region::kData, geo.ring_row(s, i), row_bytes);
        const std::int64_t r = first + i;
        if (!expanded) {
          bulk_copy(rx + static_cast<std::size_t>(r) * row_bytes, row, row_bytes);
          continue;
        }
        for (int k = 0; k < K; ++k) {
          const std::int32_t to = with_meta ? geo.meta_row(meta, r).slot_row[k]
                                            : h.recv_slot_row[static_cast<std::size_t>(r * K + k)];
          if (to >= 0) bulk_copy(rx + static_cast<std::size_t>(to) * row_bytes, row, row_bytes);
        }
      }
      transport.signal(s, geo.ring_credit_signal(rank), stamp + static_cast<std::uint64_t>(i1), 0);
    };

    auto pass = [&] {
      Progress p;
      for (Flow& f : sends) {
        if (f.done == f.total) continue;
        p.pending = true;
        const std::int64_t credit = count_of(transport.read_signal(geo.ring_credit_signal(f.peer)));
        const std::int64_t n = std::min({f.total - f.done, credit + ring - f.done, chunk});
        if (n <= 0) continue;
        send_chunk(f.peer, f.done, f.done + n);
        f.done += n;
        p.moved = true;
      }
      for (Flow& f : receives) {
        if (f.done == f.total) continue;
        p.pending = true;
        const std::int64_t tail = count_of(transport.read_signal(geo.ring_tail_signal(f.peer)));
        if (tail <= f.done) continue;
        place(f.peer, f.done, tail);
        f.done = tail;
        p.moved = true;
      }
      return p;
    };
    auto waiting = [&] {
      std::string what;
      for (const Flow& f : sends)
        if (f.done < f.total) what += " credit from rank " + std::to_string(f.peer);
      for (const Flow& f : receives)
        if (f.done < f.total) what += " rows from rank " + std::to_string(f.peer);
      return what;
    };
    progress_until_done(transport.timeout(), rank, "dispatch ring", sends.empty() ? -1 : sends.front().peer, pass, waiting);
    send.flush();
  });
}

// The combine's bounded reply area (ring_rows > 0): a source's tokens come back in rounds
// of C = max(1, ring_rows / 2) tokens. The reply area holds two rounds (while the source
// reduces one, the experts fill the other), each with C rows per expert rank: 2·P·C rows,
// the same as the dispatch rings' P·ring_rows. Round i of source s lives in half i % 2.
// An expert rank puts its rows for round i of s once s has reduced round i - 2 (s's
// credit), then signals the round; s reduces round i once every rank signalled it and
// hands the half back. Rounds per source: ceil(S_s / C), S_s from its combine header.
// Signals reuse the ring slots: tails from the experts, credits from the sources, values
// epoch << 32 | rounds (monotonic across calls, like the dispatch ring's counts).
void Buffer::Impl::combine_through_ring(const HandleState& h, const CombineArgs& a, const Peers& peers, Tensor& out) {
  const RoutingPlan& plan = h.plan;
  const std::int64_t S = plan.shape.num_tokens;
  const std::int64_t C = geo.reply_round_tokens();
  const std::size_t H = static_cast<std::size_t>(config.hidden);
  const std::size_t row_bytes = H * sizeof(std::uint16_t);
  const bool payload = moves_payload;
  const std::uint64_t stamp = epoch << 32;
  auto rounds_of = [&](std::int64_t tokens) { return (tokens + C - 1) / C; };
  auto count_of = [&](std::uint64_t v) -> std::int64_t { return v >= stamp ? static_cast<std::int64_t>(v - stamp) : 0; };
  if (h.layout == RecvLayout::kExpanded) reply_stage.resize(static_cast<std::size_t>(W * kReplyStageRows) * H);
  const auto* replies_base = reinterpret_cast<const std::uint16_t*>(transport.window() + geo.region(Region::kReplies));

  // Expert side, per source s: rounds sent, and the next of my received rows from s.
  struct Source {
    int peer;
    std::int64_t rounds, sent, next_row;
  };
  std::vector<Source> sources;
  std::vector<std::uint64_t> channel_bytes(static_cast<std::size_t>(P));
  for (int s : reply_order) {
    const auto us = static_cast<std::size_t>(s);
    sources.push_back({s, rounds_of(peers.header[us]->tokens), 0, h.recv_begin[us]});
    channel_bytes[us] = static_cast<std::uint64_t>(h.recv_begin[us + 1] - h.recv_begin[us]) * row_bytes;
  }
  // Source side: my rounds reduced, and per expert rank d the segment position of the
  // first token of the round being reduced.
  const std::int64_t my_rounds = rounds_of(S);
  std::int64_t reduced = 0;
  std::vector<std::int64_t> round_start(static_cast<std::size_t>(P), 0);
  std::vector<const std::uint16_t*> rows_of(static_cast<std::size_t>(P));
  std::vector<std::int64_t> first_row(static_cast<std::size_t>(P));

  PhaseTimer timer(*this, 0, Phase::kPutIssue);
  Sender send(*this, 0, 0, channel_bytes, reply_order);
  Replies replies(*this, h, a, 0);
  auto send_round = [&](Source& src) {
    const auto us = static_cast<std::size_t>(src.peer);
    const std::int64_t end_token = (src.sent + 1) * C, end = h.recv_begin[us + 1];
    std::int64_t r = src.next_row;
    const std::int64_t first = r;
    while (r < end && h.recv_token[static_cast<std::size_t>(r)] < end_token) ++r;
    const std::int64_t dst = geo.reply_ring_row(src.sent, rank);
    if (h.layout == RecvLayout::kCompact)
      send.put_rows(src.peer, Region::kReplies, dst, replies.of(first), r - first, row_bytes);
    else
      for (std::int64_t i = first; i < r; ++i) send.put_rows(src.peer, Region::kReplies, dst + (i - first), replies.of(i), 1, row_bytes);
    src.next_row = r;
    ++src.sent;
    send.signal(src.peer, geo.ring_tail_signal(rank), stamp + static_cast<std::uint64_t>(src.sent));
  };
  auto reduce_round = [&]() {
    const std::int64_t t0 = reduced * C, t1 = std::min(S, t0 + C);
    for (int d = 0; d < P; ++d) {
      const auto ud = static_cast<std::size_t>(d);
      // My segment at d is token-ascending: the round's rows start where the last one ended.
      const std::int32_t* seg = plan.segment_token.data() + plan.segment_begin[ud];
      std::int64_t p = round_start[ud];
      rows_of[ud] = replies_base + static_cast<std::size_t>(geo.reply_ring_row(reduced, d)) * H;
      first_row[ud] = -p;
      while (p < plan.tokens_to(d) && seg[p] < t1) ++p;
      round_start[ud] = p;
    }
    if (payload)
      run_workers([&](int w) {
        const auto [u0, u1] = split_range(t1 - t0, w, W);
        reduce_tokens(h, a, t0 + u0, t0 + u1, rows_of, first_row, out.as<std::uint16_t>(), nullptr);
      });
    ++reduced;
    for (int i = 0; i < P; ++i) transport.signal((rank + i) % P, geo.ring_credit_signal(rank), stamp + static_cast<std::uint64_t>(reduced), 0);
  };

  auto pass = [&] {
    Progress p;
    for (Source& src : sources) {
      if (src.sent == src.rounds) continue;
      p.pending = true;
      // Half sent % 2 is free once the source has reduced round sent - 2.
      if (src.sent >= 2 && count_of(transport.read_signal(geo.ring_credit_signal(src.peer))) < src.sent - 1) continue;
      send_round(src);
      p.moved = true;
    }
    if (reduced < my_rounds) {
      p.pending = true;
      bool all = true;
      for (int d = 0; d < P && all; ++d) all = count_of(transport.read_signal(geo.ring_tail_signal(d))) > reduced;
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
    for (int d = 0; d < P && reduced < my_rounds; ++d)
      if (count_of(transport.read_signal(geo.ring_tail_signal(d))) <= reduced) what += " replies from rank " + std::to_string(d);
    return what;
  };
  progress_until_done(transport.timeout(), rank, "combine ring", sources.empty() ? -1 : sources.front().peer, pass, waiting);
  send.flush();
}

}  // namespace epx
