// Combine, relay path (spi::Path::kRelay: the hierarchical schedule). Combine reverses the
// dispatch's path: an expert rank puts its reply to another server's source into the
// relay's area — the rank of its own server with the source's lane (send_replies: the
// reply channels are my server's ranks, each carrying the replies of the sources it relays
// for, reply_sources) — and the relay, once every member of its server has signalled,
// forwards every reply to the source's reply slot (the reply rows the dispatch's records
// gave, kept in the handle) and signals the source once. In the flat combine order the
// relay does not add partials (that would change the order of additions docs/spec.md §4 fixes for
// it), and the source reduces as push does. In the node-first order (DataPlaneOptions::
// combine_order, docs/spec.md §4 "combine reduced inside each node first") the relay sums each
// token's replies from its server's ranks, ascending rank, and forwards that one row — each
// token crosses once per server pair, as in DeepEP's internode combine — into the source's
// relay area, which no combine uses otherwise; the source sums its own server's replies the same way and
// adds the servers' sums in ascending server order. The source waits for its own server's
// ranks and each other server's relay in both orders.
// In place (node first, serial relays, compact, every rank of my server's y in its window
// and mapped; forward_in_place): the members put no replies to their relays; each relay
// reads them in its server's y right after the header exchange, sums and puts across, then
// tells its server's ranks it is done reading their y (await_readers).
// Relay chunks (DataPlaneOptions::relay_chunk_bytes, Impl::relay_chunk_rows > 0): instead of
// "every member's replies, then the forwarding", each member sends its replies in rounds
// across all its relay channels — round c carries every relay's chunk c, then an ordered
// signal per relay — and every rank, between its own rounds, forwards (sums) the chunks of
// its relay area that every member has signalled: the two stages overlap, as DeepEP's
// internode combine does with its NVLink senders and forwarders. The same sums in the same
// order (docs/spec.md §4 fixes it; only the time of the additions moves).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "../path.hpp"
#include "../reduce_row.hpp"
#include "relay_chunks.hpp"

namespace epx::detail {
namespace {

bool node_first(const PathContext& m) { return m.setup.config.dataplane.combine_order == CombineOrder::kNodeFirst; }

// Node first: the lanes of my server in ascending rank (a server's terms add up by ascending d).
std::vector<std::size_t> lanes_by_rank(const PathContext& m) {
  std::vector<std::size_t> lanes(m.setup.server_members.size());
  std::iota(lanes.begin(), lanes.end(), std::size_t{0});
  std::sort(lanes.begin(), lanes.end(), [&](std::size_t u, std::size_t v) { return m.setup.server_members[u] < m.setup.server_members[v]; });
  return lanes;
}

// At a relay, node first: relayed row i's replies summed over my server's lanes that hold
// it, ascending rank (a single reply passes unchanged), into `out`. Each reply is read where
// its rank put it in my relay area, or (`in_place`: the combine headers, every rank of my
// server's y in its window) in that rank's y, at the row's slot there.
class ServerSums {
 public:
  ServerSums(const PathContext& m, const Impl::Peers* in_place) : m_(m), lanes_(lanes_by_rank(m)), rows_(lanes_.size()) {
    if (in_place == nullptr) return;
    for (int d : m.setup.server_members)
      y_.push_back(m.setup.transport.peer_window(d) + in_place->header[static_cast<std::size_t>(d)]->y_offset);
  }

  void sum(const HandleState& h, std::int64_t i, std::uint16_t* out) {
    const std::size_t H = static_cast<std::size_t>(m_.setup.config.hidden), row_bytes = H * sizeof(std::uint16_t);
    const std::size_t at = static_cast<std::size_t>(i) * lanes_.size();
    const std::int32_t* reply_row = h.relayed_reply_row.data() + at;
    int n = 0;
    for (std::size_t lane : lanes_)
      if (reply_row[lane] >= 0)
        rows_[static_cast<std::size_t>(n++)] = reinterpret_cast<const std::uint16_t*>(
            y_.empty() ? m_.setup.transport.window() + m_.setup.geo.row(Region::kRelayReplies, m_.setup.geo.relay_reply_row(i, static_cast<int>(lane)), row_bytes)
                       : y_[lane] + static_cast<std::size_t>(h.relayed_slot[at + lane]) * row_bytes);
    if (n == 0) return;
    m_.setup.payload.values([&] {
      if (n == 1) std::memcpy(out, rows_[0], row_bytes);
      else reduce_row(out, RowTerms{nullptr, rows_.data(), nullptr, n}, H);
    });
  }

 private:
  const PathContext& m_;
  std::vector<std::size_t> lanes_;
  std::vector<const std::uint16_t*> rows_;
  std::vector<const std::byte*> y_;  // in place: each lane's y
};

// At a relay, node first: the sums of source s's relayed rows [i0, i1), staged one row per
// relayed row in relay_sums (every sum has its own row until the quiet), put into s's relay
// area (free during a combine; HandleState::sums_at_source) in puts of up to aggregate_bytes,
// each issued as soon as its rows are summed.
void put_sums(PathContext& m, const HandleState& h, ServerSums& sums, int s, std::int64_t i0, std::int64_t i1, WorkerStats* ws) {
  const std::size_t H = static_cast<std::size_t>(m.setup.config.hidden), row_bytes = H * sizeof(std::uint16_t);
  const std::int64_t per_put = std::max<std::int64_t>(1, static_cast<std::int64_t>(m.setup.config.dataplane.aggregate_bytes / row_bytes));
  const std::int64_t b = h.relayed_begin[static_cast<std::size_t>(s)];
  for (std::int64_t p0 = i0; p0 < i1; p0 += per_put) {
    const std::int64_t p1 = std::min(i1, p0 + per_put);
    for (std::int64_t i = p0; i < p1; ++i) sums.sum(h, i, m.call.relay_sums.data() + static_cast<std::size_t>(i) * H);
    const std::size_t bytes = static_cast<std::size_t>(p1 - p0) * row_bytes;
    m.setup.transport.put(s, m.setup.geo.row(Region::kRelay, h.sums_at_source[static_cast<std::size_t>(s)] + (p0 - b), row_bytes),
                    m.call.relay_sums.data() + static_cast<std::size_t>(p0) * H, bytes, 0);
    if (ws) m.count_put(*ws, s, bytes, 0);
  }
}

// At a relay, flat order: every reply to source s's relayed rows [i0, i1) on to its reply
// row at s, as it is.
void put_forwarded(PathContext& m, const HandleState& h, int s, std::int64_t i0, std::int64_t i1, WorkerStats* ws) {
  const std::size_t lanes = m.setup.server_members.size();
  const std::size_t row_bytes = static_cast<std::size_t>(m.setup.config.hidden) * sizeof(std::uint16_t);
  for (std::int64_t i = i0; i < i1; ++i) {
    const std::int32_t* reply_row = h.relayed_reply_row.data() + static_cast<std::size_t>(i) * lanes;
    for (std::size_t lane = 0; lane < lanes; ++lane) {
      if (reply_row[lane] < 0) continue;
      const std::byte* from = m.setup.transport.window() + m.setup.geo.row(Region::kRelayReplies, m.setup.geo.relay_reply_row(i, static_cast<int>(lane)), row_bytes);
      m.setup.transport.put(s, m.setup.geo.row(Region::kReplies, reply_row[lane], row_bytes), from, row_bytes, 0);
      if (ws) m.count_put(*ws, s, row_bytes, 0);
    }
  }
}

// Source s's relayed rows [i0, i1) on: summed (node first) or as they are (flat).
void forward_rows(PathContext& m, const HandleState& h, ServerSums& sums, int s, std::int64_t i0, std::int64_t i1, WorkerStats* ws) {
  if (node_first(m)) put_sums(m, h, sums, s, i0, i1, ws);
  else put_forwarded(m, h, s, i0, i1, ws);
}

void reserve_sums(PathContext& m, const HandleState& h) {
  if (node_first(m)) m.call.relay_sums.resize(static_cast<std::size_t>(h.relayed_begin.back()) * static_cast<std::size_t>(m.setup.config.hidden));
}

// At a relay, serial (relay_chunk_rows 0): its server's replies to other servers' sources
// of my lane go on to those sources after every member's completion signal, then one signal
// each: every reply on its own (flat order), or one sum per token (node first).
void forward_replies(PathContext& m, const HandleState& h) {
  const std::vector<int> sources = m.setup.relayed_sources();
  {  // every member of my server has put all its replies to me
    Impl::PhaseTimer timer = m.timer(0, Phase::kWaitData);
    for (int d : m.setup.server_members)
      for (int w = 0; w < m.setup.W; ++w) m.setup.transport.wait_signal(m.setup.geo.combine_signal(d, w), m.call.epoch, {"combine relay", d});
  }
  reserve_sums(m, h);
  m.run_workers([&](int w) {
    Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
    ServerSums sums(m, nullptr);
    for (std::size_t k = static_cast<std::size_t>(w); k < sources.size(); k += static_cast<std::size_t>(m.setup.W)) {
      const int s = sources[k];
      forward_rows(m, h, sums, s, h.relayed_begin[static_cast<std::size_t>(s)], h.relayed_begin[static_cast<std::size_t>(s) + 1],
                   m.stats_of(w));
      m.setup.transport.quiet(0);
      m.setup.transport.signal(s, m.setup.geo.forward_signal(m.setup.rank), m.call.epoch, 0);
    }
  });
}

// Node first, in place (Impl::relay_sums_in_place, and every rank of my server said in its
// header that its y lies in its window): nobody puts a reply to a relay of its own server.
bool in_place(const PathContext& m, const CombineStep& s) {
  return m.relay_sums_in_place(*s.h) && std::all_of(m.setup.server_members.begin(), m.setup.server_members.end(), [&](int d) {
           return s.peers->header[static_cast<std::size_t>(d)]->y_in_window != 0;
         });
}

// At a relay, in place, after my own replies (no member's wait: after the header exchange
// every rank of my server is in this combine, so its y is final), the sums of my sources' relayed rows read from my server's y
// (each worker a slice of every source's rows) go to the sources; once every worker has
// summed, every rank of my server hears "done reading your y" (it waits for that before its
// y may change); after the quiet, each source its signal.
void forward_in_place(PathContext& m, const HandleState& h, const Impl::Peers& peers) {
  const std::vector<int> sources = m.setup.relayed_sources();
  reserve_sums(m, h);
  std::atomic<int> reading{m.setup.W};
  m.run_workers([&](int w) {
    Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
    ServerSums sums(m, &peers);
    for (int s : sources) {
      const std::int64_t b = h.relayed_begin[static_cast<std::size_t>(s)];
      const auto [i0, i1] = split_range(h.relayed_begin[static_cast<std::size_t>(s) + 1] - b, w, m.setup.W);
      if (i0 < i1) put_sums(m, h, sums, s, b + i0, b + i1, m.stats_of(w));
    }
    if (reading.fetch_sub(1, std::memory_order_acq_rel) == 1)  // the last worker to finish reading (the sums are staged)
      for (int d : m.setup.server_members) m.setup.transport.signal(d, m.setup.geo.pull_done_signal(m.setup.rank), m.call.epoch, 0);
    m.setup.transport.quiet(0);
  });
  for (int s : sources) m.setup.transport.signal(s, m.setup.geo.forward_signal(m.setup.rank), m.call.epoch, 0);
}

// In place: until every relay of my server has read my y.
void await_readers(PathContext& m) {
  Impl::PhaseTimer timer = m.timer(0, Phase::kBarrier);
  for (int d : m.setup.server_members) m.setup.transport.wait_signal(m.setup.geo.pull_done_signal(d), m.call.epoch, {"combine relay done reading", d});
}

// ---- Relay chunks (relay_chunks.hpp): chunk c of every relay travels in round c of every
// member's send, followed by the member's worker's ordered chunk signal.

// One worker's relayed rows from source s to one relay, not sent yet: [next, end); `base`:
// where s's rows begin in the relay's area. A member's rows from s lie there in the same
// order (both by token).
struct RelayCursor {
  int s;
  std::int64_t next, end, base;
};

// A member's round c, on every channel: the relayed rows in the relay's chunk c; the chunk's
// ordered signal (a quiet first where the transport does not order signals after puts); the
// round's share of the channel's direct replies (its own rows, 1/rounds of them).
// One call's chunks: the rounds (the most chunks any relay of my server has), each channel's
// (reply_order[j]'s) chunks, and my sources as a relay (rotated).
struct ChunkPlan {
  std::int64_t rounds = 1, mine = 0;
  std::vector<std::int64_t> chunks;
  std::vector<int> sources;
};

void send_round(PathContext& m, Impl::Sender& send, Impl::Replies& replies, const HandleState& h, const CombineArgs& a, int w,
                std::int64_t c, const ChunkPlan& plan, std::vector<std::vector<RelayCursor>>& cursors) {
  const std::int64_t R = m.setup.relay_chunk_rows;
  for (std::size_t j = 0; j < m.setup.reply_order.size(); ++j) {
    const int peer = m.setup.reply_order[j];
    for (RelayCursor& cur : cursors[j]) {
      std::int64_t stop = cur.next;
      while (stop < cur.end && h.recv_relay_row[static_cast<std::size_t>(stop)] - cur.base < (c + 1) * R) ++stop;
      m.put_replies(send, replies, h, a, peer, cur.s, cur.next, stop);
      cur.next = stop;
    }
    if (c < plan.chunks[j]) signal_chunk(m, peer, send.queue_of(peer), w, c);
    const auto [slice_first, slice_end] = m.reply_slice(h, peer, w);
    const auto [first, end] = round_share(slice_first, slice_end, c, plan.rounds);
    m.put_replies(send, replies, h, a, peer, peer, first, end);
  }
}

// At a relay, chunked: my chunk c, once every member's every worker has signalled it: each
// source's rows of it (forward_rows), my sources in rotated order.
void forward_chunk(PathContext& m, const HandleState& h, const std::vector<int>& sources, ServerSums& sums, int w, std::int64_t c) {
  {
    Impl::PhaseTimer timer = m.timer(w, Phase::kWaitData);
    for (int d : m.setup.server_members) wait_chunk(m, d, c, "combine relay chunk");
  }
  Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
  for (int s : sources) {
    const auto [i0, i1] = chunk_range(h.relayed_begin, s, c, m.setup.relay_chunk_rows);
    if (i0 < i1) forward_rows(m, h, sums, s, i0, i1, m.stats_of(w));
  }
}

// Chunked (relay_chunk_rows > 0): every rank is a member and a relay at once, as DeepEP's
// NVLink senders and forwarders are different warps of one kernel. Each worker sends its
// replies in rounds (send_round) and, between them, forwards the relay chunks it owns (c = w,
// w + W, ...) whose round is kRelayLag behind; then completes its channels as send_replies
// does, forwards the rest and quiets. After every worker: one signal per relayed source.
void send_and_forward(PathContext& m, const HandleState& h, const CombineArgs& a) {
  ChunkPlan plan;
  plan.mine = relay_chunks(h.relayed_begin, m.setup.relay_chunk_rows);
  plan.sources = m.setup.relayed_sources();
  for (int d : m.setup.reply_order) {
    plan.chunks.push_back(relay_chunks(h.relayed_begin_at[static_cast<std::size_t>(d)], m.setup.relay_chunk_rows));
    plan.rounds = std::max(plan.rounds, plan.chunks.back());
  }
  m.reserve_reply_stage(h);
  reserve_sums(m, h);
  m.run_workers([&](int w) {
    Impl::Sender send = m.sender(w, m.setup.geo.combine_signal(m.setup.rank, w), m.reply_channel_bytes(h, w), m.setup.reply_order);
    Impl::Replies replies = m.replies(h, a, w);
    ServerSums sums(m, nullptr);
    std::vector<std::vector<RelayCursor>> cursors(m.setup.reply_order.size());
    for (std::size_t j = 0; j < m.setup.reply_order.size(); ++j)
      for (int s : m.setup.reply_sources[static_cast<std::size_t>(m.setup.reply_order[j])])
        if (s != m.setup.reply_order[j]) {
          const auto [first, end] = m.reply_slice(h, s, w);
          cursors[j].push_back({s, first, end, h.relayed_begin_at[static_cast<std::size_t>(m.setup.reply_order[j])][static_cast<std::size_t>(s)]});
        }
    OwnChunks own(plan.mine, w, m.setup.W);  // my chunks as a relay
    auto forward_upto = [&](std::int64_t last) { own.upto(last, [&](std::int64_t c) { forward_chunk(m, h, plan.sources, sums, w, c); }); };
    for (std::int64_t c = 0; c < plan.rounds; ++c) {
      {
        Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
        send_round(m, send, replies, h, a, w, c, plan, cursors);
      }
      forward_upto(c - kRelayLag);
    }
    for (int peer : m.setup.reply_order) send.end_channel(peer);
    send.finish();
    forward_upto(plan.mine);
    m.setup.transport.quiet(0);
  });
  for (int s : plan.sources) m.setup.transport.signal(s, m.setup.geo.forward_signal(m.setup.rank), m.call.epoch, 0);
}

// At the source, node first: per token, its replies grouped by the server of their rank,
// servers ascending; my server's replies summed here (ascending rank; one passes unchanged),
// each other server's sum read where its relay put it (my relay area: HandleState::my_sums
// + the token's place among my tokens through that relay); then bias0 + bias1 + the
// servers' sums, rounded once (docs/spec.md §4).
class NodeFirstReduce {
 public:
  NodeFirstReduce(PathContext& m, const HandleState& h, const CombineArgs& a, std::int64_t t0)
      : m_(m), h_(h), H_(static_cast<std::size_t>(m.setup.config.hidden)), my_server_(server_of(m.setup.rank)),
        b0_(a.bias0.empty() ? nullptr : a.bias0.as<std::uint16_t>()), b1_(a.bias1.empty() ? nullptr : a.bias1.as<std::uint16_t>()),
        replies_(reinterpret_cast<const std::uint16_t*>(m.setup.transport.window() + m.setup.geo.region(Region::kReplies))),
        next_(static_cast<std::size_t>(m.setup.P)), my_sum_(H_) {
    for (int r = 0; r < m.setup.P; ++r) {  // my first token through each relay at or after t0
      const auto& tokens = h.relay_tokens[static_cast<std::size_t>(r)];
      next_[static_cast<std::size_t>(r)] = std::lower_bound(tokens.begin(), tokens.end(), t0) - tokens.begin();
    }
  }

  void token(std::int64_t t, std::uint16_t* out) {
    const RoutingPlan& plan = h_.plan;
    order_.clear();
    for (std::int32_t i = plan.token_begin[static_cast<std::size_t>(t)]; i < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++i) {
      const auto e = static_cast<std::size_t>(i);
      const int d = plan.entry_rank[e];
      order_.push_back({server_of(d), d, replies_ + static_cast<std::size_t>(m_.setup.geo.replied_row(h_, d, plan.entry_position[e])) * H_});
    }
    std::sort(order_.begin(), order_.end(), [](const Term& u, const Term& v) { return u.server != v.server ? u.server < v.server : u.rank < v.rank; });
    const std::size_t off = static_cast<std::size_t>(t) * H_;
    terms_.assign(1, b1_ ? b1_ + off : m_.setup.zero_row.data());  // as in reduce_tokens: a missing bias1 adds +0.0
    for (std::size_t j = 0; j < order_.size();) {
      std::size_t k = j;
      while (k < order_.size() && order_[k].server == order_[j].server) ++k;
      terms_.push_back(order_[j].server == my_server_ ? mine(j, k) : relayed_sum(t, order_[j].rank));
      j = k;
    }
    reduce_row(out + off, RowTerms{b0_ ? b0_ + off : nullptr, terms_.data(), nullptr, static_cast<int>(terms_.size())}, H_);
  }

 private:
  struct Term {
    int server, rank;
    const std::uint16_t* row;
  };
  int server_of(int d) const { return m_.setup.topology.ranks[static_cast<std::size_t>(d)].server; }

  // My server's replies order_[j, k): one passes unchanged, more are summed here.
  const std::uint16_t* mine(std::size_t j, std::size_t k) {
    if (k - j == 1) return order_[j].row;
    rows_.clear();
    for (std::size_t i = j; i < k; ++i) rows_.push_back(order_[i].row);
    reduce_row(my_sum_.data(), RowTerms{nullptr, rows_.data(), nullptr, static_cast<int>(rows_.size())}, H_);
    return my_sum_.data();
  }

  // The sum of token t's replies at d's server, from its relay.
  const std::uint16_t* relayed_sum(std::int64_t t, int d) {
    const auto r = static_cast<std::size_t>(relay_rank(m_.setup.topology, m_.setup.rank, d));
    const auto& tokens = h_.relay_tokens[r];
    while (tokens[static_cast<std::size_t>(next_[r])] < t) ++next_[r];
    const std::size_t row_bytes = H_ * sizeof(std::uint16_t);
    return reinterpret_cast<const std::uint16_t*>(m_.setup.transport.window() + m_.setup.geo.row(Region::kRelay, h_.my_sums[r] + next_[r], row_bytes));
  }

  PathContext& m_;
  const HandleState& h_;
  std::size_t H_;
  int my_server_;
  const std::uint16_t *b0_, *b1_, *replies_;
  std::vector<std::int64_t> next_;
  std::vector<std::uint16_t> my_sum_;
  std::vector<Term> order_;
  std::vector<const std::uint16_t*> rows_, terms_;
};

void reduce_node_first(PathContext& m, const HandleState& h, const CombineArgs& a, Tensor& out) {
  if (!m.setup.payload.computes_sums()) return;
  m.run_workers([&](int w) {
    Impl::PhaseTimer timer = m.timer(w, Phase::kEpilogue);
    const auto [t0, t1] = split_range(h.plan.shape.num_tokens, w, m.setup.W);
    NodeFirstReduce reduce(m, h, a, t0);
    for (std::int64_t t = t0; t < t1; ++t) reduce.token(t, out.as<std::uint16_t>());
  });
}

class Relay final : public CombinePath {
 public:
  void send(PathContext m, const CombineStep& s) const override {
    if (m.setup.relay_chunk_rows > 0) {
      send_and_forward(m, *s.h, *s.a);  // the relays forward while they send
    } else {
      m.send_replies(*s.h, *s.a, true, !in_place(m, s));  // in place: only to my own server's sources
    }
  }

  void receive(PathContext m, const CombineStep& s) const override {
    const bool read_in_place = m.setup.relay_chunk_rows == 0 && in_place(m, s);
    if (read_in_place) forward_in_place(m, *s.h, *s.peers);
    else if (m.setup.relay_chunk_rows == 0) forward_replies(m, *s.h);
    {  // My server's ranks answer directly; each other server's answers come from its relay.
      Impl::PhaseTimer timer = m.timer(0, Phase::kWaitData);
      Impl::WaitClock::time_point since = Impl::WaitClock::now();
      for (int d : m.setup.server_members) {
        for (int w = 0; w < m.setup.W; ++w) m.setup.transport.wait_signal(m.setup.geo.combine_signal(d, w), m.call.epoch, {"combine data", d});
        since = m.lap_wait(0, d, since);
      }
      const int my_server = m.setup.topology.ranks[static_cast<std::size_t>(m.setup.rank)].server;
      for (int d = 0; d < m.setup.P; ++d) {
        const int relay = relay_rank(m.setup.topology, m.setup.rank, d);
        if (m.setup.topology.ranks[static_cast<std::size_t>(d)].server != my_server && relay == d) {
          m.setup.transport.wait_signal(m.setup.geo.forward_signal(relay), m.call.epoch, {"combine data (relayed)", relay});
          since = m.lap_wait(0, relay, since);
        }
      }
    }
    if (node_first(m))
      reduce_node_first(m, *s.h, *s.a, *s.out);
    else
      m.reduce(*s.h, *s.a, nullptr, *s.out);
    if (read_in_place) await_readers(m);
  }
};

}  // namespace

ReplyChannels reply_channels(const Topology& topology, int rank, int P, const std::vector<int>& visit_order,
                             bool hierarchical) {
  ReplyChannels c;
  c.order = visit_order;
  c.sources.assign(static_cast<std::size_t>(P), {});
  for (int s = 0; s < P; ++s) c.sources[static_cast<std::size_t>(s)] = {s};
  if (!hierarchical) return c;
  // Combine reverses the path: replies to another server's source go to its relay in my
  // server (the rank with the source's lane), which forwards them.
  const RankPlace& me = topology.ranks[static_cast<std::size_t>(rank)];
  for (int d = 0; d < P; ++d)
    if (topology.ranks[static_cast<std::size_t>(d)].server == me.server) c.members.push_back(d);
  std::sort(c.members.begin(), c.members.end(), [&](int u, int v) {
    return topology.ranks[static_cast<std::size_t>(u)].lane < topology.ranks[static_cast<std::size_t>(v)].lane;
  });
  c.servers = P / static_cast<int>(c.members.size());
  c.order.clear();
  for (int i = 0; i < P; ++i) {
    const int d = (rank + i) % P;
    if (topology.ranks[static_cast<std::size_t>(d)].server == me.server) c.order.push_back(d);
    else c.sources[static_cast<std::size_t>(relay_rank(topology, d, rank))].push_back(d);
  }
  return c;
}

const CombinePath& relay_combine() {
  static const Relay unit;
  return unit;
}

}  // namespace epx::detail
