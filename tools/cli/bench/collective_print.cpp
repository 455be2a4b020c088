// `epx bench --op all_gather | reduce_scatter | all_reduce`: measure (epx/bench/collective.hpp),
// then print the report, write --json and --trace.
#include "bench/collective_print.hpp"

#include <algorithm>

#include "bench/output.hpp"
#include "epx/bench/report.hpp"

namespace epx::tools {

namespace {

using nlohmann::ordered_json;

double mib(std::uint64_t b) { return static_cast<double>(b) / (1 << 20); }

void print_latency(std::FILE* f, const CollectiveReport& r) {
  std::fprintf(f, "epx bench --op %s: %d ranks (%s), %d tensor%s of %.3f MiB per call (N = %.3f MiB), %s, algorithm %s\n",
               r.op.c_str(), r.ranks, r.transport.c_str(), r.tensors, r.tensors == 1 ? "" : "s", mib(r.tensor_bytes),
               mib(r.call_bytes), r.options.dtype.c_str(), r.algorithm.c_str());
  if (!r.node_layout.empty()) std::fprintf(f, "  nodes: %d; %s\n", r.num_nodes, r.node_layout.c_str());
  std::fprintf(f, "  max-rank latency (us, %d iterations): avg %.1f  p50 %.1f  p95 %.1f  max %.1f   span avg %.1f\n", r.iters,
               r.max_rank.avg, r.max_rank.p50, r.max_rank.p95, r.max_rank.max, r.span.avg);
  std::fprintf(f, "  algbw %.2f GB/s  busbw %.2f GB/s (algbw x %.3f, nccl-tests' convention)\n", r.algbw_gbps, r.busbw_gbps,
               busbw_factor(r.op, r.ranks));
  std::fprintf(f, "  limit: each rank copying N bytes at once, in the same run: memcpy %.2f GB/s, streaming copy %.2f GB/s "
               "per rank -> %s; busbw / limit = %.2f\n", r.memcpy_gbps, r.stream_gbps, r.limit_name.c_str(), r.busbw_vs_limit);
  std::fprintf(f, "  phases (avg over ranks, us): header exchange %.1f, data %.1f (of which waiting for done %.1f), other %.1f\n",
               r.exchange_us, r.data_us, r.done_us, std::max(0.0, r.max_rank.avg - r.exchange_us - r.data_us));
}

void print_ranks(std::FILE* f, const CollectiveReport& r) {
  std::fprintf(f, "\n  rank   avg_us   p50_us   p95_us   max_us  exchange_us  data_us  done_us  peak_rss_MiB\n");
  for (int k = 0; k < r.ranks; ++k) {
    const auto i = static_cast<std::size_t>(k);
    std::fprintf(f, "  %4d %8.1f %8.1f %8.1f %8.1f %12.1f %8.1f %8.1f %13.1f%s\n", k, r.rank[i].avg, r.rank[i].p50, r.rank[i].p95,
                 r.rank[i].max, r.exchange_rank_us[i], r.data_rank_us[i], r.done_rank_us[i], mib(r.peak_rss_bytes[i]),
                 k == r.slowest_rank ? "  slowest" : "");
  }
  std::fprintf(f, "  window %.2f MiB per rank (storage %.2f MiB + staging slots and boards)\n", mib(r.window_bytes), mib(r.call_bytes));
}

void print_checks(std::FILE* f, const CollectiveReport& r) {
  if (r.check_failures.empty())
    std::fprintf(f, "\n  results: every rank's outputs equal docs/spec.md §8 bit for bit at the sampled elements\n");
  for (const std::string& c : r.check_failures)
    std::fprintf(f, "\n  RESULT DIFFERS FROM docs/spec.md §8: %s\n", c.c_str());
  const CollectiveBaseline& b = r.baseline;
  if (!b.requested) return;
  if (!b.ran) {
    std::fprintf(f, "  baseline %s: not run: %s\n", b.name.c_str(), b.why_not.c_str());
    return;
  }
  std::fprintf(f, "  baseline %s: max-rank avg %.1f us  p50 %.1f  p95 %.1f  max %.1f -> epx is %.2fx %s\n", b.name.c_str(),
               b.max_rank.avg, b.max_rank.p50, b.max_rank.p95, b.max_rank.max, b.speedup >= 1 ? b.speedup : 1 / b.speedup,
               b.speedup >= 1 ? "faster" : "slower");
  if (!b.note.empty()) std::fprintf(f, "    (%s)\n", b.note.c_str());
  std::fprintf(f, "    results %s: %s\n    command: %s\n", b.verified ? "match" : "DIFFER", b.verify_detail.c_str(), b.command.c_str());
}

ordered_json baseline_json(const CollectiveBaseline& b) {
  ordered_json j;
  j["name"] = b.name;
  j["ran"] = b.ran;
  if (!b.ran) {
    j["why_not"] = b.why_not;
    return j;
  }
  j["command"] = b.command;
  if (!b.note.empty()) j["note"] = b.note;
  j["max_rank_us"] = summary_json(b.max_rank);
  j["rank_avg_us"] = b.rank_avg_us;
  j["verified"] = b.verified;
  j["bitwise"] = b.bitwise;
  j["verify_detail"] = b.verify_detail;
  j["speedup"] = b.speedup;
  return j;
}

ordered_json collective_json(const CollectiveReport& r) {
  ordered_json j;
  j["tool"] = "epx bench";
  j["op"] = r.op;
  j["ranks"] = r.ranks;
  j["transport"] = r.transport;
  j["tensors"] = r.tensors;
  j["dtype"] = r.options.dtype;
  j["tensor_bytes"] = r.tensor_bytes;
  j["call_bytes"] = r.call_bytes;
  j["warmup"] = r.options.warmup;
  j["iters"] = r.iters;
  j["algorithm"] = r.algorithm;
  ordered_json op;
  op["max_rank_us"] = summary_json(r.max_rank);
  op["max_rank_series_us"] = r.max_rank_series;
  op["span_us"] = summary_json(r.span);
  ordered_json ranks = ordered_json::array();
  for (const Summary& s : r.rank) ranks.push_back(summary_json(s));
  op["rank_us"] = ranks;
  op["slowest_rank"] = r.slowest_rank;
  op["algbw_gbps"] = r.algbw_gbps;
  op["busbw_gbps"] = r.busbw_gbps;
  op["busbw_factor"] = busbw_factor(r.op, r.ranks);
  op["phases_us"] = {{"exchange", r.exchange_rank_us}, {"data", r.data_rank_us}, {"done", r.done_rank_us}};
  j[r.op] = op;
  j["limit"] = {{"memcpy_gbps", r.memcpy_gbps}, {"stream_gbps", r.stream_gbps}, {"limit_gbps", r.limit_gbps},
                {"limit", r.limit_name}, {"busbw_vs_limit", r.busbw_vs_limit},
                {"memcpy_max_rank_us", summary_json(r.memcpy_max_rank)}, {"stream_max_rank_us", summary_json(r.stream_max_rank)}};
  j["window_bytes"] = r.window_bytes;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["check"] = {{"ok", r.check_failures.empty()}, {"failures", r.check_failures}};
  if (r.baseline.requested) j["baseline"] = baseline_json(r.baseline);
  if (!r.node_layout.empty()) j["nodes"] = {{"num_nodes", r.num_nodes}, {"layout", r.node_layout}};
  j["wall_s"] = r.wall_s;
  return j;
}

/// Chrome trace: pid = rank; per timed iteration the call (header exchange, then data) and
/// the copy limit's memcpy on a second track.
nlohmann::json collective_trace(const std::vector<CollectiveRankRecord>& records) {
  double t0 = 1e300;
  for (const auto& r : records)
    if (!r.start_us.empty()) t0 = std::min(t0, r.start_us.front());
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& r : records)
    for (std::size_t i = 0; i < r.start_us.size(); ++i) {
      const double s = r.start_us[i] - t0;
      ev.push_back({{"name", "call"}, {"ph", "X"}, {"pid", r.rank}, {"tid", 0}, {"ts", s}, {"dur", r.lat_us[i]}});
      ev.push_back({{"name", "exchange"}, {"ph", "X"}, {"pid", r.rank}, {"tid", 1}, {"ts", s}, {"dur", r.exchange_us[i]}});
      ev.push_back({{"name", "data"}, {"ph", "X"}, {"pid", r.rank}, {"tid", 1}, {"ts", s + r.exchange_us[i]}, {"dur", r.data_us[i]}});
      ev.push_back({{"name", "done wait"}, {"ph", "X"}, {"pid", r.rank}, {"tid", 2},
                    {"ts", s + r.exchange_us[i] + r.data_us[i] - r.done_us[i]}, {"dur", r.done_us[i]}});
    }
  return {{"traceEvents", ev}, {"displayTimeUnit", "ns"}};
}

}  // namespace

int run_collective_bench(const BenchOptions& o, std::FILE* out) {
  CollectiveMeasurement m = measure_collective(o);
  if (!m.root) return 0;
  const CollectiveReport& r = m.report;
  print_latency(out, r);
  print_ranks(out, r);
  print_checks(out, r);
  if (!o.json.empty()) {
    write_json_file(o.json, collective_json(r));
    std::fprintf(out, "\nwrote %s\n", o.json.c_str());
  }
  if (!o.trace.empty()) {
    write_json_file(o.trace, ordered_json(collective_trace(m.records)));
    std::fprintf(out, "wrote %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o.trace.c_str());
  }
  std::fflush(out);
  return collective_status(r);
}

}  // namespace epx::tools
