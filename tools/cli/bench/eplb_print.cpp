// `epx bench --eplb`: the EPLB section of the text report and the "eplb" object of --json.
#include "bench/eplb_print.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "epx/bench/report.hpp"
#include "epx/spi/resources.hpp"

namespace epx::tools {

namespace {

using std::size_t;
size_t at(std::int64_t i) { return static_cast<size_t>(i); }

// What the replicas were planned from, and how the copies spread over the experts.
void print_eplb_plan(std::FILE* f, const EplbReport& e) {
  const int P = e.ranks, E = e.logical_experts, R = e.replicas;
  std::fprintf(f, "\nEPLB  (%d logical experts -> R = %d physical, %d per rank; replica choice: %s", E, R, P > 0 ? R / P : 0,
               e.choice.c_str());
  if (e.choice == "server") std::fprintf(f, ", %d rank%s per server", e.ranks_per_server, e.ranks_per_server == 1 ? "" : "s");
  std::fprintf(f, ")\n");
  if (e.dynamic)
    std::fprintf(f, "  planner input: every rank's slots per logical expert in THIS batch (all-gathered counts: no oracle, the\n"
                    "  batch being dispatched): plan_dynamic_replicas(counts [%d, %d], L=%d, B=%d slots per rank); exact shares\n",
                 P, E, P > 0 ? E / P : 0, e.slots_per_rank);
  else
    std::fprintf(f, "  planner input: the slots of each logical expert in THIS batch (an oracle load; a deployment plans from past\n"
                    "  batches): rebalance_experts(load, 1 layer, E=%d, R=%d, 1 group, 1 node, %d GPUs)\n",
                 E, R, P);
  std::map<std::int64_t, int> copies;
  for (const std::int64_t c : e.logcnt) ++copies[c];
  std::string hist;
  for (const auto& [c, n] : copies) hist += (hist.empty() ? "" : "  ") + std::to_string(c) + ":" + std::to_string(n);
  int hot = 0;
  for (int x = 0; x < E; ++x)
    if (e.expert_load[at(x)] > e.expert_load[at(hot)]) hot = x;
  std::string hot_ranks;
  for (int q = 0; q < R; ++q)
    if (e.phy2log[at(q)] == hot) hot_ranks += (hot_ranks.empty() ? "" : ",") + std::to_string(q / (R / P));
  std::fprintf(f, "  %-28s %s  (experts with n replicas; hottest expert %d: %.0f slots, %lld replicas, on ranks %s)\n",
               "replicas per expert", hist.c_str(), hot, static_cast<double>(e.expert_load[at(hot)]),
               static_cast<long long>(e.logcnt.empty() ? 0 : e.logcnt[at(hot)]), hot_ranks.c_str());
  std::fprintf(f, "  %-28s %s: %lld (token, slot)s, each physical slot maps back (phy2log) to its logical expert\n",
               "mapping check", e.mapping_verified ? "ok" : "FAILED", static_cast<long long>(e.mapped_slots));
}

// Per rank: rows, slots and planned load without and with the replicas, then the totals.
void print_eplb_ranks(std::FILE* f, const EplbReport& e) {
  std::fprintf(f, "  %-6s %27s   %27s\n", "", "without replicas (logical)", "with replicas (physical, timed)");
  std::fprintf(f, "  %-6s %9s %8s %8s   %9s %8s %8s\n", "rank", "recv_rows", "slots", "planned", "recv_rows", "slots", "planned");
  for (int r = 0; r < e.ranks; ++r) {
    const auto row = [&](const EplbSide& s) {
      std::fprintf(f, "%9lld %8lld %8.1f", static_cast<long long>(s.recv_rows[at(r)]), static_cast<long long>(s.recv_slots[at(r)]),
                   s.planned_load[at(r)]);
    };
    std::fprintf(f, "  %-6d ", r);
    row(e.without);
    std::fprintf(f, "   ");
    row(e.with);
    std::string marks;
    if (r == e.without.max_rows_rank) marks += "  <- most rows without";
    if (r == e.with.max_rows_rank) marks += "  <- most rows with";
    if (r == e.measured_slowest_rank) marks += "  <- slowest (timed)";
    std::fprintf(f, "%s\n", marks.c_str());
  }
  std::fprintf(f, "  %-6s %9lld %8lld %8s   %9lld %8lld %8s\n", "total", static_cast<long long>(e.without.total_rows),
               static_cast<long long>(e.without.total_slots), "", static_cast<long long>(e.with.total_rows),
               static_cast<long long>(e.with.total_slots), "");
  std::fprintf(f, "  %-6s %9.3f %8.3f %8.3f   %9.3f %8.3f %8.3f\n", "max/avg", e.without.rows_imbalance, e.without.slots_imbalance,
               e.without.planned_imbalance, e.with.rows_imbalance, e.with.slots_imbalance, e.with.planned_imbalance);
}

// Imbalance and the most loaded rank, without and with, and the rows moved.
void print_eplb_balance(std::FILE* f, const EplbReport& e) {
  std::fprintf(f, "  %-28s rows %.3f -> %.3f, slots %.3f -> %.3f (planned %.3f -> %.3f)\n", "imbalance max/avg",
               e.without.rows_imbalance, e.with.rows_imbalance, e.without.slots_imbalance, e.with.slots_imbalance,
               e.without.planned_imbalance, e.with.planned_imbalance);
  std::fprintf(f, "  %-28s without: rank %d (%lld rows), with: rank %d (%lld rows); timed run's slowest (dispatch + combine): rank %d\n",
               "most loaded rank", e.without.max_rows_rank,
               static_cast<long long>(e.without.recv_rows.empty() ? 0 : e.without.recv_rows[at(e.without.max_rows_rank)]),
               e.with.max_rows_rank,
               static_cast<long long>(e.with.recv_rows.empty() ? 0 : e.with.recv_rows[at(e.with.max_rows_rank)]),
               e.measured_slowest_rank);
  std::fprintf(f, "  %-28s %lld -> %lld (local to the sender: %lld -> %lld); the routing without replicas is counted, not timed\n",
               "rows moved, all ranks", static_cast<long long>(e.without.total_rows), static_cast<long long>(e.with.total_rows),
               static_cast<long long>(e.without.local_rows), static_cast<long long>(e.with.local_rows));
}

// --eplb-choice dynamic: the replicas used, the rows they took off the busiest rank, the weights moved.
void print_eplb_dynamic(std::FILE* f, const EplbReport& e) {
  // When it pays: a replica's weights (3 H x I bf16 matrices: 6 H I bytes) cost the bytes of 3 I
  // dispatch rows (2 H bytes each); a row through the expert costs 6 H I FLOP forward (x3 with
  // backward, when the float32 gradients, 12 H I bytes, also travel home). Both scale with H I,
  // so the replicas pay when the rows they take off the busiest rank, per replica moved, exceed
  // the machine's FLOP/s over the bytes/s of the link the weights cross (unless hidden).
  const std::int64_t max_without = *std::max_element(e.without.recv_slots.begin(), e.without.recv_slots.end());
  const std::int64_t max_with = *std::max_element(e.with.recv_slots.begin(), e.with.recv_slots.end());
  const std::int64_t off = max_without - max_with;
  std::fprintf(f, "  %-28s %d of %d slots filled (B = %d per rank); prefetch moves %d experts' weights, reduce_grads brings\n"
                  "  %-28s %d gradients home\n",
               "dynamic replicas", e.replicas_used, e.ranks * e.slots_per_rank, e.slots_per_rank, e.replicas_used, "",
               e.replicas_used);
  std::fprintf(f, "  %-28s busiest rank %lld -> %lld (t, k) rows: %lld rows off it, %.1f per replica moved\n", "compute balanced",
               static_cast<long long>(max_without), static_cast<long long>(max_with), static_cast<long long>(off),
               e.replicas_used > 0 ? static_cast<double>(off) / e.replicas_used : 0.0);
  if (!e.prefetch_us.empty()) {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double moved = static_cast<double>(e.expert_bytes) * e.replicas_used;
    const double pf = median(e.prefetch_us), rd = median(e.reduce_us);
    std::fprintf(f, "  %-28s prefetch_weights %.3f ms (%d replicas x %s = %s, %.2f GB/s), reduce_grads (float32) %.3f ms,\n"
                    "  %-28s median of %zu; bytes and sums checked on every rank (--eplb-expert-bytes)\n",
                 "weights moved, timed", pf / 1e3, e.replicas_used, detail::format_bytes(e.expert_bytes).c_str(),
                 detail::format_bytes(static_cast<std::uint64_t>(moved)).c_str(), pf > 0 ? moved / pf / 1e3 : 0.0, rd / 1e3, "",
                 e.prefetch_us.size());
  }
  std::fprintf(f, "  %-28s one replica = 6 H I bytes (bf16 SwiGLU expert, I = its intermediate size) = the bytes of 3 I\n"
                  "  %-28s dispatch rows; it pays when rows-off-per-replica > FLOP/s / link bytes/s (e.g. 990 TFLOP/s over\n"
                  "  %-28s 50 GB/s: 19800; over 450 GB/s: 2200 -- datasheet examples, not measured) or when prefetch is hidden\n",
               "weights vs rows", "", "");
}

}  // namespace

void print_eplb_report(std::FILE* f, const EplbReport& e) {
  if (!e.enabled) return;
  print_eplb_plan(f, e);
  print_eplb_ranks(f, e);
  print_eplb_balance(f, e);
  if (e.dynamic) print_eplb_dynamic(f, e);
}

nlohmann::ordered_json eplb_json(const EplbReport& e) {
  using nlohmann::ordered_json;
  auto side_json = [](const EplbSide& s) {
    ordered_json j;
    j["recv_rows_per_rank"] = s.recv_rows;
    j["recv_slots_per_rank"] = s.recv_slots;
    j["sent_rows_per_rank"] = s.sent_rows;
    j["total_rows"] = s.total_rows;
    j["total_slots"] = s.total_slots;
    j["local_rows"] = s.local_rows;
    j["rows_imbalance"] = s.rows_imbalance;
    j["slots_imbalance"] = s.slots_imbalance;
    j["max_rows_rank"] = s.max_rows_rank;
    j["max_rows"] = s.recv_rows.empty() ? 0 : s.recv_rows[at(s.max_rows_rank)];
    j["max_slots_rank"] = s.max_slots_rank;
    j["planned_gpu_load"] = s.planned_load;
    j["planned_imbalance"] = s.planned_imbalance;
    return j;
  };
  ordered_json j;
  j["logical_experts"] = e.logical_experts;
  j["replicas"] = e.replicas;
  j["replicas_per_rank"] = e.ranks > 0 ? e.replicas / e.ranks : 0;
  j["choice"] = e.choice;
  j["ranks_per_server"] = e.ranks_per_server;
  j["load_source"] = "oracle: slots per logical expert over all ranks of the benchmarked routing itself";
  j["expert_load"] = e.expert_load;
  j["logcnt"] = e.logcnt;
  j["phy2log"] = e.phy2log;
  j["mapping_verified"] = e.mapping_verified;
  j["mapped_slots"] = e.mapped_slots;
  j["without"] = side_json(e.without);
  j["with"] = side_json(e.with);
  j["with"]["measured_slowest_rank"] = e.measured_slowest_rank;
  if (e.dynamic) {
    j["dynamic"] = {{"slots_per_rank", e.slots_per_rank}, {"replicas_used", e.replicas_used}, {"mapping", e.mapping},
                    {"expert_bytes", e.expert_bytes}, {"weight_bytes_moved", e.expert_bytes * static_cast<std::uint64_t>(e.replicas_used)},
                    {"prefetch_us", e.prefetch_us}, {"reduce_us", e.reduce_us}};
  }
  j["rows_imbalance_ratio"] = e.without.rows_imbalance > 0 ? e.with.rows_imbalance / e.without.rows_imbalance : 0.0;
  return j;
}

}  // namespace epx::tools
