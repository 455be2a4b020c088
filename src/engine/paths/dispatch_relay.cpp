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
#include <algorithm>

#include "../path.hpp"

namespace epx::detail {
namespace {

// Fresh dispatch: my tokens per relay (once per server), kept in h.relay_tokens.
std::vector<std::int32_t> relay_counts(Impl& m, HandleState& h) {
  const RoutingPlan& plan = h.plan;
  const int my_server = m.topology.ranks[static_cast<std::size_t>(m.rank)].server;
  h.relay_tokens.assign(static_cast<std::size_t>(m.P), {});
  for (std::int64_t t = 0; t < plan.shape.num_tokens; ++t)
    for (std::int32_t i = plan.token_begin[static_cast<std::size_t>(t)]; i < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++i) {
      const int d = plan.entry_rank[static_cast<std::size_t>(i)];
      if (m.topology.ranks[static_cast<std::size_t>(d)].server == my_server) continue;
      auto& tokens = h.relay_tokens[static_cast<std::size_t>(relay_rank(m.topology, m.rank, d))];
      if (tokens.empty() || tokens.back() != t) tokens.push_back(static_cast<std::int32_t>(t));  // once per server
    }
  std::vector<std::int32_t> counts(static_cast<std::size_t>(m.P));
  for (int r = 0; r < m.P; ++r) counts[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(h.relay_tokens[static_cast<std::size_t>(r)].size());
  return counts;
}

// Fresh dispatch, after plan_slots: where my relayed rows go in each relay's area, and
// which rows I relay for each source.
void plan_relay(Impl& m, HandleState& h, const Peers& peers) {
  const int first = m.P + m.config.num_experts;  // relay counts follow tokens and slots
  h.relay_base.assign(static_cast<std::size_t>(m.P), 0);
  h.relayed_begin.assign(static_cast<std::size_t>(m.P) + 1, 0);
  for (int r = 0; r < m.P; ++r)
    for (int s = 0; s < m.rank; ++s) h.relay_base[static_cast<std::size_t>(r)] += peers.counts(s)[first + r];
  for (int s = 0; s < m.P; ++s)
    h.relayed_begin[static_cast<std::size_t>(s) + 1] = h.relayed_begin[static_cast<std::size_t>(s)] + peers.counts(s)[first + m.rank];
  h.relayed_begin_at.assign(static_cast<std::size_t>(m.P), {});
  for (int d : m.server_members) {
    std::vector<std::int64_t>& begin = h.relayed_begin_at[static_cast<std::size_t>(d)];
    begin.assign(static_cast<std::size_t>(m.P) + 1, 0);
    for (int s = 0; s < m.P; ++s) begin[static_cast<std::size_t>(s) + 1] = begin[static_cast<std::size_t>(s)] + peers.counts(s)[first + d];
  }
  // Node-first combine: source s's tokens through relays below r = where r's sums for s start
  // in s's relay area (paths/combine_relay.cpp).
  auto sums_before = [&](int s, int relay) {
    std::int64_t n = 0;
    for (int r = 0; r < relay; ++r) n += peers.counts(s)[first + r];
    return n;
  };
  h.sums_at_source.assign(static_cast<std::size_t>(m.P), 0);
  h.my_sums.assign(static_cast<std::size_t>(m.P), 0);
  for (int p = 0; p < m.P; ++p) {
    h.sums_at_source[static_cast<std::size_t>(p)] = sums_before(p, m.rank);
    h.my_sums[static_cast<std::size_t>(p)] = sums_before(m.rank, p);
  }
  if (h.relayed_begin.back() > m.geo.relay_rows())
    throw Error(ErrorCode::kInternal, "rank " + std::to_string(m.rank) + ": relays " + std::to_string(h.relayed_begin.back()) +
                                          " rows but its relay area holds " + std::to_string(m.geo.relay_rows()), m.rank);
}

// My rows in [t0, t1) that cross to relay's server, with their records (built in `records`).
void put_relayed_rows(Impl& m, Impl::Sender& send, const HandleState& h, const DispatchArgs& a, int relay, std::int64_t t0,
                                    std::int64_t t1, const std::vector<std::int32_t>* expert_base, std::byte* records) {
  const std::vector<std::int32_t>& tokens = h.relay_tokens[static_cast<std::size_t>(relay)];
  const std::int64_t i0 = std::lower_bound(tokens.begin(), tokens.end(), t0) - tokens.begin();
  const std::int64_t i1 = std::lower_bound(tokens.begin(), tokens.end(), t1) - tokens.begin();
  if (i0 == i1) return;
  const bool fp8 = a.x.dtype == DType::kFP8E4M3;
  const std::size_t row_bytes = static_cast<std::size_t>(m.config.hidden) * dtype_size(a.x.dtype);
  const std::size_t scale_bytes = fp8 ? static_cast<std::size_t>(m.config.hidden / 128) * sizeof(float) : 0;
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* scales = static_cast<const std::byte*>(a.x_scales.data);
  const std::int64_t base = h.relay_base[static_cast<std::size_t>(relay)];
  for (std::int64_t i = i0; i < i1;) {
    std::int64_t j = i + 1;
    while (j < i1 && tokens[static_cast<std::size_t>(j)] == tokens[static_cast<std::size_t>(j) - 1] + 1) ++j;
    const auto t = static_cast<std::size_t>(tokens[static_cast<std::size_t>(i)]);
    send.put_rows(relay, Region::kRelay, base + i, x + t * row_bytes, j - i, row_bytes);
    if (fp8) send.put_rows(relay, Region::kRelayScales, base + i, scales + t * scale_bytes, j - i, scale_bytes);
    i = j;
  }
  // Records: per lane of the relay's server, the slot there and the row's metadata.
  const RoutingPlan& plan = h.plan;
  const int server = m.topology.ranks[static_cast<std::size_t>(relay)].server;
  std::vector<int> members;
  for (int d = 0; d < m.P; ++d)
    if (m.topology.ranks[static_cast<std::size_t>(d)].server == server) members.push_back(d);
  std::sort(members.begin(), members.end(), [&](int u, int v) {
    return m.topology.ranks[static_cast<std::size_t>(u)].lane < m.topology.ranks[static_cast<std::size_t>(v)].lane;
  });
  const std::size_t lanes = members.size();
  for (std::int64_t i = i0; i < i1; ++i) {
    const detail::RelayRecordView rec = m.geo.relay_record(records, i);
    std::fill(rec.slot, rec.slot + lanes, -1);
    std::fill(rec.reply_row, rec.reply_row + lanes, -1);
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    for (std::int32_t e = plan.token_begin[static_cast<std::size_t>(t)]; e < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++e) {
      const int d = plan.entry_rank[static_cast<std::size_t>(e)];
      const auto lane = std::find(members.begin(), members.end(), d) - members.begin();
      if (static_cast<std::size_t>(lane) == lanes) continue;
      const std::int64_t position = plan.entry_position[static_cast<std::size_t>(e)];
      rec.slot[lane] = static_cast<std::int32_t>(m.geo.send_row(h, d, position, false));
      rec.reply_row[lane] = static_cast<std::int32_t>(m.geo.replied_row(h, d, position));
      if (expert_base) {
        RowMetaView meta = m.geo.meta_row(rec.meta, static_cast<std::int64_t>(lane));
        m.fill_meta(meta, h, a, d, t, *expert_base);
        *meta.relay_row = static_cast<std::int32_t>(base + i);
      }
    }
  }
  send.put_rows(relay, Region::kRelayRecord, base + i0, records + m.geo.relay_record_offset(i0), i1 - i0, m.geo.relay_record_bytes());
}

// At a relay: each source's rows (after its completion signals) on to their final ranks
// in my server, then one signal per source to each.
void forward_relayed(Impl& m, const HandleState& h, bool with_meta, std::size_t row_bytes, std::size_t scale_bytes) {
  const std::vector<int> sources = m.relayed_sources();
  std::byte* window_base = m.transport.window();
  const std::size_t lanes = m.server_members.size();
  m.run_workers([&](int w) {
    WorkerStats* ws = m.config.collect_stats ? &m.stats.workers[static_cast<std::size_t>(w)] : nullptr;
    for (std::size_t k = static_cast<std::size_t>(w); k < sources.size(); k += static_cast<std::size_t>(m.W)) {
      const int s = sources[k];
      {
        Impl::PhaseTimer timer(m, w, Phase::kWaitData);
        const Impl::WaitClock::time_point since = Impl::WaitClock::now();
        for (int sw = 0; sw < m.W; ++sw) m.transport.wait_signal(m.geo.dispatch_signal(s, sw), m.epoch, {"dispatch relay", s});
        m.lap_wait(w, s, since);
      }
      Impl::PhaseTimer timer(m, w, Phase::kPutIssue);
      auto put = [&](int d, std::size_t offset, const std::byte* from, std::size_t bytes) {
        m.transport.put(d, offset, from, bytes, 0);
        if (ws) m.count_put(*ws, d, bytes, 0);
      };
      for (std::int64_t i = h.relayed_begin[static_cast<std::size_t>(s)]; i < h.relayed_begin[static_cast<std::size_t>(s) + 1]; ++i) {
        const detail::RelayRecordView rec = m.geo.relay_record(window_base + m.geo.region(Region::kRelayRecord), i);
        for (std::size_t lane = 0; lane < lanes; ++lane) {
          if (rec.slot[lane] < 0) continue;
          const int d = m.server_members[lane];
          const std::int64_t to = rec.slot[lane];
          put(d, m.geo.row(Region::kData, to, row_bytes), window_base + m.geo.row(Region::kRelay, i, row_bytes), row_bytes);
          if (scale_bytes)
            put(d, m.geo.row(Region::kScales, to, scale_bytes), window_base + m.geo.row(Region::kRelayScales, i, scale_bytes), scale_bytes);
          if (with_meta)
            put(d, m.geo.row(Region::kMeta, to, m.geo.meta_bytes()), m.geo.meta_record(rec.meta, static_cast<std::int64_t>(lane)),
                m.geo.meta_bytes());
        }
      }
      m.transport.quiet(0);
      for (int d : m.server_members) m.transport.signal(d, m.geo.forward_signal(s), m.epoch, 0);
    }
  });
}

// Fresh dispatch, at a relay: keeps the records' reply rows for this handle's combines.
void keep_reply_rows(Impl& m, HandleState& h) {
  const std::size_t lanes = m.server_members.size(), rows = static_cast<std::size_t>(h.relayed_begin.back());
  h.relayed_reply_row.resize(rows * lanes);
  for (std::size_t i = 0; i < rows; ++i) {
    const detail::RelayRecordView rec = m.geo.relay_record(m.transport.window() + m.geo.region(Region::kRelayRecord), static_cast<std::int64_t>(i));
    std::copy(rec.reply_row, rec.reply_row + lanes, h.relayed_reply_row.begin() + static_cast<std::ptrdiff_t>(i * lanes));
  }
}

bool crosses(const Impl& m, int d) {
  return m.topology.ranks[static_cast<std::size_t>(d)].server != m.topology.ranks[static_cast<std::size_t>(m.rank)].server;
}

// Every worker's rows: to my server's ranks direct, to each other server's relay once per
// token with its records (staged per relay in relay_stage, which outlives the puts).
void send_rows(Impl& m, const DispatchStep& s) {
  const HandleState& h = *s.h;
  const RoutingPlan& plan = h.plan;
  const int P = m.P;
  std::vector<std::size_t> relay_first(static_cast<std::size_t>(P) + 1, 0);
  for (int r = 0; r < P; ++r)
    relay_first[static_cast<std::size_t>(r) + 1] = relay_first[static_cast<std::size_t>(r)] + h.relay_tokens[static_cast<std::size_t>(r)].size();
  m.relay_stage.resize(relay_first.back() * m.geo.relay_record_bytes());
  if (s.expert_base) m.stage_meta(h);
  const std::size_t meta_bytes = s.expert_base ? m.geo.meta_bytes() : 0;
  m.run_workers([&](int w) {
    Impl::PhaseTimer timer(m, w, Phase::kPutIssue);
    const auto [t0, t1] = split_range(plan.shape.num_tokens, w, m.W);
    std::vector<std::pair<std::int64_t, std::int64_t>> part(static_cast<std::size_t>(P));
    std::vector<std::uint64_t> channel_bytes(static_cast<std::size_t>(P));
    for (int d = 0; d < P; ++d) {
      const auto ud = static_cast<std::size_t>(d);
      part[ud] = Impl::segment_part(plan, d, t0, t1);
      channel_bytes[ud] = static_cast<std::uint64_t>(part[ud].second - part[ud].first) * (s.row_bytes + s.scale_bytes + meta_bytes);
      if (crosses(m, d)) {
        const auto& tokens = h.relay_tokens[ud];
        const auto n = std::lower_bound(tokens.begin(), tokens.end(), t1) - std::lower_bound(tokens.begin(), tokens.end(), t0);
        channel_bytes[ud] = static_cast<std::uint64_t>(n) * (s.row_bytes + s.scale_bytes + m.geo.relay_record_bytes());
      }
    }
    // visit_order holds my server's ranks and one relay per other server; the relays go
    // first, so the rows crossing servers travel while the local ones are copied.
    Impl::Sender send(m, w, m.geo.dispatch_signal(m.rank, w), channel_bytes, m.visit_order);
    std::vector<int> order = m.visit_order;
    std::stable_partition(order.begin(), order.end(), [&](int d) { return crosses(m, d); });
    for (int d : order) {
      const auto ud = static_cast<std::size_t>(d);
      if (crosses(m, d))
        put_relayed_rows(m, send, h, *s.a, d, t0, t1, s.expert_base,
                         m.relay_stage.data() + m.geo.relay_record_offset(static_cast<std::int64_t>(relay_first[ud])));
      else
        m.put_segment(send, h, *s.a, s.expert_base, d, part[ud].first, part[ud].second, m.geo.send_row(h, d, 0, false),
                      (*s.landing)[ud]);
      send.end_channel(d);
    }
    send.finish();
  });
}

class Relay final : public DispatchPath {
 public:
  void add_counts(Impl& m, HandleState& h, std::vector<std::int32_t>& counts) const override {
    const std::vector<std::int32_t> relayed = relay_counts(m, h);
    counts.insert(counts.end(), relayed.begin(), relayed.end());
  }
  void plan(Impl& m, HandleState& h, const Peers& peers) const override { plan_relay(m, h, peers); }
  void send(Impl& m, const DispatchStep& s) const override { send_rows(m, s); }

  void receive(Impl& m, const DispatchStep& s) const override {
    forward_relayed(m, *s.h, s.fresh, s.row_bytes, s.scale_bytes);
    // Same server: the source's own signals; other servers: the relay's, one per source.
    Impl::PhaseTimer timer(m, 0, Phase::kWaitData);
    Impl::WaitClock::time_point since = Impl::WaitClock::now();
    for (int i = 0; i < m.P; ++i) {
      const int src = m.wait_source(i);
      if (!crosses(m, src)) {
        for (int w = 0; w < m.W; ++w) m.transport.wait_signal(m.geo.dispatch_signal(src, w), m.epoch, {"dispatch data", src});
      } else {
        m.transport.wait_signal(m.geo.forward_signal(src), m.epoch, {"dispatch data (relayed)", relay_rank(m.topology, src, m.rank)});
      }
      since = m.lap_wait(0, src, since);
    }
  }

  void keep(Impl& m, HandleState& h) const override { keep_reply_rows(m, h); }
};

}  // namespace

const DispatchPath& relay_dispatch() {
  static const Relay unit;
  return unit;
}

}  // namespace epx::detail
