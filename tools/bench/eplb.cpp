#include "epx/bench/eplb.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <tuple>

#include "epx/eplb.hpp"
#include "epx/lb.hpp"
#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/runner.hpp"
#include "epx/buffer.hpp"
#include "epx/error.hpp"
#include "epx/spi/resources.hpp"

namespace epx::tools {

namespace {

using std::size_t;
size_t at(std::int64_t i) { return static_cast<size_t>(i); }

ReplicaChoice parse_choice(const std::string& c) {
  if (c == "rank") return ReplicaChoice::kPreferRank;
  if (c == "server") return ReplicaChoice::kPreferServer;
  return ReplicaChoice::kSpread;
}

// max / avg of v (1 when the avg is 0, like eplb_max_over_avg) and the first arg max.
template <class T>
std::pair<double, int> max_over_avg(const std::vector<T>& v) {
  if (v.empty()) return {1.0, 0};
  const auto mx = std::max_element(v.begin(), v.end());
  const double sum = static_cast<double>(std::accumulate(v.begin(), v.end(), T{0}));
  const double avg = sum / static_cast<double>(v.size());
  return {avg > 0 ? static_cast<double>(*mx) / avg : 1.0, static_cast<int>(mx - v.begin())};
}

EplbSide side(const RouteCount& rc, std::vector<double> planned) {
  EplbSide s;
  s.recv_rows = rc.recv_rows;
  s.recv_slots = rc.recv_slots;
  s.sent_rows = rc.sent_rows;
  for (int r = 0; r < rc.ranks; ++r) {
    s.total_rows += rc.recv_rows[at(r)];
    s.total_slots += rc.recv_slots[at(r)];
    s.local_rows += rc.recv_local_rows[at(r)];
  }
  std::tie(s.rows_imbalance, s.max_rows_rank) = max_over_avg(s.recv_rows);
  std::tie(s.slots_imbalance, s.max_slots_rank) = max_over_avg(s.recv_slots);
  s.planned_load = std::move(planned);
  s.planned_imbalance = max_over_avg(s.planned_load).first;
  return s;
}

// The dynamic plan from this batch: every rank's counts (what an all-gather of the notify
// counts gives); fills the report's replica tables, returns the plan.
DynamicReplicaPlan plan_dynamic(const BenchProblem& p, EplbReport& e, std::vector<double>& planned_with) {
  const int P = p.ranks, E = p.experts;
  e.slots_per_rank = (e.replicas - E) / P;
  std::vector<std::int64_t> counts;
  for (int r = 0; r < P; ++r) {
    const std::vector<std::int64_t> c = count_expert_slots(p.rank[at(r)].topk_idx, E);
    counts.insert(counts.end(), c.begin(), c.end());
  }
  DynamicReplicaPlan dyn = plan_dynamic_replicas(counts, P, E / P, e.slots_per_rank);
  e.replicas_used = dyn.replicas_used;
  e.mapping = dyn.placement.mapping;
  e.phy2log.assign(at(e.replicas), -1);
  e.logcnt.assign(at(E), 0);
  for (int x = 0; x < E; ++x)
    for (std::int64_t j = dyn.replica_offsets[at(x)]; j < dyn.replica_offsets[at(x) + 1]; ++j) {
      e.phy2log[at(dyn.replica_phys[at(j)])] = x;
      ++e.logcnt[at(x)];
    }
  planned_with.assign(dyn.rows_with.begin(), dyn.rows_with.end());
  return dyn;
}

// Rank r's physical routing against its logical one: same shape, -1 stays -1, every physical
// slot serves the logical expert it came from, and a token never names a physical expert
// twice. Returns the number of mapped (valid) slots; kInternal naming the slot otherwise.
std::int64_t check_physical_routing(const BenchRankInput& in, const std::vector<std::int64_t>& phys, int r, int K,
                                    const EplbReport& e) {
  const int R = e.replicas;
  if (phys.size() != in.topk_idx.size())
    throw Error(ErrorCode::kInternal, "epx bench --eplb: rank " + std::to_string(r) + ": map_to_replicas changed the shape", r);
  std::int64_t mapped = 0;
  for (std::int64_t t = 0; t < in.tokens; ++t)
    for (int k = 0; k < K; ++k) {
      const size_t i = at(t * K + k);
      const std::int64_t le = in.topk_idx[i], pe = phys[i];
      const std::string where = "epx bench --eplb: rank " + std::to_string(r) + " token " + std::to_string(t) + " slot " +
                                std::to_string(k) + ": logical expert " + std::to_string(le);
      if (le < 0) {
        if (pe != -1) throw Error(ErrorCode::kInternal, where + " was mapped to physical slot " + std::to_string(pe), r);
        continue;
      }
      if (pe < 0 || pe >= R)
        throw Error(ErrorCode::kInternal, where + " was mapped to " + std::to_string(pe) + ", outside [0, R = " +
                                              std::to_string(R) + ")", r);
      if (e.phy2log[at(pe)] != le)
        throw Error(ErrorCode::kInternal, where + " was mapped to physical slot " + std::to_string(pe) +
                                              ", which serves logical expert " + std::to_string(e.phy2log[at(pe)]), r);
      for (int j = 0; j < k; ++j)
        if (phys[at(t * K + j)] == pe)
          throw Error(ErrorCode::kInternal, where + ": physical slot " + std::to_string(pe) + " named twice by the token", r);
      ++mapped;
    }
  return mapped;
}

}  // namespace

EplbReport apply_eplb(const BenchOptions& o, BenchProblem& p) {
  const int P = p.ranks, E = p.experts, K = p.topk;
  check_eplb_shape(o, P, E);
  EplbReport e;
  e.enabled = true;
  e.ranks = P;
  e.logical_experts = E;
  e.replicas = o.eplb_replicas > 0 ? o.eplb_replicas : default_eplb_replicas(E, P);
  e.choice = eplb_choice_name(o);
  e.ranks_per_server = o.eplb_servers_of > 0 ? o.eplb_servers_of : 1;

  // The planner's input: the slots of each logical expert over all ranks of this routing.
  const RouteCount logical = count_routes(p, false, 1);
  e.expert_load.reserve(at(E));
  for (const std::int64_t n : logical.expert_rows) e.expert_load.push_back(static_cast<float>(n));
  e.dynamic = e.choice == "dynamic";
  EplbPlan plan;
  DynamicReplicaPlan dyn;
  std::vector<double> planned_with;
  if (e.dynamic) {
    dyn = plan_dynamic(p, e, planned_with);
  } else {
    plan = rebalance_experts(e.expert_load, 1, E, e.replicas, 1, 1, P);
    e.logcnt = plan.logcnt;
    e.phy2log = plan.phy2log;
    planned_with = eplb_gpu_load(plan, e.expert_load, P);
  }

  ReplicaRouting how;
  how.num_ranks = P;
  how.ranks_per_server = e.ranks_per_server;
  how.choice = parse_choice(e.choice);
  for (int r = 0; r < P; ++r) {
    BenchRankInput& in = p.rank[at(r)];
    how.rank = r;
    std::vector<std::int64_t> phys =
        e.dynamic ? route_through_replicas(dyn, r, in.topk_idx, K) : map_to_replicas(in.topk_idx, K, plan, how);
    e.mapped_slots += check_physical_routing(in, phys, r, K, e);
    in.topk_idx = std::move(phys);
  }
  e.mapping_verified = true;
  p.experts = e.replicas;
  p.source += ", EPLB: " + std::to_string(E) + " logical experts -> " + std::to_string(e.replicas) + " physical (" + e.choice + ")";

  const RouteCount physical = count_routes(p, false, 1);
  e.without = side(logical, eplb_gpu_load_without_replicas(e.expert_load, 1, E, P));
  e.with = side(physical, std::move(planned_with));
  if (e.dynamic && e.with.recv_slots != dyn.rows_with)
    throw Error(ErrorCode::kInternal, "epx bench --eplb-choice dynamic: the routed slots per rank differ from the plan's rows_with");
  return e;
}

namespace {

/// The byte that fills expert `expert`'s weights, so that a slot shows whose weights it holds.
std::uint8_t expert_byte(std::int64_t expert) { return static_cast<std::uint8_t>(expert % 251 + 1); }

/// One rank's part of the lb transfers: L home experts and B slots of n bytes each, and their
/// float32 gradients (each replica's all 1.0f).
struct LbRankData {
  LbRankData(int r, int L, int B, std::size_t n)
      : home(n * static_cast<std::size_t>(L)),
        slots(n * static_cast<std::size_t>(B)),
        grad_home(n / 4 * static_cast<std::size_t>(L)),
        grad_slots(n / 4 * static_cast<std::size_t>(B), 1.0f) {
    for (int j = 0; j < L; ++j) std::memset(home.data() + n * static_cast<std::size_t>(j), expert_byte(r * L + j), n);
  }
  std::vector<std::uint8_t> home, slots;
  std::vector<float> grad_home, grad_slots;
};

/// The timed pairs, in microseconds: prefetch_weights, then reduce_grads, each between barriers.
struct LbTimes {
  std::vector<double> prefetch, reduce;
};

LbTimes time_lb_pairs(Transport& t, Buffer& buf, LbRankData& d, const LbPlacement& pl, std::size_t n, int iters) {
  LbTimes times;
  for (int it = 0; it <= iters; ++it) {  // the first pair warms the Buffer and the pages
    std::fill(d.slots.begin(), d.slots.end(), std::uint8_t{0});
    std::fill(d.grad_home.begin(), d.grad_home.end(), 0.0f);
    t.barrier("bench: lb prefetch");
    const double t0 = bench_now_us();
    prefetch_weights(buf, {{d.slots.data(), n}}, {{d.home.data(), n}}, pl);
    t.barrier("bench: lb prefetch done");
    const double t1 = bench_now_us();
    reduce_grads(buf, {{d.grad_slots.data(), n}}, {{d.grad_home.data(), n}}, pl);
    t.barrier("bench: lb reduce done");
    const double t2 = bench_now_us();
    if (it > 0) times.prefetch.push_back(t1 - t0), times.reduce.push_back(t2 - t1);
  }
  return times;
}

/// What moved: every used slot holds its expert's bytes; every home gradient is the count of
/// its replicas (each replica's gradient is all 1.0f).
void check_lb_moved(const LbRankData& d, const LbPlacement& pl, int r, std::size_t n, int L, int B) {
  for (int b = 0; b < B; ++b) {
    const std::int64_t ex = pl.mapping[static_cast<std::size_t>(r * B + b)];
    const std::uint8_t* s = d.slots.data() + n * static_cast<std::size_t>(b);
    if (ex >= 0 && std::any_of(s, s + n, [&](std::uint8_t v) { return v != expert_byte(ex); }))
      throw Error(ErrorCode::kInternal, "epx bench: rank " + std::to_string(r) + ": slot " + std::to_string(b) +
                                            " does not hold expert " + std::to_string(ex) + "'s weights after prefetch");
  }
  for (int j = 0; j < L; ++j) {
    const auto c = static_cast<float>(std::count(pl.mapping.begin(), pl.mapping.end(), r * L + j));
    const float* g = d.grad_home.data() + n / 4 * static_cast<std::size_t>(j);
    if (std::any_of(g, g + n / 4, [&](float v) { return v != c; }))
      throw Error(ErrorCode::kInternal, "epx bench: rank " + std::to_string(r) + ": expert " + std::to_string(r * L + j) +
                                            "'s gradient is not the sum of its " + std::to_string(static_cast<int>(c)) +
                                            " replicas' after reduce_grads");
  }
}

/// Rank 0's times handed to the launching process through a file: the count, then both series.
void write_lb_times(const std::string& path, const LbTimes& times) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const std::uint64_t k = times.prefetch.size();
  f.write(reinterpret_cast<const char*>(&k), sizeof k);
  f.write(reinterpret_cast<const char*>(times.prefetch.data()), static_cast<std::streamsize>(k * sizeof(double)));
  f.write(reinterpret_cast<const char*>(times.reduce.data()), static_cast<std::streamsize>(k * sizeof(double)));
  if (!f.flush()) throw Error(ErrorCode::kIo, "epx bench: cannot write " + path);
}

void read_lb_times(const std::string& path, int iters, EplbReport& e) {
  std::ifstream f(path, std::ios::binary);
  std::uint64_t k = 0;
  f.read(reinterpret_cast<char*>(&k), sizeof k);
  if (!f || k != static_cast<std::uint64_t>(iters)) throw Error(ErrorCode::kIo, "epx bench: cannot read " + path);
  e.prefetch_us.resize(k);
  e.reduce_us.resize(k);
  f.read(reinterpret_cast<char*>(e.prefetch_us.data()), static_cast<std::streamsize>(k * sizeof(double)));
  f.read(reinterpret_cast<char*>(e.reduce_us.data()), static_cast<std::streamsize>(k * sizeof(double)));
  if (!f) throw Error(ErrorCode::kIo, "epx bench: cannot read " + path);
}

}  // namespace

void time_lb_transfers(const BenchOptions& o, const BenchProblem& p, const LaunchOptions& launch_options, int iters,
                       const std::string& scratch_dir, EplbReport& e) {
  e.expert_bytes = parse_byte_size(o.eplb_expert_bytes);
  if (!e.dynamic || e.expert_bytes == 0 || iters < 1) return;
  const int P = e.ranks, L = e.logical_experts / P, B = e.slots_per_rank;
  const std::size_t n = e.expert_bytes;
  // Home weights and slots, and their float32 gradients, on every rank.
  detail::check_memory_fits("epx bench --eplb-expert-bytes: ", "the expert weights and gradients",
                            detail::mul_sat(n, 2 * static_cast<std::uint64_t>(L + B)), P, false);
  const LbPlacement pl{L, B, e.mapping};
  const std::string times_path = scratch_dir + "/lb_times.bin";
  launch(launch_options, [&](Transport& t) {
    Buffer buf(t, bench_buffer_config(o, p));
    const int r = t.rank();
    LbRankData d(r, L, B, n);
    const LbTimes times = time_lb_pairs(t, buf, d, pl, n, iters);
    check_lb_moved(d, pl, r, n, L, B);
    if (r == 0) write_lb_times(times_path, times);
  });
  read_lb_times(times_path, iters, e);
}

}  // namespace epx::tools
