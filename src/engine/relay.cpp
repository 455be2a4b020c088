// The hierarchical schedule: a token whose destinations include ranks of another server is
// sent there once, to the rank of that server with my lane (its relay), with a record that
// says, per lane of that server, the row's slot at that rank and its metadata. The relay
// forwards the row inside its server and then tells each final rank, with one signal per
// source, that the source's rows have landed. Rows land in exactly the slots a direct send
// would use, so every output is the same bits. Combine reverses the path: an expert rank
// puts its reply to another server's source into its relay's area (the relay is in its own
// server), and the relay forwards every reply to the source's reply slot. The relay does
// not add partials: that would change the order of additions SPEC §4 fixes.
#include <algorithm>

#include "engine.hpp"

namespace epx {

using detail::HandleState;
using detail::Region;
using detail::RowMetaView;
using detail::split_range;

std::vector<int> Buffer::Impl::relayed_sources() const {
  const RankPlace& me = topology.ranks[static_cast<std::size_t>(rank)];
  std::vector<int> sources;
  for (int i = 1; i < P; ++i) {
    const int s = (rank + i) % P;
    const RankPlace& place = topology.ranks[static_cast<std::size_t>(s)];
    if (place.server != me.server && place.lane == me.lane) sources.push_back(s);
  }
  return sources;
}

std::vector<std::int32_t> Buffer::Impl::relay_counts(HandleState& h) const {
  const RoutingPlan& plan = h.plan;
  const int my_server = topology.ranks[static_cast<std::size_t>(rank)].server;
  h.relay_tokens.assign(static_cast<std::size_t>(P), {});
  for (std::int64_t t = 0; t < plan.shape.num_tokens; ++t)
    for (std::int32_t i = plan.token_begin[static_cast<std::size_t>(t)]; i < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++i) {
      const int d = plan.entry_rank[static_cast<std::size_t>(i)];
      if (topology.ranks[static_cast<std::size_t>(d)].server == my_server) continue;
      auto& tokens = h.relay_tokens[static_cast<std::size_t>(relay_rank(topology, rank, d))];
      if (tokens.empty() || tokens.back() != t) tokens.push_back(static_cast<std::int32_t>(t));  // once per server
    }
  std::vector<std::int32_t> counts(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) counts[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(h.relay_tokens[static_cast<std::size_t>(r)].size());
  return counts;
}

void Buffer::Impl::plan_relay(HandleState& h, const Peers& peers) const {
  const int first = P + config.num_experts;  // relay counts follow tokens and slots
  h.relay_base.assign(static_cast<std::size_t>(P), 0);
  h.relayed_begin.assign(static_cast<std::size_t>(P) + 1, 0);
  for (int r = 0; r < P; ++r)
    for (int s = 0; s < rank; ++s) h.relay_base[static_cast<std::size_t>(r)] += peers.counts(s)[first + r];
  for (int s = 0; s < P; ++s)
    h.relayed_begin[static_cast<std::size_t>(s) + 1] = h.relayed_begin[static_cast<std::size_t>(s)] + peers.counts(s)[first + rank];
  if (h.relayed_begin.back() > geo.relay_rows())
    throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank) + ": relays " + std::to_string(h.relayed_begin.back()) +
                                          " rows but its relay area holds " + std::to_string(geo.relay_rows()), rank);
}

void Buffer::Impl::put_relayed_rows(Sender& send, const HandleState& h, const DispatchArgs& a, int relay, std::int64_t t0,
                                    std::int64_t t1, const std::vector<std::int32_t>* expert_base, std::byte* records) {
  const std::vector<std::int32_t>& tokens = h.relay_tokens[static_cast<std::size_t>(relay)];
  const std::int64_t i0 = std::lower_bound(tokens.begin(), tokens.end(), t0) - tokens.begin();
  const std::int64_t i1 = std::lower_bound(tokens.begin(), tokens.end(), t1) - tokens.begin();
  if (i0 == i1) return;
  const bool fp8 = a.x.dtype == DType::kFP8E4M3;
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * dtype_size(a.x.dtype);
  const std::size_t scale_bytes = fp8 ? static_cast<std::size_t>(config.hidden / 128) * sizeof(float) : 0;
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
  const int server = topology.ranks[static_cast<std::size_t>(relay)].server;
  std::vector<int> members;
  for (int d = 0; d < P; ++d)
    if (topology.ranks[static_cast<std::size_t>(d)].server == server) members.push_back(d);
  std::sort(members.begin(), members.end(), [&](int u, int v) {
    return topology.ranks[static_cast<std::size_t>(u)].lane < topology.ranks[static_cast<std::size_t>(v)].lane;
  });
  const std::size_t lanes = members.size();
  for (std::int64_t i = i0; i < i1; ++i) {
    const detail::RelayRecordView rec = geo.relay_record(records, i);
    std::fill(rec.slot, rec.slot + lanes, -1);
    std::fill(rec.reply_row, rec.reply_row + lanes, -1);
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    for (std::int32_t e = plan.token_begin[static_cast<std::size_t>(t)]; e < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++e) {
      const int d = plan.entry_rank[static_cast<std::size_t>(e)];
      const auto lane = std::find(members.begin(), members.end(), d) - members.begin();
      if (static_cast<std::size_t>(lane) == lanes) continue;
      const std::int64_t position = plan.entry_position[static_cast<std::size_t>(e)];
      rec.slot[lane] = static_cast<std::int32_t>(geo.send_row(h, d, position, false));
      rec.reply_row[lane] = static_cast<std::int32_t>(geo.replied_row(h, d, position));
      if (expert_base) {
        RowMetaView m = geo.meta_row(rec.meta, static_cast<std::int64_t>(lane));
        fill_meta(m, h, a, d, t, *expert_base);
        *m.relay_row = static_cast<std::int32_t>(base + i);
      }
    }
  }
  send.put_rows(relay, Region::kRelayRecord, base + i0, records + geo.relay_record_offset(i0), i1 - i0, geo.relay_record_bytes());
}

void Buffer::Impl::forward_relayed(const HandleState& h, bool with_meta, std::size_t row_bytes, std::size_t scale_bytes) {
  const std::vector<int> sources = relayed_sources();
  std::byte* window_base = transport.window();
  const std::size_t lanes = server_members.size();
  run_workers([&](int w) {
    WorkerStats* ws = config.collect_stats ? &stats.workers[static_cast<std::size_t>(w)] : nullptr;
    for (std::size_t k = static_cast<std::size_t>(w); k < sources.size(); k += static_cast<std::size_t>(W)) {
      const int s = sources[k];
      {
        PhaseTimer timer(*this, w, Phase::kWaitData);
        for (int sw = 0; sw < W; ++sw) transport.wait_signal(geo.dispatch_signal(s, sw), epoch, {"dispatch relay", s});
      }
      PhaseTimer timer(*this, w, Phase::kPutIssue);
      auto put = [&](int d, std::size_t offset, const std::byte* from, std::size_t bytes) {
        transport.put(d, offset, from, bytes, 0);
        if (ws) count_put(*ws, d, bytes, 0);
      };
      for (std::int64_t i = h.relayed_begin[static_cast<std::size_t>(s)]; i < h.relayed_begin[static_cast<std::size_t>(s) + 1]; ++i) {
        const detail::RelayRecordView rec = geo.relay_record(window_base + geo.region(Region::kRelayRecord), i);
        for (std::size_t lane = 0; lane < lanes; ++lane) {
          if (rec.slot[lane] < 0) continue;
          const int d = server_members[lane];
          const std::int64_t to = rec.slot[lane];
          put(d, geo.row(Region::kData, to, row_bytes), window_base + geo.row(Region::kRelay, i, row_bytes), row_bytes);
          if (scale_bytes)
            put(d, geo.row(Region::kScales, to, scale_bytes), window_base + geo.row(Region::kRelayScales, i, scale_bytes), scale_bytes);
          if (with_meta)
            put(d, geo.row(Region::kMeta, to, geo.meta_bytes()), geo.meta_record(rec.meta, static_cast<std::int64_t>(lane)),
                geo.meta_bytes());
        }
      }
      transport.quiet(0);
      for (int d : server_members) transport.signal(d, geo.forward_signal(s), epoch, 0);
    }
  });
}

void Buffer::Impl::keep_reply_rows(HandleState& h) const {
  const std::size_t lanes = server_members.size(), rows = static_cast<std::size_t>(h.relayed_begin.back());
  h.relayed_reply_row.resize(rows * lanes);
  for (std::size_t i = 0; i < rows; ++i) {
    const detail::RelayRecordView rec = geo.relay_record(transport.window() + geo.region(Region::kRelayRecord), static_cast<std::int64_t>(i));
    std::copy(rec.reply_row, rec.reply_row + lanes, h.relayed_reply_row.begin() + static_cast<std::ptrdiff_t>(i * lanes));
  }
}

void Buffer::Impl::forward_replies(const HandleState& h) {
  const std::vector<int> sources = relayed_sources();
  const std::byte* window_base = transport.window();
  const std::size_t lanes = server_members.size();
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * sizeof(std::uint16_t);
  {  // every member of my server has put all its replies to me
    PhaseTimer timer(*this, 0, Phase::kWaitData);
    for (int d : server_members)
      for (int w = 0; w < W; ++w) transport.wait_signal(geo.combine_signal(d, w), epoch, {"combine relay", d});
  }
  run_workers([&](int w) {
    PhaseTimer timer(*this, w, Phase::kPutIssue);
    WorkerStats* ws = config.collect_stats ? &stats.workers[static_cast<std::size_t>(w)] : nullptr;
    for (std::size_t k = static_cast<std::size_t>(w); k < sources.size(); k += static_cast<std::size_t>(W)) {
      const int s = sources[k];
      for (std::int64_t i = h.relayed_begin[static_cast<std::size_t>(s)]; i < h.relayed_begin[static_cast<std::size_t>(s) + 1]; ++i) {
        const std::int32_t* reply_row = h.relayed_reply_row.data() + static_cast<std::size_t>(i) * lanes;
        for (std::size_t lane = 0; lane < lanes; ++lane) {
          if (reply_row[lane] < 0) continue;
          const std::byte* from = window_base + geo.row(Region::kRelayReplies, geo.relay_reply_row(i, static_cast<int>(lane)), row_bytes);
          transport.put(s, geo.row(Region::kReplies, reply_row[lane], row_bytes), from, row_bytes, 0);
          if (ws) count_put(*ws, s, row_bytes, 0);
        }
      }
      transport.quiet(0);
      transport.signal(s, geo.forward_signal(rank), epoch, 0);
    }
  });
}

void Buffer::Impl::fill_meta(RowMetaView m, const HandleState& h, const DispatchArgs& a, int d, std::int32_t t,
                             const std::vector<std::int32_t>& expert_base) const {
  const int K = config.num_topk;
  *m.token = t;
  *m.relay_row = -1;
  const std::int64_t* idx = a.topk_idx.as<std::int64_t>() + static_cast<std::int64_t>(t) * K;
  const float* wts = a.topk_weights.as<float>() + static_cast<std::int64_t>(t) * K;
  for (int k = 0; k < K; ++k) {
    m.topk_idx[k] = idx[k];
    m.weights[k] = wts[k];
    const bool here = idx[k] >= 0 && idx[k] / L == d;
    const std::int32_t eb = here ? expert_base[static_cast<std::size_t>(idx[k])] : -1;
    m.slot_row[k] = eb >= 0 ? eb + h.plan.slot_rank_in_expert[static_cast<std::size_t>(t) * static_cast<std::size_t>(K) +
                                                               static_cast<std::size_t>(k)]
                            : -1;
  }
}

}  // namespace epx
