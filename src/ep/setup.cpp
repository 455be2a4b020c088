// Building a Buffer's Setup: the config checked against the transport and the support
// table, agreed on by every rank, then the ranks' places and the window's geometry.
#include "setup.hpp"

#include <algorithm>
#include <random>
#include <thread>
#include <utility>

#include "path.hpp"
#include "send_policy.hpp"
#include "epx/spi/support.hpp"

namespace epx::detail {
namespace {

int auto_workers(int num_ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / num_ranks);
}

std::string check_config(const BufferConfig& c, int P) {
  if (c.num_experts <= 0) return "num_experts must be > 0, got " + std::to_string(c.num_experts);
  if (c.num_experts % P != 0)
    return "num_experts E = " + std::to_string(c.num_experts) + " is not a multiple of the number of ranks P = " +
           std::to_string(P) + " (E % P must be 0)";
  if (c.hidden <= 0) return "hidden must be > 0, got " + std::to_string(c.hidden);
  if (c.num_topk <= 0) return "num_topk must be > 0, got " + std::to_string(c.num_topk);
  if (c.max_tokens_per_rank < 0) return "max_tokens_per_rank must be >= 0, got " + std::to_string(c.max_tokens_per_rank);
  if (c.max_recv_rows < 0) return "max_recv_rows must be >= 0, got " + std::to_string(c.max_recv_rows);
  if (c.num_workers < 0) return "num_workers must be >= 0, got " + std::to_string(c.num_workers);
  if (c.ring_rows < 0) return "ring_rows must be >= 0, got " + std::to_string(c.ring_rows);
  if (c.output_pool_bytes < -1)
    return "output_pool_bytes must be >= 0 (or -1: auto), got " + std::to_string(c.output_pool_bytes);
  return {};
}

// The data-plane options that fit neither the transport nor the table, or "" if they do;
// fills the table and the visiting order.
std::string check_dataplane(const BufferConfig& c, const Transport& t, Topology& topology, std::vector<int>& visit_order) {
  const DataPlaneOptions& o = c.dataplane;
  const TransportCaps& caps = t.caps();
  if (o.queues < 1 || o.queues > kMaxStatQueues || o.queues > caps.max_queues)
    return "queues must be 1.." + std::to_string(std::min(kMaxStatQueues, caps.max_queues)) + " on transport '" +
           caps.name + "', got " + std::to_string(o.queues);
  if (o.queue_split.kind == QueueSplitKind::kRatio && static_cast<int>(o.queue_split.ratio.size()) != o.queues)
    return "queue split " + to_string(o.queue_split) + " has " + std::to_string(o.queue_split.ratio.size()) +
           " parts but there are " + std::to_string(o.queues) + " queues";
  // Path x protocol x transport guarantee: the one support table.
  if (std::string why = spi::refuse_config(c, caps); !why.empty()) return why;
  try {
    topology = load_topology(o.topology, t.num_ranks());
    for (const auto& round : peer_rounds(o.schedule, topology, t.rank()))
      visit_order.insert(visit_order.end(), round.begin(), round.end());
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// Everything that must be equal on every rank.
std::vector<AgreedValue> agreed_values(const BufferConfig& c, int W) {
  const DataPlaneOptions& o = c.dataplane;
  std::string ratio;
  for (int r : o.queue_split.ratio) ratio += (ratio.empty() ? "" : ":") + std::to_string(r);
  const auto n = [](auto v) { return std::to_string(v); };
  return {{"num_experts", n(c.num_experts)},
          {"hidden", n(c.hidden)},
          {"num_topk", n(c.num_topk)},
          {"max_tokens_per_rank", n(c.max_tokens_per_rank)},
          {"max_recv_rows", n(c.max_recv_rows)},
          {"num_workers", n(W)},
          {"topology", o.topology},
          {"schedule", n(static_cast<int>(o.schedule.kind))},
          {"schedule group width", n(o.schedule.group_width)},
          {"queues", n(o.queues)},
          {"queue split", n(static_cast<int>(o.queue_split.kind))},
          {"queue split ratio", ratio},
          {"aggregate_bytes", n(o.aggregate_bytes)},
          {"protocol", n(static_cast<int>(o.protocol))},
          {"ring_rows", n(c.ring_rows)},
          {"output_pool_bytes", n(c.output_pool_bytes)},
          {"combine order", to_string(o.combine_order)},
          {"combine replies", to_string(o.combine_replies)},
          {"replies_first_max_bytes", n(o.replies_first_max_bytes)},
          {"stream_min_call_bytes", n(o.stream_min_call_bytes)},
          {"relay_chunk_bytes", n(o.relay_chunk_bytes)},
          {"path", o.path}};
}

}  // namespace

struct Setup::Draft {
  BufferConfig config;
  int rank = 0, P = 0, L = 1, W = 1;
  std::uint64_t buffer_id = 0;
  Topology topology;
  std::vector<int> visit_order, reply_order;
  std::vector<std::vector<int>> reply_sources;
  std::vector<int> server_members;
  std::int64_t relay_chunk_rows = 0;
  Geometry geo;

  static Draft of(Transport& t, const BufferConfig& c, const Agree& agree);
};

Setup::Draft Setup::Draft::of(Transport& t, const BufferConfig& c, const Agree& agree) {
  Draft d;
  d.config = c;
  d.rank = t.rank();
  d.P = t.num_ranks();
  d.L = c.num_experts > 0 && c.num_experts % d.P == 0 ? c.num_experts / d.P : 1;
  d.W = c.num_workers > 0 ? c.num_workers : auto_workers(d.P);
  d.buffer_id = std::random_device{}() ^ (static_cast<std::uint64_t>(std::random_device{}()) << 32);
  // 1. Agree on the config before sizing anything by it (the base's small window).
  std::string problem = check_config(c, d.P);
  if (problem.empty()) problem = check_dataplane(c, t, d.topology, d.visit_order);
  agree(agreed_values(c, d.W), problem);
  // 2. The window's layout, sized from the agreed config.
  const bool hierarchical = c.dataplane.schedule.kind == ScheduleKind::kHierarchical;
  ReplyChannels channels = reply_channels(d.topology, d.rank, d.P, d.visit_order, hierarchical);
  d.reply_order = std::move(channels.order);
  d.reply_sources = std::move(channels.sources);
  d.server_members = std::move(channels.members);
  if (hierarchical)
    d.relay_chunk_rows = detail::relay_chunk_rows(c.dataplane.relay_chunk_bytes, static_cast<std::size_t>(c.hidden) * sizeof(std::uint16_t), t.caps());
  d.geo = Geometry(GeometryShape::of(d.config, d.P, d.W, channels.servers, std::max<int>(1, static_cast<int>(d.server_members.size()))));
  // With no payload values the auto pool is none (PayloadPolicy::output_pool_bytes); the
  // geometry above keeps its bytes, the size a real window has.
  d.config.output_pool_bytes = PayloadPolicy(dynamic_cast<sim::ModelTransport*>(&t)).output_pool_bytes(c.output_pool_bytes);
  return d;
}

Setup::Setup(Transport& t, const BufferConfig& c, const Agree& agree) : Setup(t, Draft::of(t, c, agree)) {}

Setup::Setup(Transport& t, Draft&& d)
    : transport(t),
      model(dynamic_cast<sim::ModelTransport*>(&t)),
      payload(model),
      config(std::move(d.config)),
      rank(d.rank),
      P(d.P),
      L(d.L),
      W(d.W),
      buffer_id(d.buffer_id),
      topology(std::move(d.topology)),
      visit_order(std::move(d.visit_order)),
      reply_order(std::move(d.reply_order)),
      reply_sources(std::move(d.reply_sources)),
      server_members(std::move(d.server_members)),
      relay_chunk_rows(d.relay_chunk_rows),
      geo(d.geo),
      zero_row(static_cast<std::size_t>(std::max(config.hidden, 0)), 0) {}

std::vector<int> Setup::relayed_sources() const {
  const RankPlace& me = topology.ranks[static_cast<std::size_t>(rank)];
  std::vector<int> sources;
  for (int i = 1; i < P; ++i) {
    const int s = (rank + i) % P;
    const RankPlace& place = topology.ranks[static_cast<std::size_t>(s)];
    if (place.server != me.server && place.lane == me.lane) sources.push_back(s);
  }
  return sources;
}

}  // namespace epx::detail
