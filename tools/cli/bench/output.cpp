#include "bench/output.hpp"

#include <algorithm>
#include <fstream>

#include "bench/bench_cli.hpp"
#include "bench/eplb_print.hpp"
#include "epx/bench/dataplane_options.hpp"
#include "epx/error.hpp"
#include "epx/io/file_io.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace epx::tools {

namespace {

std::size_t at(int i) { return static_cast<std::size_t>(i); }

}  // namespace

ordered_json summary_json(const Summary& s) {
  ordered_json j;
  j["avg"] = s.avg;
  j["p50"] = s.p50;
  j["p95"] = s.p95;
  j["max"] = s.max;
  return j;
}

namespace {

// The engine's counters of an op (puts, bytes, phases, queues), or nulls without counters.
void add_counters_json(ordered_json& j, const OpReport& op) {
  if (!op.counters) {
    j["puts"] = nullptr;
    j["bytes_per_put"] = nullptr;
    j["phases_us"] = ordered_json::object();
    return;
  }
  j["puts"] = op.puts;
  j["remote_puts"] = op.remote_puts;
  j["bytes_per_put"] = op.bytes_per_put;
  j["puts_per_rank"] = op.puts_rank;
  j["remote_puts_per_rank"] = op.remote_puts_rank;
  j["engine_bytes_per_rank"] = op.bytes_rank;
  j["engine_remote_bytes_per_rank"] = op.remote_bytes_rank;
  j["metadata_bytes_per_row"] = op.metadata_bytes_per_row;
  ordered_json ph;
  for (int p = 0; p < kBenchPhases; ++p) {
    std::vector<double> v;
    for (const auto& pr : op.phases_rank) v.push_back(pr[at(p)]);
    ph[bench_phase_name(p)] = v;
  }
  j["phases_us"] = ph;
  j["dominant_phase"] = bench_phase_name(op.dominant);
  std::vector<std::string> dom;
  for (int d : op.dominant_rank) dom.push_back(bench_phase_name(d));
  j["dominant_phase_per_rank"] = dom;
  ordered_json queues;
  queues["puts"] = op.queue_puts;
  queues["bytes"] = op.queue_bytes;
  queues["wait_us"] = op.queue_wait_us;
  queues["puts_per_rank"] = op.queue_puts_rank;
  queues["bytes_per_rank"] = op.queue_bytes_rank;
  queues["wait_us_per_rank"] = op.queue_wait_us_rank;
  j["queues"] = queues;
}

// --counters-overhead: counters off vs on.
ordered_json overhead_json(const OpReport& op) {
  ordered_json o;
  o["off_max_rank_us"] = summary_json(op.off);
  o["on_max_rank_us"] = summary_json(op.on);
  o["iters_per_mode"] = op.on.n;
  o["ratio_on_off"] = op.counters_ratio;
  o["comparison_before_us"] = summary_json(op.compare_before);
  o["comparison_after_us"] = summary_json(op.compare_after);
  o["drift"] = op.drift;
  return o;
}

ordered_json op_json(const OpReport& op, const RouteCount& rc, bool is_dispatch) {
  const int P = static_cast<int>(op.rank.size());
  ordered_json j;
  j["max_rank_us"] = summary_json(op.max_rank);
  std::vector<double> rank_avg;
  ordered_json rank_lat = ordered_json::array();
  for (const Summary& s : op.rank) {
    rank_avg.push_back(s.avg);
    rank_lat.push_back(summary_json(s));
  }
  j["rank_us"] = rank_avg;
  j["rank_latency_us"] = rank_lat;
  j["slowest_rank"] = op.slowest_rank;
  j["span_us"] = summary_json(op.span);
  j["start_skew_us"] = op.start_skew_us;
  j["payload_bytes_per_rank"] = op.payload_bytes;
  j["local_bytes_per_rank"] = op.local_bytes;
  std::vector<std::int64_t> remote;
  for (int r = 0; r < P; ++r) remote.push_back(op.payload_bytes[at(r)] - op.local_bytes[at(r)]);
  j["remote_bytes_per_rank"] = remote;
  j["payload_bytes_total"] = op.total_payload;
  j["moved_bytes_total"] = op.total_moved;  // the layout's rows (expanded: one per slot; RouteCount::moved_*)
  j["row_bytes"] = is_dispatch ? rc.x_row_bytes : rc.y_row_bytes;
  j["rows_per_rank"] = is_dispatch ? rc.sent_rows : rc.recv_rows;
  j["algbw_gbps"] = op.algbw_gbps;
  j["algbw_gbps_per_rank"] = op.algbw_rank_gbps;
  j["memcpy_gbps"] = op.memcpy_gbps;
  j["memcpy_max_rank_us"] = summary_json(op.memcpy_max_rank);
  j["memcpy_rank_us"] = op.memcpy_rank_us;
  j["ratio_vs_memcpy"] = op.ratio_vs_memcpy;
  j["stream_gbps"] = op.stream_gbps;
  j["stream_max_rank_us"] = summary_json(op.stream_max_rank);
  j["limit_gbps"] = op.limit_gbps;
  j["limit"] = op.limit_name;
  j["ratio_vs_limit"] = op.ratio_vs_limit;
  j["counters"] = op.counters;
  j["pulled"] = op.pulled;  // combine read the expert ranks' rows in place (no puts)
  j["data_first"] = op.data_first;  // rows before the header exchange (docs/engine.md, rows first)
  add_counters_json(j, op);
  if (op.overhead) j["counters_overhead"] = overhead_json(op);
  ordered_json it;
  it["max_rank_us"] = op.max_rank_series;
  it["rank_us"] = op.rank_series;
  j["iterations"] = it;
  return j;
}

// [{"rank", "pid", "node"}] of every rank.
ordered_json ranks_json(const BenchReport& r) {
  ordered_json list = ordered_json::array();
  for (int i = 0; i < r.ranks; ++i) {
    const bool known = static_cast<std::size_t>(i) < r.rank_info.size();
    list.push_back({{"rank", i}, {"pid", known ? r.rank_info[static_cast<std::size_t>(i)].pid : 0},
                    {"node", known ? r.rank_info[static_cast<std::size_t>(i)].node : ""}});
  }
  return list;
}

// --diagnose: per op the [src][dst] matrix (µs per call), the verdict and its thresholds.
ordered_json verdict_json(const MatrixVerdict& v) {
  ordered_json points = ordered_json::array();
  for (const AbnormalPoint& p : v.points) points.push_back({p.src, p.dst, p.value_us, p.ratio});
  return {{"abnormal_rows", v.rows}, {"abnormal_cols", v.cols}, {"abnormal_points", points}};
}

ordered_json diagnose_json(const DiagnoseReport& d) {
  ordered_json j;
  const std::size_t P = d.ranks.size();
  for (int op = 0; op < kNumWaitOps; ++op) {
    const DiagnoseOp& o = d.ops[static_cast<std::size_t>(op)];
    ordered_json m = ordered_json::array();
    for (std::size_t s = 0; s < P; ++s)
      m.push_back(std::vector<double>(o.matrix_us.begin() + static_cast<std::ptrdiff_t>(s * P),
                                      o.matrix_us.begin() + static_cast<std::ptrdiff_t>((s + 1) * P)));
    ordered_json v = {{"matrix_us", m}};
    v.update(verdict_json(o.verdict));
    v["thresholds"] = {{"row", d.thresholds.row}, {"col", d.thresholds.col}, {"point", d.thresholds.point},
                       {"links", d.thresholds.links}, {"floor_us", d.thresholds.floor_us}, {"spread", d.thresholds.spread}};
    v["calls_per_rank"] = o.calls;
    j[to_string(static_cast<WaitOp>(op))] = v;
  }
  j["seconds"] = d.seconds;
  return j;
}

// The whole loop's report (the keys above) and the intervals': "persist" (the rule),
// "persistent" (per op, what need of the intervals named), "persistent_ranks" (both ops:
// {"ranks": [...], "links": [[src, dst, us, ratio], ...]}) and "intervals" (each one's
// matrices and verdict, by the keys above).
ordered_json diagnose_json(const DiagnoseReport& whole, const std::vector<DiagnoseReport>& intervals) {
  ordered_json j = diagnose_json(whole);
  j["persist"] = {{"of", whole.persist.of}, {"need", whole.persist.need}};
  ordered_json p;
  for (int op = 0; op < kNumWaitOps; ++op)
    p[to_string(static_cast<WaitOp>(op))] = verdict_json(whole.ops[static_cast<std::size_t>(op)].persistent);
  j["persistent"] = p;
  ordered_json links = ordered_json::array();
  for (const AbnormalPoint& l : whole.persistent.links) links.push_back({l.src, l.dst, l.value_us, l.ratio});
  j["persistent_ranks"] = {{"ranks", whole.persistent.ranks}, {"links", links}};
  ordered_json list = ordered_json::array();
  for (const DiagnoseReport& i : intervals) list.push_back(diagnose_json(i));
  j["intervals"] = list;
  return j;
}

// The routing's rows: histograms, per-rank and per-expert rows, the [src][dst] matrix.
ordered_json route_json(const BenchReport& r) {
  const RouteCount& rc = r.count;
  const RouteReport& h = r.route;
  ordered_json route;
  route["unique_dest_hist"] = h.unique_dest_hist;
  route["unique_dest_hist_per_rank"] = rc.unique_dest_hist;
  route["avg_unique_dest"] = h.avg_unique_dest;
  route["sent_rows_per_rank"] = rc.sent_rows;
  route["sent_local_rows_per_rank"] = rc.sent_local_rows;
  route["recv_rows_per_rank"] = rc.recv_rows;
  route["recv_local_rows_per_rank"] = rc.recv_local_rows;
  route["recv_slots_per_rank"] = rc.recv_slots;
  route["out_rows_per_rank"] = rc.out_rows;
  route["rows_per_expert"] = rc.expert_rows;
  ordered_json pairs = ordered_json::array();  // [source][destination] rows (pair_rows)
  for (int s = 0; s < r.ranks; ++s)
    pairs.push_back(std::vector<std::int64_t>(rc.pair_rows.begin() + s * r.ranks, rc.pair_rows.begin() + (s + 1) * r.ranks));
  route["rows_matrix"] = pairs;
  route["rank_recv"] = {{"min", h.recv_min}, {"avg", h.recv_avg}, {"max", h.recv_max}, {"max_rank", h.recv_max_rank},
                        {"imbalance", h.recv_imbalance}};
  route["expert_rows"] = {{"min", h.expert_min}, {"avg", h.expert_avg}, {"max", h.expert_max}, {"max_expert", h.expert_max_id},
                          {"imbalance", h.expert_imbalance}};
  route["slowest_rank"] = h.slowest_rank;
  route["slowest_rank_round_trip_us"] = h.slowest_round_trip_us;
  if (r.ranks > 0) {
    const int L = r.experts / r.ranks, s = h.slowest_rank;
    route["slowest_rank_unique_dest_hist"] = rc.unique_dest_hist[at(s)];
    route["slowest_rank_expert_rows"] =
        std::vector<std::int64_t>(rc.expert_rows.begin() + s * L, rc.expert_rows.begin() + (s + 1) * L);
  }
  return route;
}

// --baseline mpi: the peer's times, checks and the speedups.
ordered_json baseline_json(const BenchReport& r) {
  const BaselineResult& b = r.baseline;
  ordered_json bj;
  bj["kind"] = "mpi";
  bj["available"] = b.ran;
  if (!b.ran) {
    bj["why_unavailable"] = b.why_not;
  } else {
    bj["command"] = b.command;
    bj["dispatch"] = {{"max_rank_us", summary_json(b.dispatch)}, {"rank_us", b.dispatch_rank_us}};
    bj["combine"] = {{"max_rank_us", summary_json(b.combine)}, {"rank_us", b.combine_rank_us}};
    bj["recv_rows"] = b.recv_rows;
    bj["payload_bytes_per_rank"] = b.payload_bytes;
    bj["dispatch_hash"] = b.dispatch_hash;
    bj["combine_hash"] = b.combine_hash;
    bj["verified"] = b.verified;
    bj["verify_detail"] = b.verify_detail;
    auto ratio = [](double mpi, double epx) { return epx > 0 ? mpi / epx : 0.0; };
    bj["speedup_epx_vs_mpi"] = {
        {"dispatch", ratio(b.dispatch.avg, r.dispatch.max_rank.avg)},
        {"combine", ratio(b.combine.avg, r.combine.max_rank.avg)},
        {"round_trip", ratio(b.dispatch.avg + b.combine.avg, r.dispatch.max_rank.avg + r.combine.max_rank.avg)}};
  }
  return bj;
}

}  // namespace

ordered_json bench_config_json(const BenchReport& r) {
  const BenchOptions& o = r.options;
  const RouteCount& rc = r.count;
  ordered_json j;
  j["tool"] = "epx bench";
  j["num_ranks"] = r.ranks;
  j["ranks"] = ranks_json(r);
  j["tokens"] = r.max_tokens;
  j["tokens_per_rank"] = rc.tokens;
  j["hidden"] = r.hidden;
  j["topk"] = r.topk;
  j["experts"] = r.experts;
  j["local_experts"] = r.ranks > 0 ? r.experts / r.ranks : 0;
  j["fp8"] = r.fp8;
  j["layout"] = o.layout;
  j["alignment"] = o.alignment;
  j["cached"] = o.cached;
  j["zero_copy"] = o.zero_copy;
  j["weighted"] = o.weighted;
  j["output_pool"] = o.output_pool_bytes();
  j["ring_rows"] = o.ring_rows;
  j["transport"] = o.transport;
  j["workers"] = r.workers;
  j["cores"] = r.cores;
  j["warmup"] = o.warmup;
  j["iters"] = o.iters;
  j["counters"] = o.counters;
  j["counters_overhead_of"] = o.overhead_of;  // what counters_overhead's on/off compares: counters | waits
  j["routing"] = {{"source", r.source}, {"dir", o.routing}, {"skew", o.skew}, {"groups", o.groups}, {"topk_groups", o.topk_groups},
                  {"seed", o.seed}};
  j["dataplane"] = dataplane_json(o.dataplane);
  return j;
}

ordered_json bench_json(const BenchReport& r) {
  const RouteCount& rc = r.count;
  ordered_json j = bench_config_json(r);
  j["x_row_bytes"] = rc.x_row_bytes;
  j["y_row_bytes"] = rc.y_row_bytes;
  j["memcpy_gbps"] = r.memcpy_gbps;
  j["wall_s"] = r.wall_s;
  j["window_bytes"] = r.window_bytes;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["anon_rss_bytes"] = r.anon_rss_bytes;
  j["output"] = {{"one_copy", r.one_copy_calls}, {"copy", r.copy_calls}, {"view", r.view_calls}, {"copy_why", r.copy_why}};
  j["dispatch"] = op_json(r.dispatch, rc, true);
  j["combine"] = op_json(r.combine, rc, false);

  j["route"] = route_json(r);
  if (r.diagnose.exchanges > 0) j["diagnose"] = diagnose_json(r.diagnose, r.diagnose_intervals);

  if (r.dispatch.counters || r.combine.counters) {
    ordered_json wc;
    wc["layout"] = "[rank][worker][metric], per-call averages over the timed iterations";
    wc["metrics"] = worker_metric_names();
    if (r.dispatch.counters) wc["dispatch"] = r.dispatch.worker_metrics;
    if (r.combine.counters) wc["combine"] = r.combine.worker_metrics;
    j["worker_counters"] = wc;
  }

  if (r.baseline_requested) j["baseline"] = baseline_json(r);
  if (r.eplb.enabled) j["eplb"] = eplb_json(r.eplb);
  j["warnings"] = r.warnings;
  j["definitions"] = bench_definitions();
  return j;
}

void write_json_file(const fs::path& path, const ordered_json& j) { write_text_file(path, "bench JSON", j.dump(2) + "\n"); }

void write_bench_json(const fs::path& path, const BenchReport& r) { write_json_file(path, bench_json(r)); }

namespace {

// Chrome trace events of a bench run: one process per rank, one thread per worker and one
// for the memcpy reference; times from the first call's start.
struct TraceWriter {
  json events = json::array();
  double t0 = 0;
  int memcpy_tid = 1;

  void slice(const std::string& name, const char* cat, int pid, int tid, double ts, double dur, json args) {
    json e = {{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", pid}, {"tid", tid}, {"ts", ts - t0}, {"dur", std::max(0.0, dur)}};
    if (!args.is_null()) e["args"] = std::move(args);
    events.push_back(std::move(e));
  }

  void names(const BenchRankRecord& rec) {
    const int pid = rec.rank;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "rank " + std::to_string(pid)}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    for (int w = 0; w < std::max(1, rec.workers); ++w)
      events.push_back(
          {{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", w}, {"args", {{"name", "worker " + std::to_string(w)}}}});
    events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", memcpy_tid}, {"args", {{"name", "memcpy reference"}}}});
  }

  // Call i of `name` on every worker, then its phases.
  void call(const BenchCall& c, std::size_t i, const char* name, int pid) {
    const int workers = std::max<int>(1, static_cast<int>(c.workers.size()));
    for (int w = 0; w < workers; ++w) {
      json args = {{"iteration", i}, {"latency_us", c.lat_us}};
      if (!c.workers.empty()) {
        const WorkerStats& s = c.workers[static_cast<std::size_t>(w)];
        args["puts"] = s.puts + s.local_puts;
        args["bytes"] = s.put_bytes + s.local_bytes;
      }
      slice(std::string(name) + " #" + std::to_string(i), name, pid, w, c.start_us, c.lat_us, std::move(args));
    }
    if (c.workers.empty()) return;
    // Phases in order from the call's start; every worker's phase p starts where
    // worker 0's does (the phases are fork-join steps of the call).
    double offset = 0;
    for (int p = 0; p < kNumPhases; ++p) {
      for (int w = 0; w < workers; ++w) {
        const double dur = c.workers[static_cast<std::size_t>(w)].phase_us[static_cast<std::size_t>(p)];
        if (dur > 0) slice(to_string(static_cast<Phase>(p)), "phase", pid, w, c.start_us + offset, dur, {{"iteration", i}});
      }
      offset += c.workers[0].phase_us[static_cast<std::size_t>(p)];
    }
  }

  void memcpy_reference(const BenchRankRecord& rec) {
    for (std::size_t i = 0; i < rec.memcpy_dispatch_us.size(); ++i) {
      slice("memcpy dispatch bytes #" + std::to_string(i), "memcpy", rec.rank, memcpy_tid, rec.memcpy_dispatch_start_us[i],
            rec.memcpy_dispatch_us[i], {{"iteration", i}});
      slice("memcpy combine bytes #" + std::to_string(i), "memcpy", rec.rank, memcpy_tid, rec.memcpy_combine_start_us[i],
            rec.memcpy_combine_us[i], {{"iteration", i}});
    }
  }
};

}  // namespace

json bench_trace(const std::vector<BenchRankRecord>& records) {
  TraceWriter tw;
  double t0 = 1e300;
  int max_workers = 1;
  for (const BenchRankRecord& rec : records) {
    for (const auto* calls : {&rec.dispatch, &rec.combine})
      for (const BenchCall& c : *calls) {
        t0 = std::min(t0, c.start_us);
        max_workers = std::max(max_workers, static_cast<int>(c.workers.size()));
      }
  }
  tw.t0 = t0 > 1e299 ? 0 : t0;
  tw.memcpy_tid = max_workers;
  for (const BenchRankRecord& rec : records) {
    tw.names(rec);
    for (std::size_t i = 0; i < rec.dispatch.size(); ++i) tw.call(rec.dispatch[i], i, "dispatch", rec.rank);
    for (std::size_t i = 0; i < rec.combine.size(); ++i) tw.call(rec.combine[i], i, "combine", rec.rank);
    tw.memcpy_reference(rec);
  }
  return json{{"traceEvents", std::move(tw.events)}, {"displayTimeUnit", "ms"}};
}

void write_bench_trace(const fs::path& path, const std::vector<BenchRankRecord>& records) {
  write_text_file(path, "trace", bench_trace(records).dump() + "\n");
}

}  // namespace epx::tools
