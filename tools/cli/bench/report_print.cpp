// `epx bench`'s fixed-width text report of a BenchReport (epx/bench/report.hpp).
#include "bench/report_print.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <cstdlib>
#include <thread>

#include "bench/eplb_print.hpp"
#include "epx/bench/dataplane_options.hpp"
#include "epx/error.hpp"

namespace epx::tools {

namespace {

using std::size_t;
size_t at(int i) { return static_cast<size_t>(i); }

}  // namespace

// ---- text report --------------------------------------------------------------------------

std::string format_us(double v) { return v >= 10000 ? fmt("%.0f", v) : fmt("%.1f", v); }

namespace {

std::string mb(double bytes) { return fmt("%.2f", bytes / 1e6); }

void summary_line(std::FILE* f, const char* label, const Summary& s) {
  std::fprintf(f, "  %-28s avg %9s  p50 %9s  p95 %9s  max %9s\n", label, format_us(s.avg).c_str(), format_us(s.p50).c_str(),
               format_us(s.p95).c_str(), format_us(s.max).c_str());
}

std::string hist_text(const std::vector<std::int64_t>& hist) {
  std::string s;
  for (size_t n = 0; n < hist.size(); ++n) {
    if (n == 0 && hist[n] == 0) continue;
    s += fmt("%s%zu:%lld", s.empty() ? "" : "  ", n, static_cast<long long>(hist[n]));
  }
  return s;
}

// The op's latency, bandwidth and limits, and how its output and rows went.
void print_op_totals(std::FILE* f, const BenchReport& rep, const OpReport& op, bool is_dispatch) {
  const RouteCount& rc = rep.count;
  std::fprintf(f, "\n%s  (payload: %s)\n", is_dispatch ? "DISPATCH" : "COMBINE",
               is_dispatch ? fmt("each token once per unique destination rank, x row = %zu B", rc.x_row_bytes).c_str()
                           : fmt("the dispatched (token, rank) rows back, bf16 row = %zu B, at the expert rank", rc.y_row_bytes).c_str());
  summary_line(f, "max-rank latency (us)", op.max_rank);
  std::fprintf(f, "  %-28s avg %9s  (first rank's start to last rank's end; start skew avg %s us)\n", "span (us)",
               format_us(op.span.avg).c_str(), format_us(op.start_skew_us).c_str());
  // Expanded: the layout's rows are one per slot (RouteCount::moved_*), more than the payload.
  const bool per_slot = op.total_moved != op.total_payload;
  std::fprintf(f, "  %-28s %.2f GB/s  (%s MB%s / avg max-rank latency)\n", "algbw total", op.algbw_gbps,
               mb(static_cast<double>(op.total_moved)).c_str(),
               per_slot ? (" moved: a row per slot of the expanded layout; payload " + mb(static_cast<double>(op.total_payload)) + " MB")
                              .c_str()
                        : "");
  std::fprintf(f, "  %-28s %.2f GB/s  (same bytes, same %d ranks at once, max-rank avg %s us)  ->  epx = %.2fx memcpy\n",
               "memcpy, this machine", op.memcpy_gbps, rep.ranks, format_us(op.memcpy_max_rank.avg).c_str(), op.ratio_vs_memcpy);
  std::fprintf(f, "  %-28s %.2f GB/s  (the same bytes with streaming stores, max-rank avg %s us)  ->  epx = %.2fx\n",
               "streaming copy", op.stream_gbps, format_us(op.stream_max_rank.avg).c_str(),
               op.stream_gbps > 0 ? op.algbw_gbps / op.stream_gbps : 0);
  std::fprintf(f, "  %-28s %.2f GB/s = the %s  ->  epx = %.2fx the limit\n", "limit (the faster copy)", op.limit_gbps,
               op.limit_name.c_str(), op.ratio_vs_limit);
  if (is_dispatch) {
    const std::uint64_t calls = rep.one_copy_calls + rep.copy_calls + rep.view_calls;
    std::fprintf(f, "  %-28s one copy %llu, copy %llu%s, view %llu of %llu timed dispatches (all ranks)%s\n", "output (recv_x)",
                 static_cast<unsigned long long>(rep.one_copy_calls), static_cast<unsigned long long>(rep.copy_calls),
                 rep.copy_calls > 0 ? (" (" + rep.copy_why + ")").c_str() : "", static_cast<unsigned long long>(rep.view_calls),
                 static_cast<unsigned long long>(calls),
                 rep.copy_calls > 0 && rep.copy_why == "output pool exhausted" ? "  WARNING: the output pool was exhausted" : "");
  }
  if (op.data_first)
    std::fprintf(f, "  %-28s every rank put its rows before the header exchange, which then completed them\n"
                    "  %-28s (%s): one synchronisation per call instead of two\n",
                 "rows first", "", is_dispatch ? "right after a combine" : "right after a dispatch");
  if (op.pulled)
    std::fprintf(f, "  %-28s every source read its tokens' rows in place in the expert ranks' windows and reduced them\n"
                    "  %-28s (y = the zero-copy recv_x on every rank): no puts, one pass; bytes counted at the reader\n",
                 "pull mode", "");
}

// The engine's put counters per call (all ranks, per queue) and the counters' own overhead.
void print_op_counters(std::FILE* f, const BenchReport& rep, const OpReport& op, bool is_dispatch) {
  if (op.counters && !op.pulled) {
    std::int64_t rows = 0;
    for (int r = 0; r < rep.ranks; ++r) rows += is_dispatch ? rep.count.sent_rows[at(r)] : rep.count.recv_rows[at(r)];
    double meta = 0;
    for (double m : op.metadata_bytes_per_row) meta = std::max(meta, m);
    std::fprintf(f, "  %-28s %.0f per call (%.0f remote), %.0f B/put; %lld rows -> %.1f rows/put; epx bytes = payload + %.0f B/row metadata\n",
                 "puts (all ranks)", op.puts, op.remote_puts, op.bytes_per_put, static_cast<long long>(rows),
                 op.puts > 0 ? static_cast<double>(rows) / op.puts : 0, meta);
    const double all_bytes = std::accumulate(op.queue_bytes.begin(), op.queue_bytes.end(), 0.0);
    for (size_t q = 0; q < op.queue_puts.size(); ++q)
      std::fprintf(f, "  %-28s %.0f puts, %s MB (%.0f%% of the bytes) per call; completion wait %s us per rank\n",
                   fmt("queue %zu (all ranks)", q).c_str(), op.queue_puts[q], mb(op.queue_bytes[q]).c_str(),
                   all_bytes > 0 ? 100 * op.queue_bytes[q] / all_bytes : 0.0, format_us(op.queue_wait_us[q]).c_str());
  } else {
    std::fprintf(f, "  %-28s (counters off: --no-counters)\n", "puts");
  }
  if (!op.overhead) return;
  const std::string& of = rep.options.overhead_of;
  std::fprintf(f, "  %-28s on/off = %.3f  (median max-rank latency %s us on, %zu iters; %s us off, %zu iters)\n",
               (of + " overhead").c_str(), op.counters_ratio, format_us(op.on.p50).c_str(), op.on.n, format_us(op.off.p50).c_str(), op.off.n);
  std::fprintf(f, "  %-28s %s %s: %s us %s, %s us %s: drift %.1f%%%s\n", "", of.c_str(), rep.options.overhead_main_on() ? "off" : "on",
               format_us(op.compare_before.p50).c_str(), of == "waits" ? "in the first half (interleaved)" : "before the timed loop",
               format_us(op.compare_after.p50).c_str(), of == "waits" ? "in the second" : "after", 100 * op.drift,
               std::fabs(op.counters_ratio - 1) <= op.drift ? " >= |on/off - 1|: the difference is within this machine's noise" : "");
}

// Per rank: latency, bytes, bandwidth, memcpy, puts; then the phases per rank.
void print_op_ranks(std::FILE* f, const BenchReport& rep, const OpReport& op) {
  const int P = rep.ranks;
  std::fprintf(f, "  rank    avg_us    p50_us    p95_us    max_us  remote_MB  local_MB  algbw_GB/s  memcpy_us%s\n",
               op.counters ? "   puts   B/put" : "");
  for (int r = 0; r < P; ++r) {
    const Summary& s = op.rank[at(r)];
    std::fprintf(f, "  %4d %9s %9s %9s %9s %10s %9s %11.2f %10s", r, format_us(s.avg).c_str(), format_us(s.p50).c_str(), format_us(s.p95).c_str(),
                 format_us(s.max).c_str(), mb(static_cast<double>(op.payload_bytes[at(r)] - op.local_bytes[at(r)])).c_str(),
                 mb(static_cast<double>(op.local_bytes[at(r)])).c_str(), op.algbw_rank_gbps[at(r)],
                 format_us(op.memcpy_rank_us[at(r)]).c_str());
    if (op.counters)
      std::fprintf(f, " %6.0f %7.0f", op.puts_rank[at(r)], op.puts_rank[at(r)] > 0 ? op.bytes_rank[at(r)] / op.puts_rank[at(r)] : 0);
    std::fprintf(f, "%s\n", r == op.slowest_rank ? "  <- slowest" : "");
  }
  if (!op.counters) return;
  std::fprintf(f, "  phases, avg us per call (max over the rank's workers):\n  rank");
  for (int p = 0; p < kBenchPhases; ++p) std::fprintf(f, " %10s", bench_phase_name(p));
  std::fprintf(f, "  dominant\n");
  for (int r = 0; r <= P; ++r) {
    const auto& ph = r < P ? op.phases_rank[at(r)] : op.phases_avg;
    std::fprintf(f, "  %4s", r < P ? std::to_string(r).c_str() : "avg");
    for (int p = 0; p < kBenchPhases; ++p) std::fprintf(f, " %10s", format_us(ph[at(p)]).c_str());
    std::fprintf(f, "  %s\n", bench_phase_name(r < P ? op.dominant_rank[at(r)] : op.dominant));
  }
}

void print_op(std::FILE* f, const BenchReport& rep, const OpReport& op, bool is_dispatch) {
  print_op_totals(f, rep, op, is_dispatch);
  print_op_counters(f, rep, op, is_dispatch);
  print_op_ranks(f, rep, op);
}

// Shares of the avg latency: data plane, control plane, synchronisation, other.
struct Planes {
  double data = 0, control = 0, sync = 0, other = 0;
};
Planes planes(const OpReport& op) {
  Planes p;
  const auto& a = op.phases_avg;
  const double total = std::accumulate(a.begin(), a.end(), 0.0);
  if (total <= 0) return p;
  p.data = (a[at(static_cast<int>(Phase::kPutIssue))] + a[at(static_cast<int>(Phase::kEpilogue))]) / total;
  p.control = (a[at(static_cast<int>(Phase::kPlan))] + a[at(static_cast<int>(Phase::kNotify))]) / total;
  p.sync = (a[at(static_cast<int>(Phase::kWaitData))] + a[at(static_cast<int>(Phase::kBarrier))]) / total;
  p.other = a[at(kNumPhases)] / total;
  return p;
}

// The run: shape, data type and layout, data plane, memory, iterations.
void print_header(std::FILE* f, const BenchReport& r) {
  const BenchOptions& o = r.options;
  const RouteCount& rc = r.count;
  const int P = r.ranks;
  std::int64_t tokens = 0;
  for (std::int64_t t : rc.tokens) tokens += t;
  std::fprintf(f, "epx bench: P=%d ranks (%s, %s worker%s each, %u cores)  S=%s tokens/rank  H=%d  K=%d  E=%d (%d per rank%s)\n", P,
               o.transport == "shm" ? "shm processes" : o.transport == "shmem" ? "shmem processes (from the launcher)" : "threads",
               r.workers > 0 ? std::to_string(r.workers).c_str() : (o.workers > 0 ? std::to_string(o.workers).c_str() : "auto"),
               r.workers == 1 ? "" : "s", r.cores,
               P > 0 && tokens == static_cast<std::int64_t>(P) * rc.tokens[0] ? std::to_string(rc.tokens[0]).c_str()
                                                                               : fmt("%.1f avg", static_cast<double>(tokens) / P).c_str(),
               r.hidden, r.topk, r.experts, r.experts / std::max(1, P),
               r.eplb.enabled ? fmt("; physical: %d logical + %d replicas", r.eplb.logical_experts, r.experts - r.eplb.logical_experts).c_str()
                              : "");
  std::fprintf(f, "  %s, %s layout%s, %s dispatch; routing: %s\n", r.fp8 ? "fp8 e4m3 (+ f32 scales)" : "bf16", o.layout.c_str(),
               o.expanded() ? fmt(" (alignment %d%s)", o.alignment, o.weighted ? ", weighted combine" : "").c_str() : "", o.cached ? (o.zero_copy ? "cached zero-copy" : "cached") : (o.zero_copy ? "fresh zero-copy" : "fresh"), r.source.c_str());
  std::fprintf(f, "  data plane: %s; receive area: %s; window %.1f MiB per rank (output pool: %s)\n", describe_dataplane(o.dataplane).c_str(),
               o.ring_rows > 0 ? fmt("ring of %lld rows per source", static_cast<long long>(o.ring_rows)).c_str() : "a slot per row",
               static_cast<double>(r.window_bytes) / (1 << 20),
               o.output_pool_bytes() < 0 ? "auto" : o.output_pool_bytes() == 0 ? "off" : fmt("%lld B", static_cast<long long>(o.output_pool_bytes())).c_str());
  if (!r.peak_rss_bytes.empty()) {
    std::string rss, anon;
    for (std::uint64_t b : r.peak_rss_bytes) rss += fmt(" %.0f", static_cast<double>(b) / (1 << 20));
    for (std::uint64_t b : r.anon_rss_bytes) anon += fmt(" %.0f", static_cast<double>(b) / (1 << 20));
    std::fprintf(f, "  peak RSS per rank, MiB (getrusage; every window page the rank touched counts, its peers' too):%s\n",
                 rss.c_str());
    std::fprintf(f, "  private RSS per rank after the timed loop, MiB (RssAnon: heap, inputs, outputs off the window):%s\n", anon.c_str());
  }
  std::fprintf(f, "  %d timed iterations after %d warmup, counters %s; latency = wall time of the call after a barrier; wall %.1f s\n",
               o.iters, o.warmup, o.counters ? "on" : "off", r.wall_s);
  if (P > 0 && r.cores > 0 && static_cast<unsigned>(P * std::max(1, r.workers)) > r.cores)
    std::fprintf(f, "  note: %d ranks x %d worker(s) share %u cores: ranks are time-sliced, latencies include waiting for a core\n", P,
                 std::max(1, r.workers), r.cores);
}

// The slowest rank's load: its round trip, rows and its experts' slots.
void print_slowest_rank(std::FILE* f, const BenchReport& r) {
  const RouteCount& rc = r.count;
  const RouteReport& h = r.route;
  const int L = r.experts / r.ranks, s = h.slowest_rank;
  std::int64_t mn = INT64_MAX, mx = 0, sum = 0;
  int mx_e = 0;
  for (int j = 0; j < L; ++j) {
    const std::int64_t n = rc.expert_rows[at(s * L + j)];
    mn = std::min(mn, n);
    sum += n;
    if (n > mx) mx = n, mx_e = s * L + j;
  }
  std::fprintf(f, "  slowest rank %d: dispatch+combine %s us (avg over ranks %s); receives %lld rows (avg %.1f); its experts "
               "%d..%d get min %lld avg %.1f max %lld (expert %d) slots\n",
               s, format_us(h.slowest_round_trip_us).c_str(), format_us(h.round_trip_avg_us).c_str(), static_cast<long long>(rc.recv_rows[at(s)]),
               h.recv_avg, s * L, s * L + L - 1, static_cast<long long>(mn), L ? static_cast<double>(sum) / L : 0.0,
               static_cast<long long>(mx), mx_e);
}

void print_routing(std::FILE* f, const BenchReport& r) {
  const RouteCount& rc = r.count;
  const RouteReport& h = r.route;
  std::fprintf(f, "\nROUTING%s\n", r.eplb.enabled ? "  (the physical routing, after EPLB: experts are the R physical slots)" : "");
  std::fprintf(f, "  %-28s %s  (avg %.2f)\n", "unique dest ranks per token", hist_text(h.unique_dest_hist).c_str(), h.avg_unique_dest);
  std::fprintf(f, "  %-28s min %lld  avg %.1f  max %lld (rank %d)  imbalance max/avg %.3f\n", "rows received per rank",
               static_cast<long long>(h.recv_min), h.recv_avg, static_cast<long long>(h.recv_max), h.recv_max_rank,
               h.recv_imbalance);
  std::fprintf(f, "  %-28s min %lld  avg %.1f  max %lld (expert %d)  imbalance max/avg %.3f\n", "rows (slots) per expert",
               static_cast<long long>(h.expert_min), h.expert_avg, static_cast<long long>(h.expert_max), h.expert_max_id,
               h.expert_imbalance);
  std::fprintf(f, "  rank  tokens  sent_rows  (local)  recv_rows  (local)  slots  out_rows  unique dests per token\n");
  for (int q = 0; q < r.ranks; ++q)
    std::fprintf(f, "  %4d %7lld %10lld %8lld %10lld %8lld %6lld %9lld  %s%s\n", q, static_cast<long long>(rc.tokens[at(q)]),
                 static_cast<long long>(rc.sent_rows[at(q)]), static_cast<long long>(rc.sent_local_rows[at(q)]),
                 static_cast<long long>(rc.recv_rows[at(q)]), static_cast<long long>(rc.recv_local_rows[at(q)]),
                 static_cast<long long>(rc.recv_slots[at(q)]), static_cast<long long>(rc.out_rows[at(q)]),
                 hist_text(rc.unique_dest_hist[at(q)]).c_str(), q == h.slowest_rank ? "  <- slowest" : "");
  if (r.ranks > 0) print_slowest_rank(f, r);
}

void print_baseline(std::FILE* f, const BenchReport& r) {
  const BaselineResult& b = r.baseline;
  std::fprintf(f, "\nMPI BASELINE (epx_mpi_baseline: Megatron-style MPI_Alltoallv dispatcher, same routing, same iterations)\n");
  if (!b.ran) {
    std::fprintf(f, "  MPI baseline unavailable: %s\n", b.why_not.c_str());
    return;
  }
  std::fprintf(f, "  %-10s %12s %12s %12s %12s   %s\n", "max-rank us", "epx avg", "mpi avg", "epx p50", "mpi p50",
               "epx speed / mpi speed (avg)");
  auto row = [&](const char* name, const Summary& e, const Summary& m) {
    std::fprintf(f, "  %-10s %12s %12s %12s %12s   %.2fx %s\n", name, format_us(e.avg).c_str(), format_us(m.avg).c_str(), format_us(e.p50).c_str(),
                 format_us(m.p50).c_str(), e.avg > 0 ? m.avg / e.avg : 0, e.avg > 0 && m.avg >= e.avg ? "(epx faster)" : "(mpi faster)");
  };
  row("dispatch", r.dispatch.max_rank, b.dispatch);
  row("combine", r.combine.max_rank, b.combine);
  Summary et, mt;
  et.avg = r.dispatch.max_rank.avg + r.combine.max_rank.avg;
  et.p50 = r.dispatch.max_rank.p50 + r.combine.max_rank.p50;
  mt.avg = b.dispatch.avg + b.combine.avg;
  mt.p50 = b.dispatch.p50 + b.combine.p50;
  row("round trip", et, mt);
  std::fprintf(f, "  %s: %s\n", b.verified ? "verified" : "MISMATCH", b.verify_detail.c_str());
}

// One op's summary line: bandwidth against the limit and the peers, where the time went, the slowest rank.
std::string summary_op_line(const BenchReport& r, const OpReport& op) {
  std::string line = fmt("  %-8s %.2f GB/s = %.2fx the limit (%s), %.2fx memcpy", op.name.c_str(), op.algbw_gbps, op.ratio_vs_limit,
                         op.limit_name.c_str(), op.ratio_vs_memcpy);
  if (r.baseline_requested && r.baseline.ran) {
    const Summary& m = &op == &r.dispatch ? r.baseline.dispatch : r.baseline.combine;
    line += fmt(", %.2fx the MPI baseline's speed", op.max_rank.avg > 0 ? m.avg / op.max_rank.avg : 0);
  }
  double rank_mean = 0;
  for (const Summary& s : op.rank) rank_mean += s.avg / static_cast<double>(op.rank.size());
  const double slow = op.rank.empty() || rank_mean <= 0 ? 0 : 100 * (op.rank[at(op.slowest_rank)].avg / rank_mean - 1);
  if (op.counters) {
    const Planes pl = planes(op);
    line += fmt("; time: data plane %.0f%%, control plane %.0f%%, sync %.0f%%, other %.0f%%; dominant phase %s", 100 * pl.data,
                100 * pl.control, 100 * pl.sync, 100 * pl.other, bench_phase_name(op.dominant));
  }
  return line + fmt("; slowest rank %d (+%.1f%% over the ranks' mean)", op.slowest_rank, slow);
}

// --diagnose: the whole loop's report (its matrices and verdict, and the persistent verdict
// over the intervals), then one line per interval with what its verdict named.
std::string named_brief(const MatrixVerdict& v) {
  if (v.clean()) return "-";
  std::string out;
  auto ints = [&](const char* what, const std::vector<int>& xs) {
    if (xs.empty()) return;
    out += std::string(out.empty() ? "" : " ") + what;
    for (std::size_t i = 0; i < xs.size(); ++i) out += (i ? "," : " ") + std::to_string(xs[i]);
  };
  ints("rows", v.rows);
  ints("cols", v.cols);
  if (!v.points.empty()) out += std::string(out.empty() ? "" : " ") + "points";
  for (const AbnormalPoint& p : v.points) out += " " + std::to_string(p.src) + "->" + std::to_string(p.dst);
  return out;
}

void print_diagnose(std::FILE* f, const BenchReport& r) {
  std::fprintf(f, "\nDIAGNOSE (the timed loop in %zu intervals; epx::Diagnose)\n%s", r.diagnose_intervals.size(),
               format_report(r.diagnose).c_str());
  std::fprintf(f, "  per interval (what each interval's verdict named):\n");
  for (const DiagnoseReport& i : r.diagnose_intervals)
    std::fprintf(f, "    %2llu  %6.2f s  dispatch: %-24s combine: %s\n", static_cast<unsigned long long>(i.exchanges), i.seconds,
                 named_brief(i.ops[0].verdict).c_str(), named_brief(i.ops[1].verdict).c_str());
}

void print_summary(std::FILE* f, const BenchReport& r) {
  std::fprintf(f, "\nSUMMARY\n");
  for (const OpReport* op : {&r.dispatch, &r.combine}) std::fprintf(f, "%s\n", summary_op_line(r, *op).c_str());
  std::fprintf(f, "  %-8s (data plane = put_issue + epilogue, control plane = plan + notify, sync = wait_data + barrier)\n", "");
  if (!r.dispatch.counters)
    std::fprintf(f, "  payload check: not done (epx's byte counters are off: --no-counters)\n");
  else if (r.warnings.empty() && moves_rows_once(r.options))
    std::fprintf(f, "  payload check: epx's byte counters = the independent count of the routing (+ row metadata) on every rank\n");
  else if (r.warnings.empty())
    std::fprintf(f, "  payload check: epx's byte counters >= the independent count of the routing on every rank (%s)\n",
                 r.options.dataplane.protocol == Protocol::kFlag ? "flag blocks carry flags and padding" : "relays forward rows once more");
  for (const std::string& w : r.warnings) std::fprintf(f, "  WARNING: %s\n", w.c_str());
  if (r.diagnose.exchanges > 0) print_diagnose(f, r);
}

}  // namespace

void print_bench_report(std::FILE* f, const BenchReport& r) {
  print_header(f, r);
  print_routing(f, r);
  print_eplb_report(f, r.eplb);
  print_op(f, r, r.dispatch, true);
  print_op(f, r, r.combine, false);
  if (r.baseline_requested) print_baseline(f, r);
  print_summary(f, r);
}

std::string bench_report_text(const BenchReport& r) {
  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  if (f == nullptr) throw Error(ErrorCode::kIo, "epx bench: cannot open a memory stream for the text report");
  print_bench_report(f, r);
  std::fclose(f);
  std::string text(buf, size);
  std::free(buf);
  return text;
}

}  // namespace epx::tools
