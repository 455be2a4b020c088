// Dispatch, relay path (spi::Path::kRelay: the hierarchical schedule). A token whose
// destinations include ranks of another server is sent there once, to the rank of that
// server with my lane (its relay), with a record that says, per lane of that server, the
// row's slot at that rank, its reply row and its metadata. The relay forwards the row inside
// its server and then tells each final rank, with one signal per source, that the source's
// rows have landed. Rows for my own server go direct (put_segment). Rows land in exactly
// the slots a direct send would use, so every output is the same bits. The relay keeps the
// records' reply rows in the handle for this dispatch's combines (paths/combine_relay.cpp).
//
// Fresh dispatch: the header carries, per relay, how many of my tokens cross through it
// (add_counts); from the gathered counts each rank knows where its relayed rows go in each
// relay's area and which rows it relays for whom (plan).
// Relay chunks (DataPlaneOptions::relay_chunk_bytes, Impl::relay_chunk_rows > 0;
// relay_chunks.hpp, the combine's scheme): instead of "all of a source's rows, then the
// forwarding", each source sends in rounds — round c carries its chunk c to every relay, then
// an ordered signal per relay, then 1/rounds of its rows to its own server — and every rank,
// between its own rounds, forwards chunk c of each of its sources once that source has
// signalled it, while later chunks still arrive: the network and the scale-up stages overlap,
// as DeepEP's internode dispatch forwards RDMA chunks over NVLink as they land. The rows land
// in the same slots; only their time moves.
#include <algorithm>
#include <tuple>

#include "../path.hpp"
#include "relay_chunks.hpp"

namespace epx::detail {
namespace {

// A dispatch row's bytes: the row, its FP8 scales (0: bf16) and, forwarded, whether its
// metadata goes with it (fresh dispatch) and where each final rank's rows land (its
// receive area, or — one copy, compact — its output block at the same slot).
struct RowBytes {
  std::size_t row, scale;
  bool with_meta;
  const std::vector<Landing>* landing = nullptr;
};

// Fresh dispatch: my tokens per relay (once per server), kept in h.relay_tokens.
std::vector<std::int32_t> relay_counts(PathContext& m, HandleState& h) {
  const RoutingPlan& plan = h.plan;
  const int my_server = m.setup.topology.ranks[static_cast<std::size_t>(m.setup.rank)].server;
  h.relay_tokens.assign(static_cast<std::size_t>(m.setup.P), {});
  for (std::int64_t t = 0; t < plan.shape.num_tokens; ++t)
    for (std::int32_t i = plan.token_begin[static_cast<std::size_t>(t)]; i < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++i) {
      const int d = plan.entry_rank[static_cast<std::size_t>(i)];
      if (m.setup.topology.ranks[static_cast<std::size_t>(d)].server == my_server) continue;
      auto& tokens = h.relay_tokens[static_cast<std::size_t>(relay_rank(m.setup.topology, m.setup.rank, d))];
      if (tokens.empty() || tokens.back() != t) tokens.push_back(static_cast<std::int32_t>(t));  // once per server
    }
  std::vector<std::int32_t> counts(static_cast<std::size_t>(m.setup.P));
  for (int r = 0; r < m.setup.P; ++r) counts[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(h.relay_tokens[static_cast<std::size_t>(r)].size());
  return counts;
}

// Fresh dispatch, after plan_slots: where my relayed rows go in each relay's area, and
// which rows I relay for each source.
void plan_relay(PathContext& m, HandleState& h, const Peers& peers) {
  const int first = m.setup.P + m.setup.config.num_experts;  // relay counts follow tokens and slots
  h.relay_base.assign(static_cast<std::size_t>(m.setup.P), 0);
  h.relayed_begin.assign(static_cast<std::size_t>(m.setup.P) + 1, 0);
  for (int r = 0; r < m.setup.P; ++r)
    for (int s = 0; s < m.setup.rank; ++s) h.relay_base[static_cast<std::size_t>(r)] += peers.counts(s)[first + r];
  for (int s = 0; s < m.setup.P; ++s)
    h.relayed_begin[static_cast<std::size_t>(s) + 1] = h.relayed_begin[static_cast<std::size_t>(s)] + peers.counts(s)[first + m.setup.rank];
  h.relayed_begin_at.assign(static_cast<std::size_t>(m.setup.P), {});
  for (int d : m.setup.server_members) {
    std::vector<std::int64_t>& begin = h.relayed_begin_at[static_cast<std::size_t>(d)];
    begin.assign(static_cast<std::size_t>(m.setup.P) + 1, 0);
    for (int s = 0; s < m.setup.P; ++s) begin[static_cast<std::size_t>(s) + 1] = begin[static_cast<std::size_t>(s)] + peers.counts(s)[first + d];
  }
  // Node-first combine: source s's tokens through relays below r = where r's sums for s start
  // in s's relay area (paths/combine_relay.cpp).
  auto sums_before = [&](int s, int relay) {
    std::int64_t n = 0;
    for (int r = 0; r < relay; ++r) n += peers.counts(s)[first + r];
    return n;
  };
  h.sums_at_source.assign(static_cast<std::size_t>(m.setup.P), 0);
  h.my_sums.assign(static_cast<std::size_t>(m.setup.P), 0);
  for (int p = 0; p < m.setup.P; ++p) {
    h.sums_at_source[static_cast<std::size_t>(p)] = sums_before(p, m.setup.rank);
    h.my_sums[static_cast<std::size_t>(p)] = sums_before(m.setup.rank, p);
  }
  if (h.relayed_begin.back() > m.setup.geo.relay_rows())
    throw Error(ErrorCode::kInternal, "rank " + std::to_string(m.setup.rank) + ": relays " + std::to_string(h.relayed_begin.back()) +
                                          " rows but its relay area holds " + std::to_string(m.setup.geo.relay_rows()), m.setup.rank);
}

// My relayed rows [i0, i1) to relay (indices into h.relay_tokens[relay]): the rows and
// their scales, in runs of consecutive tokens.
void put_relayed_data(Impl::Sender& send, const HandleState& h, const DispatchArgs& a, int relay, std::int64_t i0, std::int64_t i1,
                      const RowBytes& b) {
  const std::vector<std::int32_t>& tokens = h.relay_tokens[static_cast<std::size_t>(relay)];
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* scales = static_cast<const std::byte*>(a.x_scales.data);
  const std::int64_t base = h.relay_base[static_cast<std::size_t>(relay)];
  for (std::int64_t i = i0; i < i1;) {
    std::int64_t j = i + 1;
    while (j < i1 && tokens[static_cast<std::size_t>(j)] == tokens[static_cast<std::size_t>(j) - 1] + 1) ++j;
    const auto t = static_cast<std::size_t>(tokens[static_cast<std::size_t>(i)]);
    send.put_rows(relay, Region::kRelay, base + i, x + t * b.row, j - i, b.row);
    if (b.scale) send.put_rows(relay, Region::kRelayScales, base + i, scales + t * b.scale, j - i, b.scale);
    i = j;
  }
}

// The records of my relayed rows [i0, i1) to relay (built in `records`): per lane of the
// relay's server, the slot there and the row's metadata.
void put_records(PathContext& m, Impl::Sender& send, const HandleState& h, const DispatchArgs& a, int relay, std::int64_t i0,
                 std::int64_t i1, const std::vector<std::int32_t>* expert_base, std::byte* records) {
  const RoutingPlan& plan = h.plan;
  const std::vector<std::int32_t>& tokens = h.relay_tokens[static_cast<std::size_t>(relay)];
  const std::int64_t base = h.relay_base[static_cast<std::size_t>(relay)];
  const int server = m.setup.topology.ranks[static_cast<std::size_t>(relay)].server;
  std::vector<int> members;
  for (int d = 0; d < m.setup.P; ++d)
    if (m.setup.topology.ranks[static_cast<std::size_t>(d)].server == server) members.push_back(d);
  std::sort(members.begin(), members.end(), [&](int u, int v) {
    return m.setup.topology.ranks[static_cast<std::size_t>(u)].lane < m.setup.topology.ranks[static_cast<std::size_t>(v)].lane;
  });
  const std::size_t lanes = members.size();
  for (std::int64_t i = i0; i < i1; ++i) {
    const detail::RelayRecordView rec = m.setup.geo.relay_record(records, i);
    std::fill(rec.slot, rec.slot + lanes, -1);
    std::fill(rec.reply_row, rec.reply_row + lanes, -1);
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    for (std::int32_t e = plan.token_begin[static_cast<std::size_t>(t)]; e < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++e) {
      const int d = plan.entry_rank[static_cast<std::size_t>(e)];
      const auto lane = std::find(members.begin(), members.end(), d) - members.begin();
      if (static_cast<std::size_t>(lane) == lanes) continue;
      const std::int64_t position = plan.entry_position[static_cast<std::size_t>(e)];
      rec.slot[lane] = static_cast<std::int32_t>(m.setup.geo.send_row(h, d, position, false));
      rec.reply_row[lane] = static_cast<std::int32_t>(m.setup.geo.replied_row(h, d, position));
      if (expert_base) {
        RowMetaView meta = m.setup.geo.meta_row(rec.meta, static_cast<std::int64_t>(lane));
        m.fill_meta(meta, h, a, d, t, *expert_base);
        *meta.relay_row = static_cast<std::int32_t>(base + i);
      }
    }
  }
  if (i0 < i1)
    send.put_rows(relay, Region::kRelayRecord, base + i0, records + m.setup.geo.relay_record_offset(i0), i1 - i0, m.setup.geo.relay_record_bytes());
}

// At a relay: source s's relayed rows [i0, i1) (from my relay area, with their records) on
// to their final ranks in my server: into the receive area, or (one copy, compact) the
// rank's output block at the same slot, as its direct senders put them.
void forward_rows(PathContext& m, std::int64_t i0, std::int64_t i1, const RowBytes& b, WorkerStats* ws) {
  std::byte* window_base = m.setup.transport.window();
  auto put = [&](int d, std::size_t offset, const std::byte* from, std::size_t bytes) {
    m.setup.transport.put(d, offset, from, bytes, 0);
    if (ws) m.count_put(*ws, d, bytes, 0);
  };
  for (std::int64_t i = i0; i < i1; ++i) {
    const detail::RelayRecordView rec = m.setup.geo.relay_record(window_base + m.setup.geo.region(Region::kRelayRecord), i);
    for (std::size_t lane = 0; lane < m.setup.server_members.size(); ++lane) {
      if (rec.slot[lane] < 0) continue;
      const int d = m.setup.server_members[lane];
      const std::int64_t to = rec.slot[lane];
      const Landing& at = (*b.landing)[static_cast<std::size_t>(d)];
      auto landed = [&](Region region, std::size_t bytes) {
        return at.block ? Geometry::landed_row(at, region, to, bytes) : m.setup.geo.row(region, to, bytes);
      };
      put(d, landed(Region::kData, b.row), window_base + m.setup.geo.row(Region::kRelay, i, b.row), b.row);
      if (b.scale) put(d, landed(Region::kScales, b.scale), window_base + m.setup.geo.row(Region::kRelayScales, i, b.scale), b.scale);
      if (b.with_meta)
        put(d, m.setup.geo.row(Region::kMeta, to, m.setup.geo.meta_bytes()), m.setup.geo.meta_record(rec.meta, static_cast<std::int64_t>(lane)),
            m.setup.geo.meta_bytes());
    }
  }
}

// At a relay, serial (relay_chunk_rows 0): each source's rows (after its completion
// signals) on to their final ranks in my server, then one signal per source to each.
void forward_relayed(PathContext& m, const HandleState& h, const RowBytes& b) {
  const std::vector<int> sources = m.setup.relayed_sources();
  m.run_workers([&](int w) {
    for (std::size_t k = static_cast<std::size_t>(w); k < sources.size(); k += static_cast<std::size_t>(m.setup.W)) {
      const int s = sources[k];
      {
        Impl::PhaseTimer timer = m.timer(w, Phase::kWaitData);
        const Impl::WaitClock::time_point since = Impl::WaitClock::now();
        for (int sw = 0; sw < m.setup.W; ++sw) m.setup.transport.wait_signal(m.setup.geo.dispatch_signal(s, sw), m.call.epoch, {"dispatch relay", s});
        m.lap_wait(w, s, since);
      }
      Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
      forward_rows(m, h.relayed_begin[static_cast<std::size_t>(s)], h.relayed_begin[static_cast<std::size_t>(s) + 1], b, m.stats_of(w));
      m.setup.transport.quiet(0);
      for (int d : m.setup.server_members) m.setup.transport.signal(d, m.setup.geo.forward_signal(s), m.call.epoch, 0);
    }
  });
}

// At a relay, chunked: chunk c of each of my sources (relay_chunks.hpp), each once its
// source's every worker has signalled it.
void forward_chunk(PathContext& m, const HandleState& h, const std::vector<int>& sources, const RowBytes& b, int w, std::int64_t c) {
  for (int s : sources) {
    const auto [i0, i1] = chunk_range(h.relayed_begin, s, c, m.setup.relay_chunk_rows);
    if (i0 >= i1) continue;
    {
      Impl::PhaseTimer timer = m.timer(w, Phase::kWaitData);
      wait_chunk(m, s, c, "dispatch relay chunk");
    }
    Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
    forward_rows(m, i0, i1, b, m.stats_of(w));
  }
}

// Fresh dispatch, at a relay: keeps the records' reply rows and slots for this handle's combines.
void keep_reply_rows(PathContext& m, HandleState& h) {
  const std::size_t lanes = m.setup.server_members.size(), rows = static_cast<std::size_t>(h.relayed_begin.back());
  h.relayed_reply_row.resize(rows * lanes);
  h.relayed_slot.resize(rows * lanes);
  for (std::size_t i = 0; i < rows; ++i) {
    const detail::RelayRecordView rec = m.setup.geo.relay_record(m.setup.transport.window() + m.setup.geo.region(Region::kRelayRecord), static_cast<std::int64_t>(i));
    const auto at = static_cast<std::ptrdiff_t>(i * lanes);
    std::copy(rec.reply_row, rec.reply_row + lanes, h.relayed_reply_row.begin() + at);
    std::copy(rec.slot, rec.slot + lanes, h.relayed_slot.begin() + at);
  }
}

bool crosses(const PathContext& m, int d) {
  return m.setup.topology.ranks[static_cast<std::size_t>(d)].server != m.setup.topology.ranks[static_cast<std::size_t>(m.setup.rank)].server;
}

// One call's send: the peers (relays first, so the rows crossing servers travel while the
// local ones are copied), each relay's first record in relay_stage, and, chunked, my rounds
// as a source (the most chunks I send any relay), my chunks and my sources as a relay.
struct SendPlan {
  std::vector<int> order;
  std::vector<std::size_t> relay_first;
  std::int64_t rounds = 1, mine = 0;
  std::vector<int> sources;
};

SendPlan plan_send(PathContext& m, const HandleState& h) {
  SendPlan p;
  p.order = m.setup.visit_order;  // my server's ranks and one relay per other server
  std::stable_partition(p.order.begin(), p.order.end(), [&](int d) { return crosses(m, d); });
  p.relay_first.assign(static_cast<std::size_t>(m.setup.P) + 1, 0);
  for (int r = 0; r < m.setup.P; ++r) {
    const std::size_t n = h.relay_tokens[static_cast<std::size_t>(r)].size();
    p.relay_first[static_cast<std::size_t>(r) + 1] = p.relay_first[static_cast<std::size_t>(r)] + n;
    if (m.setup.relay_chunk_rows > 0) p.rounds = std::max(p.rounds, chunks_of(static_cast<std::int64_t>(n), m.setup.relay_chunk_rows));
  }
  if (m.setup.relay_chunk_rows > 0) {
    p.mine = relay_chunks(h.relayed_begin, m.setup.relay_chunk_rows);
    p.sources = m.setup.relayed_sources();
  }
  return p;
}

// One worker's part of a dispatch: its tokens [t0, t1), the bytes it puts to each peer.
struct WorkerPart {
  std::int64_t t0, t1;
  std::vector<std::pair<std::int64_t, std::int64_t>> local;  // [P]: positions in my segment to d
  std::vector<std::uint64_t> channel_bytes;                  // [P]
};

WorkerPart worker_part(PathContext& m, const DispatchStep& s, int w) {
  const HandleState& h = *s.h;
  WorkerPart part;
  std::tie(part.t0, part.t1) = split_range(h.plan.shape.num_tokens, w, m.setup.W);
  part.local.resize(static_cast<std::size_t>(m.setup.P));
  part.channel_bytes.resize(static_cast<std::size_t>(m.setup.P));
  const std::size_t meta_bytes = s.expert_base ? m.setup.geo.meta_bytes() : 0;
  for (int d = 0; d < m.setup.P; ++d) {
    const auto ud = static_cast<std::size_t>(d);
    part.local[ud] = Impl::segment_part(h.plan, d, part.t0, part.t1);
    part.channel_bytes[ud] = static_cast<std::uint64_t>(part.local[ud].second - part.local[ud].first) * (s.row_bytes + s.scale_bytes + meta_bytes);
    if (crosses(m, d)) {
      const auto& tokens = h.relay_tokens[ud];
      const auto n = std::lower_bound(tokens.begin(), tokens.end(), part.t1) - std::lower_bound(tokens.begin(), tokens.end(), part.t0);
      part.channel_bytes[ud] = static_cast<std::uint64_t>(n) * (s.row_bytes + s.scale_bytes + m.setup.geo.relay_record_bytes());
    }
  }
  return part;
}

// A worker's round c of `rounds` (serial: one round): to each relay, my relayed rows in its
// chunk c (serial: all) with their records and, chunked, the chunk's signal; to each rank of
// my server, 1/rounds of my rows to it.
void send_round(PathContext& m, Impl::Sender& send, const DispatchStep& s, const SendPlan& p, const WorkerPart& part, int w, std::int64_t c) {
  const HandleState& h = *s.h;
  const RowBytes b{s.row_bytes, s.scale_bytes, false};
  const std::int64_t R = m.setup.relay_chunk_rows;
  for (int d : p.order) {
    const auto ud = static_cast<std::size_t>(d);
    if (crosses(m, d)) {
      const auto& tokens = h.relay_tokens[ud];
      std::int64_t i0 = std::lower_bound(tokens.begin(), tokens.end(), part.t0) - tokens.begin();
      std::int64_t i1 = std::lower_bound(tokens.begin(), tokens.end(), part.t1) - tokens.begin();
      if (R > 0) i0 = std::max(i0, c * R), i1 = std::min(i1, (c + 1) * R);
      if (i0 < i1) {
        put_relayed_data(send, h, *s.a, d, i0, i1, b);
        put_records(m, send, h, *s.a, d, i0, i1, s.expert_base, m.call.relay_stage.data() + m.setup.geo.relay_record_offset(static_cast<std::int64_t>(p.relay_first[ud])));
      }
      if (R > 0 && c < chunks_of(static_cast<std::int64_t>(tokens.size()), R)) signal_chunk(m, d, send.queue_of(d), w, c);
    } else {
      const auto [first, end] = round_share(part.local[ud].first, part.local[ud].second, c, p.rounds);
      m.put_segment(send, h, *s.a, s.expert_base, d, first, end, m.setup.geo.send_row(h, d, 0, false), (*s.landing)[ud]);
    }
  }
}

// Every worker's rows in rounds (send_round); chunked, every rank is a source and a relay at
// once, as DeepEP's RDMA senders and NVLink forwarders are warps of one kernel: between its
// rounds a worker forwards the relay chunks it owns (c = w, w + W, ...) whose round is
// kRelayLag behind, then, after its channels' completion, the rest, and quiets.
void send_worker(PathContext& m, const DispatchStep& s, const SendPlan& p, int w) {
  const WorkerPart part = worker_part(m, s, w);
  Impl::Sender send = m.sender(w, m.setup.geo.dispatch_signal(m.setup.rank, w), part.channel_bytes, m.setup.visit_order);
  const RowBytes forwarded{s.row_bytes, s.scale_bytes, s.fresh, s.landing};
  OwnChunks own(p.mine, w, m.setup.W);  // my chunks as a relay
  auto forward_upto = [&](std::int64_t last) { own.upto(last, [&](std::int64_t c) { forward_chunk(m, *s.h, p.sources, forwarded, w, c); }); };
  for (std::int64_t c = 0; c < p.rounds; ++c) {
    {
      Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
      send_round(m, send, s, p, part, w, c);
    }
    forward_upto(c - kRelayLag);
  }
  {
    Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
    for (int d : p.order) send.end_channel(d);
    send.finish();
  }
  if (m.setup.relay_chunk_rows == 0) return;
  forward_upto(p.mine);
  m.setup.transport.quiet(0);
}

// Every worker's rows: to my server's ranks direct, to each other server's relay once per
// token with its records (staged per relay in relay_stage, which outlives the puts).
// Chunked, the relays forward while they send; after every worker, one signal per relayed
// source to each rank of my server.
void send_rows(PathContext& m, const DispatchStep& s) {
  const SendPlan p = plan_send(m, *s.h);
  m.call.relay_stage.resize(p.relay_first.back() * m.setup.geo.relay_record_bytes());
  if (s.expert_base) m.stage_meta(*s.h);
  m.run_workers([&](int w) { send_worker(m, s, p, w); });
  for (int src : p.sources)
    for (int d : m.setup.server_members) m.setup.transport.signal(d, m.setup.geo.forward_signal(src), m.call.epoch, 0);
}

class Relay final : public DispatchPath {
 public:
  void add_counts(PathContext m, HandleState& h, std::vector<std::int32_t>& counts) const override {
    const std::vector<std::int32_t> relayed = relay_counts(m, h);
    counts.insert(counts.end(), relayed.begin(), relayed.end());
  }
  void plan(PathContext m, HandleState& h, const Peers& peers) const override { plan_relay(m, h, peers); }
  void send(PathContext m, const DispatchStep& s) const override { send_rows(m, s); }

  void receive(PathContext m, const DispatchStep& s) const override {
    if (m.setup.relay_chunk_rows == 0) forward_relayed(m, *s.h, RowBytes{s.row_bytes, s.scale_bytes, s.fresh, s.landing});
    // Same server: the source's own signals; other servers: the relay's, one per source.
    Impl::PhaseTimer timer = m.timer(0, Phase::kWaitData);
    Impl::WaitClock::time_point since = Impl::WaitClock::now();
    for (int i = 0; i < m.setup.P; ++i) {
      const int src = m.wait_source(i);
      if (!crosses(m, src)) {
        for (int w = 0; w < m.setup.W; ++w) m.setup.transport.wait_signal(m.setup.geo.dispatch_signal(src, w), m.call.epoch, {"dispatch data", src});
      } else {
        m.setup.transport.wait_signal(m.setup.geo.forward_signal(src), m.call.epoch, {"dispatch data (relayed)", relay_rank(m.setup.topology, src, m.setup.rank)});
      }
      since = m.lap_wait(0, src, since);
    }
  }

  void keep(PathContext m, HandleState& h) const override { keep_reply_rows(m, h); }
};

// The relay path's row: explicit or tail (a relay forwards on a source's signal), views,
// both layouts; the base path of the hierarchical schedule.
constexpr spi::PathRule kRelayRow{spi::Path::kRelay, "schedule 'hierarchical'", {true, true, false},
                                  "relays forward a source's rows when its signal arrives (use explicit or tail)", true, true, false,
                                  false, nullptr, true, "relay", true, [](const BufferConfig& c) {
                                    return c.ring_rows <= 0 && c.dataplane.schedule.kind == ScheduleKind::kHierarchical;
                                  }};

}  // namespace

const PathUnit& relay_path() {
  static const Relay unit;
  static const PathUnit path{kRelayRow, &unit, &relay_combine()};
  return path;
}

}  // namespace epx::detail
