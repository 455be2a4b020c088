#include "epx/sim/runner/run.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/progress.hpp"
#include "epx/bench/routing.hpp"
#include "epx/buffer.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/sim/launch.hpp"
#include "epx/sim/model_transport.hpp"

namespace epx::tools {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Zero-filled memory that costs nothing until written: untouched anonymous pages read as 0.
class ZeroMap {
 public:
  explicit ZeroMap(std::size_t bytes) : bytes_(std::max<std::size_t>(bytes, 4096)) {
    p_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p_ == MAP_FAILED) throw Error(ErrorCode::kCapacityExceeded, "epx sim: cannot map " + std::to_string(bytes_) + " bytes");
  }
  ~ZeroMap() { munmap(p_, bytes_); }
  ZeroMap(const ZeroMap&) = delete;
  ZeroMap& operator=(const ZeroMap&) = delete;
  void* data() const noexcept { return p_; }

 private:
  std::size_t bytes_;
  void* p_;
};

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// The engine's window layout (src/ep/buffer.cpp make_layout) for the payload region, used
// only while the engine does not announce it itself (set_payload_region): copy mode at a
// reduced hidden size then scales exactly these puts by H / H_run.
std::pair<std::size_t, std::size_t> fallback_payload_region(const BufferConfig& c, int P) {
  const std::size_t H = static_cast<std::size_t>(c.hidden), K = static_cast<std::size_t>(c.num_topk);
  constexpr std::size_t kNotifyHeader = 560;  // sizeof(detail::NotifyHeader)
  const std::size_t header = align_up(kNotifyHeader + 4 * static_cast<std::size_t>(P + c.num_experts), 64);
  const auto recv_rows = static_cast<std::size_t>(P) * static_cast<std::size_t>(c.max_tokens_per_rank);
  const std::size_t reply_rows = static_cast<std::size_t>(c.max_tokens_per_rank) * std::min<std::size_t>(K, static_cast<std::size_t>(P));
  const std::size_t data = align_up(2 * static_cast<std::size_t>(P) * header, 4096);
  const std::size_t replies = align_up(data + recv_rows * 2 * H, 4096);
  const std::size_t scales = align_up(replies + reply_rows * 2 * H, 64);
  const std::size_t scale_row = H % 128 == 0 ? H / 128 * 4 : 0;
  const std::size_t meta = align_up(scales + recv_rows * scale_row, 64);
  return {data, meta};
}

std::string topology_for(const SimOptions& o, int P) {
  return o.topology == "auto" ? sim::default_topology_spec(P, sim::load_hardware(o.hardware)) : o.topology;
}

// The schedule the engine runs: hierarchical on a table of one server has no other server
// to relay to (the engine refuses it), and is then what it means inside a server — every
// rank directly, in the rotated order (DeepEP's intranode kernels).
std::string engine_schedule(const SimOptions& o, const Topology& topology) {
  if (o.schedule != "hierarchical") return o.schedule;
  for (const RankPlace& p : topology.ranks)
    if (p.server != topology.ranks.front().server) return o.schedule;
  return "rotated";
}

BufferConfig buffer_config(const SimOptions& o, int hidden, double agg_scale, int P, std::int64_t pool_bytes) {
  BufferConfig c;
  c.num_experts = o.experts;
  c.hidden = hidden;
  c.num_topk = o.topk;
  c.max_tokens_per_rank = o.tokens;
  c.num_workers = o.workers;
  c.dataplane.topology = topology_for(o, P);
  const std::string schedule = engine_schedule(o, load_topology(c.dataplane.topology, P));
  c.dataplane.schedule = parse_schedule(schedule);
  // Inside one server there is nothing to sum first: node-first is the flat order there.
  c.dataplane.combine_order = parse_combine_order(schedule == "hierarchical" ? o.combine_order : "flat");
  c.dataplane.queues = o.queues;
  c.dataplane.queue_split = parse_queue_split(o.queue_split);
  c.dataplane.aggregate_bytes = static_cast<std::size_t>(std::llround(static_cast<double>(o.aggregate) * agg_scale));
  c.dataplane.protocol = parse_protocol(o.protocol);
  c.dataplane.send_policy = parse_send_policy(o.send_policy);
  if (c.dataplane.send_policy.kind == SendPolicyKind::kBlock)  // scaled like the aggregation (payload x H / H_run)
    c.dataplane.send_policy.block_bytes = static_cast<std::size_t>(
        std::max<long long>(1, std::llround(static_cast<double>(c.dataplane.send_policy.block_bytes) * agg_scale)));
  c.dataplane.combine_replies = parse_combine_replies(o.combine_replies);
  if (o.relay_chunk != "auto") {  // scaled like the aggregation (payload x H / H_run); 0 stays 0 (serial)
    const std::size_t bytes = parse_byte_size(o.relay_chunk);
    c.dataplane.relay_chunk_bytes =
        bytes == 0 ? 0 : static_cast<std::size_t>(std::max<long long>(1, std::llround(static_cast<double>(bytes) * agg_scale)));
  }
  c.ring_rows = o.ring_rows;
  c.collect_stats = o.collect_stats;
  if (o.one_copy) c.output_pool_bytes = pool_bytes;  // explicit: kept in model-only mode too (-1, auto, is not)
  return c;
}

sim::Picoseconds extra_sync(const SimOptions& o, const sim::HardwareModel& hw, int P) {
  if (o.sync == "barrier") return hw.barrier_cost(P);
  if (o.sync.rfind("credits:", 0) == 0) {
    const int w = std::max(1, std::atoi(o.sync.c_str() + 8));
    // Each rank returns one credit to each of the W-1 other members of its group and waits
    // for theirs: one hop, W-1 signal issues, one poll.
    return hw.link_latency.to_ps() + sim::Nanoseconds{hw.signal_issue.ns * (w - 1)}.to_ps() + hw.poll_latency.to_ps();
  }
  return sim::Picoseconds{0};
}

// Combine's two sums, from the routing (docs/sim.md §2): at the expert rank the slots of a
// row with several slots are summed into its partial on the vector units (a row with one
// slot passes through, unweighted); at the source, each token's partials are summed once
// the last has landed. Only where the replies travel straight to their source in the
// dispatch plan's order (not through relays or a bounded ring, whose order differs).
void add_combine_reduction(SimRun& run, const BenchProblem& problem, bool expanded, const SimOptions& o, std::uint64_t row_bytes) {
  if (engine_schedule(o, run.topology) == "hierarchical" || o.ring_rows > 0) return;
  const int P = run.ep, K = o.topk, L = o.experts / P;
  std::vector<std::int64_t> presum_slots(static_cast<std::size_t>(P), 0);
  std::vector<std::int32_t> slots_at(static_cast<std::size_t>(P), 0);
  for (int s = 0; s < P; ++s) {
    auto red = std::make_shared<sim::SourceReduction>();
    red->from.resize(static_cast<std::size_t>(P));
    red->row_bytes = row_bytes;
    const BenchRankInput& in = problem.rank[static_cast<std::size_t>(s)];
    red->partials.assign(static_cast<std::size_t>(in.tokens), 0);
    for (std::int64_t t = 0; t < in.tokens; ++t) {
      std::fill(slots_at.begin(), slots_at.end(), 0);
      for (int k = 0; k < K; ++k) {
        const std::int64_t e = in.topk_idx[static_cast<std::size_t>(t * K + k)];
        if (e >= 0) ++slots_at[static_cast<std::size_t>(e / L)];
      }
      for (int d = 0; d < P; ++d) {
        const std::int32_t n = slots_at[static_cast<std::size_t>(d)];
        if (n == 0) continue;
        red->from[static_cast<std::size_t>(d)].push_back(static_cast<std::int32_t>(t));
        ++red->partials[static_cast<std::size_t>(t)];
        if (n > 1) presum_slots[static_cast<std::size_t>(d)] += n;
      }
    }
    run.combine_compute[static_cast<std::size_t>(s)].reduction = std::move(red);
  }
  for (int d = 0; d < P; ++d) {
    const auto rows = static_cast<double>(run.recv_rows[static_cast<std::size_t>(d)]);
    if (expanded && rows > 0)
      run.combine_compute[static_cast<std::size_t>(d)].presum_per_payload_byte =
          static_cast<double>(presum_slots[static_cast<std::size_t>(d)]) / rows;
  }
}

// DeepEP's "bottleneck bandwidth" bytes per rank (docs/sim.md §8). Which definition applies
// follows epx's data path: the hierarchical schedule is DeepEP's normal kernels (NVLink
// forwarding) — inside one server its intranode definition (NVLink: received rows x the
// row), across servers its internode one (RDMA: my tokens once per destination server,
// the own included) — and every other schedule sends every peer directly, as its
// low-latency kernels do (the (token, expert) selections a rank receives). FP8 rows count
// H x 2 x (1 + 4/128) / 2 bytes (data + 4 B of scale per 128 values), BF16 rows 2H; the
// low-latency dispatch row is H + H/128 x 4 + 16.
void add_bottleneck_bytes(SimRun& run, const BenchProblem& problem, const RouteCount& count, const SimOptions& o) {
  const int P = run.ep, K = o.topk, L = o.experts / P;
  const double H = o.hidden;
  const double x_row = o.fp8 ? H * 2 * (1 + 4.0 / 128) / 2 : 2 * H, y_row = 2 * H;
  std::set<int> servers;
  for (const RankPlace& p : run.topology.ranks) servers.insert(p.server);
  run.bottleneck_dispatch_bytes.assign(static_cast<std::size_t>(P), 0);
  run.bottleneck_combine_bytes.assign(static_cast<std::size_t>(P), 0);
  auto set = [&](int r, double rows, double dispatch_row) {
    run.bottleneck_dispatch_bytes[static_cast<std::size_t>(r)] = rows * dispatch_row;
    run.bottleneck_combine_bytes[static_cast<std::size_t>(r)] = rows * y_row;
  };
  if (o.schedule != "hierarchical") {
    run.bottleneck_metric = "low-latency";
    for (int r = 0; r < P; ++r)
      set(r, static_cast<double>(count.recv_slots[static_cast<std::size_t>(r)]), o.fp8 ? H + H / 128 * 4 + 16 : 2 * H);
  } else if (servers.size() == 1) {
    run.bottleneck_metric = "normal intranode";
    for (int r = 0; r < P; ++r) set(r, static_cast<double>(count.recv_rows[static_cast<std::size_t>(r)]), x_row);
  } else {
    run.bottleneck_metric = "normal internode";
    for (int r = 0; r < P; ++r) {
      const BenchRankInput& in = problem.rank[static_cast<std::size_t>(r)];
      std::int64_t pairs = 0;
      for (std::int64_t t = 0; t < in.tokens; ++t) {
        std::set<int> nodes;
        for (int k = 0; k < K; ++k) {
          const std::int64_t e = in.topk_idx[static_cast<std::size_t>(t * K + k)];
          if (e >= 0) nodes.insert(run.topology.ranks[static_cast<std::size_t>(e / L)].server);
        }
        pairs += static_cast<std::int64_t>(nodes.size());
      }
      set(r, static_cast<double>(pairs), x_row);
    }
  }
}

}  // namespace

bool engine_supports_model_only() {
  static const bool supported = [] {
    bool saw = false;
    LaunchOptions lo;
    lo.num_ranks = 1;
    lo.transport = TransportKind::kSim;
    sim::SimTransportOptions so;
    so.model_only = true;
    sim::launch(lo, so, [&](Transport& t) {
      BufferConfig c;
      c.num_experts = 2;
      c.hidden = 128;
      c.num_topk = 1;
      c.max_tokens_per_rank = 1;
      c.num_workers = 1;
      Buffer b(t, c);
      saw = sim::sim_saw_payload_region(t);
    });
    return saw;
  }();
  return supported;
}

void validate_sim_options(const SimOptions& o) {
  if (o.ep.empty()) bad("--ep needs at least one EP size");
  for (int p : o.ep) check_shape(p, o.experts, o.hidden, o.topk, o.fp8, "epx sim --ep " + std::to_string(p));
  if (o.tokens < 1) bad("--tokens must be >= 1, got " + std::to_string(o.tokens));
  if (o.layout != "compact" && o.layout != "expanded") bad("--layout must be 'compact' or 'expanded', got '" + o.layout + "'");
  if (o.alignment < 1) bad("--alignment must be >= 1");
  check_group_limit(o.groups, o.topk_groups, o.experts, o.topk, 0);
  if (o.workers < 1) bad("--workers must be >= 1 (engine workers per rank in the simulated run)");
  if (o.queues < 1 || o.queues > 4) bad("--queues must be 1, 2 or 4, got " + std::to_string(o.queues));
  if (o.aggregate < 0) bad("--aggregate must be >= 0 bytes (0 = off)");
  if (o.run_hidden < 0 || (o.run_hidden > 0 && o.fp8 && o.run_hidden % 128 != 0))
    bad("--run-hidden must be 0 (auto) or a positive size (a multiple of 128 with --fp8)");
  if (o.sync != "none" && o.sync != "barrier" && o.sync.rfind("credits:", 0) != 0)
    bad("--sync must be none, barrier or credits:W");
  parse_schedule(o.schedule);
  parse_queue_split(o.queue_split);
  parse_protocol(o.protocol);
  try {
    parse_send_policy(o.send_policy);
  } catch (const Error& e) {
    bad(std::string("--send-policy: ") + e.what());
  }
  parse_combine_order(o.combine_order);
  parse_combine_replies(o.combine_replies);
  if (o.relay_chunk != "auto") {
    try {
      parse_byte_size(o.relay_chunk);
    } catch (const Error& e) {
      bad(std::string("--relay-chunk: ") + e.what());
    }
  }
  if (o.combine_replies == "selections" && (o.schedule == "hierarchical" || o.ring_rows > 0 || o.protocol == "flag"))
    bad("--combine-replies selections sends straight to the sources: not with --schedule hierarchical, --ring-rows or --protocol flag");
  if (o.combine_order == "node-first" && o.schedule != "hierarchical")
    bad("--combine-order node-first sums at the relays of --schedule hierarchical (the schedule is " + o.schedule + ")");
  if (o.ring_rows < 0) bad("--ring-rows must be >= 0, got " + std::to_string(o.ring_rows));
  if (o.ring_rows > 0 && o.protocol == "flag") bad("--ring-rows needs --protocol explicit or tail");
  if (o.ring_rows > 0 && o.schedule == "hierarchical") bad("--ring-rows cannot be combined with --schedule hierarchical");
  // Every EP size must have a table of its size (an explicit --topology names one P).
  for (int p : o.ep) {
    try {
      load_topology(topology_for(o, p), p);
    } catch (const Error& e) {
      bad("--topology at --ep " + std::to_string(p) + ": " + e.what());
    }
  }
}

void set_sim_option(SimOptions& o, const std::string& name, const std::string& value) {
  const auto number = [&](auto& field) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != value.size()) bad("--" + name + ": '" + value + "' is not an integer");
    field = static_cast<std::remove_reference_t<decltype(field)>>(v);
  };
  if (name == "tokens") return number(o.tokens);
  if (name == "hidden") return number(o.hidden);
  if (name == "topk") return number(o.topk);
  if (name == "experts") return number(o.experts);
  if (name == "groups") return number(o.groups);
  if (name == "topk-groups") return number(o.topk_groups);
  if (name == "alignment") return number(o.alignment);
  if (name == "queues") return number(o.queues);
  if (name == "aggregate") return number(o.aggregate);
  if (name == "seed") return number(o.seed);
  for (auto [flag, field] : {std::pair{"fp8", &o.fp8}, std::pair{"one-copy", &o.one_copy}})
    if (name == flag) {
      if (value != "true" && value != "false") bad("--" + name + ": '" + value + "' is not true or false");
      *field = value == "true";
      return;
    }
  std::string* text = name == "layout" ? &o.layout : name == "schedule" ? &o.schedule : name == "topology" ? &o.topology
                    : name == "queue-split" ? &o.queue_split : name == "protocol" ? &o.protocol
                    : name == "send-policy" ? &o.send_policy : name == "combine-order" ? &o.combine_order
                    : name == "combine-replies" ? &o.combine_replies : name == "relay-chunk" ? &o.relay_chunk : nullptr;
  if (!text) bad("unknown epx sim option '" + name + "'");
  *text = value;
}

BenchProblem sim_problem(const SimOptions& o, int ep) {
  // The bench's generator (uniform top-k, per-rank streams of the seed); its x is made at a
  // tiny hidden size and not used — every rank of a run reads one shared zero x.
  BenchOptions bo;
  bo.ranks = ep;
  bo.tokens = o.tokens;
  bo.hidden = 64;
  bo.topk = o.topk;
  bo.experts = o.experts;
  bo.seed = o.seed;
  bo.groups = o.groups;
  bo.topk_groups = o.topk_groups;
  return make_problem(bo);
}

namespace {

EngineCounters sum_counters(const CallStats& cs) {
  EngineCounters c;
  for (const WorkerStats& w : cs.workers) {
    c.puts += w.puts;
    c.bytes += w.put_bytes;
    c.local_puts += w.local_puts;
    c.local_bytes += w.local_bytes;
  }
  return c;
}

// What every simulated rank shares: the zero x (and scales) all ranks send, the buffer
// configuration and the payload region for copy mode.
struct RunInputs {
  const SimOptions& o;
  BenchProblem& problem;  // TensorViews of its routing (read only)
  BufferConfig cfg;
  std::pair<std::size_t, std::size_t> fallback;
  ZeroMap x, scales;
};

// One simulated rank: a dispatch and a combine (then, steady, a second pair, which is timed).
void run_rank(Transport& t, const RunInputs& in, SimRun& run) {
  const SimOptions& o = in.o;
  const int r = t.rank(), Hr = run.run_hidden;
  const auto ur = static_cast<std::size_t>(r);
  BenchRankInput& rank = in.problem.rank[ur];
  Buffer buffer(t, in.cfg);
  if (!sim::sim_saw_payload_region(t))
    if (auto* model = dynamic_cast<sim::ModelTransport*>(&t)) model->set_payload_region(in.fallback.first, in.fallback.second);
  DispatchArgs a;
  a.x = TensorView(in.x.data(), o.fp8 ? DType::kFP8E4M3 : DType::kBF16, {o.tokens, Hr});
  if (o.fp8) a.x_scales = TensorView(in.scales.data(), DType::kF32, {o.tokens, Hr / 128});
  a.topk_idx = TensorView(rank.topk_idx.data(), DType::kI64, {o.tokens, o.topk});
  a.topk_weights = TensorView(rank.topk_weights.data(), DType::kF32, {o.tokens, o.topk});
  a.layout = o.layout == "expanded" ? RecvLayout::kExpanded : RecvLayout::kCompact;
  a.expert_alignment = o.alignment;
  sim::sim_begin_call(t, "dispatch");
  DispatchResult d = buffer.dispatch(a);
  const std::int64_t rows = d.handle.num_recv_rows();
  if (o.collect_stats && !run.steady) run.dispatch_counters[ur] = sum_counters(buffer.last_stats());
  d.recv_x = Tensor();  // only the handle is needed from here on
  ZeroMap y(static_cast<std::size_t>(rows) * static_cast<std::size_t>(Hr) * 2);
  CombineArgs c;
  c.y = TensorView(y.data(), DType::kBF16, {rows, Hr});
  c.handle = &d.handle;
  sim::sim_begin_call(t, "combine");
  buffer.combine(c);
  if (o.collect_stats && !run.steady) {  // each rank writes only its own entries
    run.engine_recv_rows[ur] = rows;
    run.combine_counters[ur] = sum_counters(buffer.last_stats());
  }
  if (!run.steady) return;
  if (o.cached) a.handle = &d.handle;
  const int dispatch_call = sim::sim_begin_call(t, o.cached ? "cached dispatch" : "dispatch");
  DispatchResult d2 = buffer.dispatch(a);
  d2.recv_x = Tensor();
  c.handle = &d2.handle;
  const int combine_call = sim::sim_begin_call(t, "combine");
  buffer.combine(c);
  if (r == 0) run.dispatch_call = dispatch_call, run.combine_call = combine_call;  // the same on every rank
}

// What the model charges besides the trace: the plan's scans, payload scaling, the expert
// rank's reads and sums of an expanded combine, the source's sums.
void add_compute(SimRun& run, const SimOptions& o, const BenchProblem& problem, const RouteCount& count, double scale) {
  const int P = run.ep;
  const bool expanded = o.layout == "expanded";
  run.recv_rows = count.recv_rows;
  run.dispatch_compute.resize(static_cast<std::size_t>(P));
  run.combine_compute.resize(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    sim::RankCompute& dc = run.dispatch_compute[static_cast<std::size_t>(r)];
    if (!o.cached) {  // a cached dispatch reuses the handle's plan
      dc.plan_slots = static_cast<std::uint64_t>(o.tokens * o.topk);
      dc.plan_counts = static_cast<std::uint64_t>(P) * static_cast<std::uint64_t>(P + o.experts);
    }
    dc.payload_scale = scale;
    sim::RankCompute& cc = run.combine_compute[static_cast<std::size_t>(r)];
    cc.payload_scale = scale;
    const double rows = static_cast<double>(count.recv_rows[static_cast<std::size_t>(r)]);
    const double slots = static_cast<double>(count.recv_slots[static_cast<std::size_t>(r)]);
    // Expanded combine: the expert rank reads every slot row; a row with several slots is
    // summed into a staged partial (written, then read again by the put).
    if (expanded && rows > 0) cc.read_per_payload_byte = (slots + 2 * (slots - rows)) / rows;
  }
  add_combine_reduction(run, problem, expanded, o, 2 * static_cast<std::uint64_t>(run.run_hidden));
  add_bottleneck_bytes(run, problem, count, o);
  const double H = o.hidden, K = o.topk;
  run.dispatch_row_bytes = (o.fp8 ? H + H / 128 * 4 : 2 * H) + K * 8 + K * 4;
  run.combine_row_bytes = 2 * H;
}

}  // namespace

SimRun collect_run(const SimOptions& o, int ep) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  SimRun run;
  run.ep = ep;
  run.tokens = o.tokens;
  run.steady = o.steady || o.cached;
  run.cached = o.cached;
  run.model_only = o.run_hidden == 0 && engine_supports_model_only();
  run.run_hidden = o.run_hidden > 0 ? o.run_hidden : run.model_only ? o.hidden : std::min(o.hidden, o.fp8 ? 128 : 64);
  const int Hr = run.run_hidden;
  const double scale = static_cast<double>(o.hidden) / Hr;

  BenchProblem problem = sim_problem(o, ep);
  const RouteCount count = count_routes(problem, o.layout == "expanded", o.alignment);
  for (auto& r : problem.rank) r.x = Tensor();
  const std::size_t x_row = o.fp8 ? static_cast<std::size_t>(Hr) : static_cast<std::size_t>(Hr) * 2;
  // --one-copy: an output pool that holds the largest output of the run (expanded: a row per slot).
  std::int64_t pool_bytes = 0;
  for (std::int64_t rows : count.out_rows)
    pool_bytes = std::max<std::int64_t>(
        pool_bytes, static_cast<std::int64_t>(output_block_bytes(rows, Hr, o.fp8 ? DType::kFP8E4M3 : DType::kBF16)));
  const BufferConfig cfg = buffer_config(o, Hr, 1.0 / scale, ep, pool_bytes);
  const RunInputs in{o, problem, cfg, fallback_payload_region(cfg, ep), ZeroMap(static_cast<std::size_t>(o.tokens) * x_row),
                     ZeroMap(static_cast<std::size_t>(o.tokens) * static_cast<std::size_t>(std::max(1, Hr / 128)) * 4)};
  run.topology = load_topology(cfg.dataplane.topology, ep);
  if (o.collect_stats) {
    run.dispatch_counters.resize(static_cast<std::size_t>(ep));
    run.combine_counters.resize(static_cast<std::size_t>(ep));
    run.engine_recv_rows.resize(static_cast<std::size_t>(ep));
  }
  LaunchOptions lo;
  lo.num_ranks = ep;
  lo.transport = TransportKind::kSim;
  lo.timeout = std::chrono::milliseconds(600000);
  sim::SimTransportOptions so;
  so.model_only = run.model_only;
  so.trace = &run.trace;
  const sim::HardwareModel::PutCosts costs = sim::load_hardware(o.hardware).put_costs();
  so.put_overhead_ns = costs.overhead_ns;
  so.put_gbps = costs.gbps / scale;  // bytes at the run's hidden size stand for `scale` times more
  sim::launch(lo, so, [&](Transport& t) { run_rank(t, in, run); });

  add_compute(run, o, problem, count, scale);
  run.engine_seconds = seconds_since(t0);
  run.engine_cpu_seconds = cpu_seconds() - c0;
  return run;
}

namespace {

// One call of a run timed on the hardware model: the averages over ranks that SimPoint
// keeps for it.
struct CallFigures {
  double avg_gbps = 0, slowest_gbps = 0, max_us = 0, bottleneck_gbps = 0;
  Split split;
  std::uint64_t events = 0;
};

void add_rank_split(Split& split, const sim::RankTiming& rt, sim::Picoseconds max_rank, int P) {
  split.data_us += rt.data.us() / P;
  split.reduce_tail_us += rt.reduce_tail.us() / P;
  split.control_us += rt.control.us() / P;
  split.sync_us += rt.sync.us() / P;
  split.tail_us += (max_rank - rt.total).us() / P;
  split.scaleup_first_us += rt.scaleup_out.first.us() / P;
  split.scaleup_last_us += rt.scaleup_out.last.us() / P;
  split.scaleup_mb += static_cast<double>(rt.scaleup_out.bytes) / 1e6 / P;
  split.nic_first_us += rt.nic_out.first.us() / P;
  split.nic_last_us += rt.nic_out.last.us() / P;
  split.nic_mb += static_cast<double>(rt.nic_out.bytes) / 1e6 / P;
}

// Model-only knobs come from `o`, not from the options the run was made with (a run is
// shared by variants that differ only in them).
CallFigures timed_figures(const SimRun& run, const sim::HardwareModel& hw, const SimOptions& o, int call,
                          std::vector<sim::RankCompute> compute, double row_bytes, const std::vector<double>& bottleneck_bytes) {
  const int P = run.ep;
  const sim::Picoseconds extra = extra_sync(o, hw, P);
  const std::uint64_t dense_cells = o.dense_scan ? static_cast<std::uint64_t>(run.tokens) * static_cast<std::uint64_t>(P) : 0;
  for (auto& c : compute) {
    c.extra_sync = extra;
    if (call == run.dispatch_call && !run.cached) c.dense_cells = dense_cells;
  }
  const sim::CallTiming t = sim::time_call(run.trace, call, hw, compute, run.topology);
  CallFigures f;
  f.events = t.events;
  f.max_us = t.max_rank.us();
  int worst = 0;
  for (int r = 0; r < P; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const sim::RankTiming& rt = t.ranks[ur];
    f.avg_gbps += static_cast<double>(run.recv_rows[ur]) * row_bytes / (rt.total.us() * 1e3) / P;
    if (!bottleneck_bytes.empty()) f.bottleneck_gbps += bottleneck_bytes[ur] / (rt.total.us() * 1e3) / P;
    if (rt.total > t.ranks[static_cast<std::size_t>(worst)].total) worst = r;
    add_rank_split(f.split, rt, t.max_rank, P);
  }
  const auto uw = static_cast<std::size_t>(worst);
  f.slowest_gbps = static_cast<double>(run.recv_rows[uw]) * row_bytes / (t.ranks[uw].total.us() * 1e3);
  return f;
}

// The same run, each combine mechanism of the model removed in turn (the engine's trace —
// rows per token, local fraction — stays): SimPoint::combine_without; their timings' events
// are added to `events`.
std::vector<std::pair<std::string, double>> combine_without(const SimRun& run, const sim::HardwareModel& hw, const SimOptions& o,
                                                            std::uint64_t& events) {
  const std::vector<std::pair<std::string, std::function<void(sim::RankCompute&)>>> without = {
      {"source sum", [](sim::RankCompute& c) { c.reduction.reset(); }},
      {"sum's memory traffic", [](sim::RankCompute& c) { c.reduction_memory = false; }},
      {"expert pre-sum", [](sim::RankCompute& c) { c.presum_per_payload_byte = 0; }},
      {"expert reads", [](sim::RankCompute& c) { c.read_per_payload_byte = 1; }},
      {"per-peer release", [](sim::RankCompute& c) { c.peer_release = false; }},
  };
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, change] : without) {
    std::vector<sim::RankCompute> compute = run.combine_compute;
    for (auto& c : compute) change(c);
    const CallFigures f = timed_figures(run, hw, o, run.combine_call, std::move(compute), run.combine_row_bytes, {});
    events += f.events;
    out.emplace_back(name, f.avg_gbps);
  }
  return out;
}

}  // namespace

SimPoint evaluate_run(const SimRun& run, const sim::HardwareModel& hw, const SimOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  SimPoint pt;
  pt.ep = run.ep;
  pt.model_only = run.model_only;
  pt.steady = run.steady;
  pt.cached = run.cached;
  pt.run_hidden = run.run_hidden;
  pt.engine_seconds = run.engine_seconds;
  pt.engine_cpu_seconds = run.engine_cpu_seconds;
  pt.bottleneck_metric = run.bottleneck_metric;
  const CallFigures d =
      timed_figures(run, hw, o, run.dispatch_call, run.dispatch_compute, run.dispatch_row_bytes, run.bottleneck_dispatch_bytes);
  const CallFigures c =
      timed_figures(run, hw, o, run.combine_call, run.combine_compute, run.combine_row_bytes, run.bottleneck_combine_bytes);
  pt.events = d.events + c.events;
  pt.dispatch_gbps = d.avg_gbps, pt.dispatch_gbps_slowest = d.slowest_gbps, pt.dispatch_us = d.max_us;
  pt.dispatch_bottleneck_gbps = d.bottleneck_gbps, pt.dispatch_split = d.split;
  pt.combine_gbps = c.avg_gbps, pt.combine_gbps_slowest = c.slowest_gbps, pt.combine_us = c.max_us;
  pt.combine_bottleneck_gbps = c.bottleneck_gbps, pt.combine_split = c.split;
  if (o.attribution) pt.combine_without = combine_without(run, hw, o, pt.events);
  pt.timing_seconds = seconds_since(t0);
  pt.timing_cpu_seconds = cpu_seconds() - c0;
  return pt;
}

std::vector<SimPoint> simulate(const SimOptions& o, const sim::HardwareModel& hw) {
  // The time left from the work so far, an EP size's work taken as proportional to its ranks.
  double total = 0, done = 0;
  for (int ep : o.ep) total += ep;
  ProgressLine progress("[epx sim]", total, o.progress);
  std::vector<SimPoint> out;
  for (std::size_t i = 0; i < o.ep.size(); ++i) {
    const int ep = o.ep[i];
    const std::string at = "EP" + std::to_string(ep) + " (" + std::to_string(i + 1) + "/" + std::to_string(o.ep.size()) + ")";
    progress.update(done, at + ": running the engine on " + std::to_string(ep) + " sim ranks");
    const SimRun run = collect_run(o, ep);
    progress.update(done + 0.5 * ep, at + ": timing the trace on the model (" + (run.model_only ? "model-only" : "copy mode, payload scaled") + ")");
    out.push_back(evaluate_run(run, hw, o));
    done += ep;
  }
  progress.finish();
  return out;
}

}  // namespace epx::tools
