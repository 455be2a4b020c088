// Combine, relay path (spi::Path::kRelay: the hierarchical schedule). Combine reverses the
// dispatch's path: an expert rank puts its reply to another server's source into the
// relay's area — the rank of its own server with the source's lane (send_replies: the
// reply channels are my server's ranks, each carrying the replies of the sources it relays
// for, reply_sources) — and the relay, once every member of its server has signalled,
// forwards every reply to the source's reply slot (the reply rows the dispatch's records
// gave, kept in the handle) and signals the source once. The relay does not add partials:
// that would change the order of additions SPEC §4 fixes. The source then waits for its
// own server's ranks and each other server's relay, and reduces as push does.
#include <algorithm>

#include "../path.hpp"

namespace epx::detail {
namespace {

// At a relay: its server's replies to other servers' sources of my lane go on to those
// sources (after every member's completion signal), then one signal each.
void forward_replies(Impl& m, const HandleState& h) {
  const std::vector<int> sources = m.relayed_sources();
  const std::byte* window_base = m.transport.window();
  const std::size_t lanes = m.server_members.size();
  const std::size_t row_bytes = static_cast<std::size_t>(m.config.hidden) * sizeof(std::uint16_t);
  {  // every member of my server has put all its replies to me
    Impl::PhaseTimer timer(m, 0, Phase::kWaitData);
    for (int d : m.server_members)
      for (int w = 0; w < m.W; ++w) m.transport.wait_signal(m.geo.combine_signal(d, w), m.epoch, {"combine relay", d});
  }
  m.run_workers([&](int w) {
    Impl::PhaseTimer timer(m, w, Phase::kPutIssue);
    WorkerStats* ws = m.config.collect_stats ? &m.stats.workers[static_cast<std::size_t>(w)] : nullptr;
    for (std::size_t k = static_cast<std::size_t>(w); k < sources.size(); k += static_cast<std::size_t>(m.W)) {
      const int s = sources[k];
      for (std::int64_t i = h.relayed_begin[static_cast<std::size_t>(s)]; i < h.relayed_begin[static_cast<std::size_t>(s) + 1]; ++i) {
        const std::int32_t* reply_row = h.relayed_reply_row.data() + static_cast<std::size_t>(i) * lanes;
        for (std::size_t lane = 0; lane < lanes; ++lane) {
          if (reply_row[lane] < 0) continue;
          const std::byte* from = window_base + m.geo.row(Region::kRelayReplies, m.geo.relay_reply_row(i, static_cast<int>(lane)), row_bytes);
          m.transport.put(s, m.geo.row(Region::kReplies, reply_row[lane], row_bytes), from, row_bytes, 0);
          if (ws) m.count_put(*ws, s, row_bytes, 0);
        }
      }
      m.transport.quiet(0);
      m.transport.signal(s, m.geo.forward_signal(m.rank), m.epoch, 0);
    }
  });
}

class Relay final : public CombinePath {
 public:
  void send(Impl& m, const CombineStep& s) const override { m.send_replies(*s.h, *s.a, true); }

  void receive(Impl& m, const CombineStep& s) const override {
    forward_replies(m, *s.h);
    {  // My server's ranks answer directly; each other server's answers come from its relay.
      Impl::PhaseTimer timer(m, 0, Phase::kWaitData);
      Impl::WaitClock::time_point since = Impl::WaitClock::now();
      for (int d : m.server_members) {
        for (int w = 0; w < m.W; ++w) m.transport.wait_signal(m.geo.combine_signal(d, w), m.epoch, {"combine data", d});
        since = m.lap_wait(0, d, since);
      }
      const int my_server = m.topology.ranks[static_cast<std::size_t>(m.rank)].server;
      for (int d = 0; d < m.P; ++d) {
        const int relay = relay_rank(m.topology, m.rank, d);
        if (m.topology.ranks[static_cast<std::size_t>(d)].server != my_server && relay == d) {
          m.transport.wait_signal(m.geo.forward_signal(relay), m.epoch, {"combine data (relayed)", relay});
          since = m.lap_wait(0, relay, since);
        }
      }
    }
    m.reduce(*s.h, *s.a, nullptr, *s.out);
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
