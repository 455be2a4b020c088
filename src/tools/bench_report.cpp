#include "bench_report.hpp"

#include "bench_dataplane.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <numeric>
#include <thread>

namespace epx::tools {

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

namespace {

// Whether every row travels exactly once with its metadata, so epx's byte counters must
// equal the payload plus one metadata size per row (else they can only be larger).
bool moves_rows_once(const BenchOptions& o) {
  return o.dataplane.protocol != Protocol::kFlag && o.dataplane.schedule.kind != ScheduleKind::kHierarchical;
}


using std::size_t;
size_t at(int i) { return static_cast<size_t>(i); }

double gbps(double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0; }

struct CallTotals {
  std::uint64_t puts = 0, put_bytes = 0, local_puts = 0, local_bytes = 0;
  std::uint64_t pulled_bytes = 0, local_pulled_bytes = 0;  // combine in pull mode (no puts)
  bool operator==(const CallTotals&) const = default;
};

CallTotals totals(const BenchCall& c) {
  CallTotals t;
  for (const WorkerStats& w : c.workers) {
    t.puts += w.puts;
    t.put_bytes += w.put_bytes;
    t.local_puts += w.local_puts;
    t.local_bytes += w.local_bytes;
    t.pulled_bytes += w.pulled_bytes;
    t.local_pulled_bytes += w.local_pulled_bytes;
  }
  return t;
}

OpReport aggregate_op(const char* name, bool is_dispatch, const BenchOptions& o, const RouteCount& rc,
                      const std::vector<BenchRankRecord>& recs, std::vector<std::string>& warnings) {
  const int P = static_cast<int>(recs.size());
  OpReport op;
  op.name = name;
  auto calls = [&](int r) -> const std::vector<BenchCall>& { return is_dispatch ? recs[at(r)].dispatch : recs[at(r)].combine; };

  // Latency.
  std::vector<std::vector<double>> memcpy_series(at(P)), stream_series(at(P));
  op.rank_series.resize(at(P));
  for (int r = 0; r < P; ++r) {
    for (const BenchCall& c : calls(r)) op.rank_series[at(r)].push_back(c.lat_us);
    op.rank.push_back(summarize(op.rank_series[at(r)]));
    memcpy_series[at(r)] = is_dispatch ? recs[at(r)].memcpy_dispatch_us : recs[at(r)].memcpy_combine_us;
    stream_series[at(r)] = is_dispatch ? recs[at(r)].stream_dispatch_us : recs[at(r)].stream_combine_us;
    op.memcpy_rank_us.push_back(mean(memcpy_series[at(r)]));
    if (op.rank[at(r)].avg > op.rank[at(op.slowest_rank)].avg) op.slowest_rank = r;
  }
  op.max_rank_series = max_over(op.rank_series);
  op.max_rank = summarize(op.max_rank_series);
  std::vector<double> span, skew;
  for (size_t i = 0; i < op.max_rank_series.size(); ++i) {
    double first = 1e300, last_start = -1e300, last_end = -1e300;
    for (int r = 0; r < P; ++r) {
      const BenchCall& c = calls(r)[i];
      first = std::min(first, c.start_us);
      last_start = std::max(last_start, c.start_us);
      last_end = std::max(last_end, c.start_us + c.lat_us);
    }
    span.push_back(last_end - first);
    skew.push_back(last_start - first);
  }
  op.span = summarize(span);
  op.start_skew_us = mean(skew);

  // Payload (the independent count) and bandwidth.
  for (int r = 0; r < P; ++r) {
    op.payload_bytes.push_back(is_dispatch ? rc.dispatch_bytes(r) : rc.combine_bytes(r));
    op.local_bytes.push_back(is_dispatch ? rc.dispatch_local_bytes(r) : rc.combine_local_bytes(r));
    op.total_payload += op.payload_bytes.back();
    op.moved_bytes.push_back(op.payload_bytes.back() + (is_dispatch ? rc.expansion_bytes(r) : 0));
    op.total_moved += op.moved_bytes.back();
    op.algbw_rank_gbps.push_back(gbps(static_cast<double>(op.moved_bytes.back()), op.rank[at(r)].avg));
  }
  op.algbw_gbps = gbps(static_cast<double>(op.total_moved), op.max_rank.avg);
  op.memcpy_max_rank = summarize(max_over(memcpy_series));
  op.memcpy_gbps = gbps(static_cast<double>(op.total_moved), op.memcpy_max_rank.avg);
  op.ratio_vs_memcpy = op.memcpy_gbps > 0 ? op.algbw_gbps / op.memcpy_gbps : 0;
  op.stream_max_rank = summarize(max_over(stream_series));
  op.stream_gbps = gbps(static_cast<double>(op.total_moved), op.stream_max_rank.avg);
  op.limit_name = op.stream_gbps > op.memcpy_gbps ? "streaming copy" : "memcpy";
  op.limit_gbps = std::max(op.memcpy_gbps, op.stream_gbps);
  op.ratio_vs_limit = op.limit_gbps > 0 ? op.algbw_gbps / op.limit_gbps : 0;

  op.data_first = P > 0;
  for (int r = 0; r < P; ++r)
    for (const BenchCall& c : calls(r)) op.data_first = op.data_first && c.data_first;

  // Engine counters.
  op.counters = P > 0;
  for (int r = 0; r < P; ++r)
    for (const BenchCall& c : calls(r))
      if (c.workers.empty()) op.counters = false;
  if (op.counters) {
    const auto& names = worker_metric_names();
    const int Q = std::clamp(o.dataplane.queues, 1, kMaxStatQueues);
    op.queue_puts.assign(at(Q), 0.0);
    op.queue_bytes.assign(at(Q), 0.0);
    op.queue_wait_us.assign(at(Q), 0.0);
    for (int r = 0; r < P; ++r) {
      const auto& cs = calls(r);
      const double n = static_cast<double>(cs.size());
      const CallTotals first = totals(cs.front());
      bool varies = false;
      std::array<double, kBenchPhases> ph{};
      const size_t W = cs.front().workers.size();
      std::vector<std::vector<double>> wm(W, std::vector<double>(names.size(), 0.0));
      for (const BenchCall& c : cs) {
        if (!(totals(c) == first)) varies = true;
        double covered = 0;
        for (int p = 0; p < kNumPhases; ++p) {
          double m = 0;
          for (const WorkerStats& w : c.workers) m = std::max(m, w.phase_us[at(p)]);
          ph[at(p)] += m / n;
          covered += m;
        }
        ph[at(kNumPhases)] += (c.lat_us - covered) / n;
        for (size_t w = 0; w < std::min(W, c.workers.size()); ++w) {
          const WorkerStats& s = c.workers[w];
          std::vector<double> v(s.phase_us.begin(), s.phase_us.end());
          for (std::uint64_t x : {s.puts, s.put_bytes, s.local_puts, s.local_bytes}) v.push_back(static_cast<double>(x));
          for (std::uint64_t x : s.queue_puts) v.push_back(static_cast<double>(x));
          for (std::uint64_t x : s.queue_bytes) v.push_back(static_cast<double>(x));
          for (double x : s.queue_wait_us) v.push_back(x);
          for (size_t m = 0; m < v.size() && m < names.size(); ++m) wm[w][m] += v[m] / n;
        }
      }
      op.worker_metrics.push_back(std::move(wm));
      std::vector<double> qp(at(Q), 0.0), qb(at(Q), 0.0), qw(at(Q), 0.0);
      for (const BenchCall& c : cs)
        for (const WorkerStats& s : c.workers)
          for (int q = 0; q < Q; ++q) {
            qp[at(q)] += static_cast<double>(s.queue_puts[at(q)]) / n;
            qb[at(q)] += static_cast<double>(s.queue_bytes[at(q)]) / n;
            qw[at(q)] += s.queue_wait_us[at(q)] / n;
          }
      for (int q = 0; q < Q; ++q) {
        op.queue_puts[at(q)] += qp[at(q)];
        op.queue_bytes[at(q)] += qb[at(q)];
        op.queue_wait_us[at(q)] += qw[at(q)] / P;
      }
      op.queue_puts_rank.push_back(std::move(qp));
      op.queue_bytes_rank.push_back(std::move(qb));
      op.queue_wait_us_rank.push_back(std::move(qw));
      // Cross-check: every put is counted on exactly one queue, and only on queues < --queues.
      std::uint64_t queued_puts = 0, queued_bytes = 0, beyond = 0;
      for (const WorkerStats& s : cs.front().workers)
        for (int q = 0; q < kMaxStatQueues; ++q) {
          queued_puts += s.queue_puts[at(q)];
          queued_bytes += s.queue_bytes[at(q)];
          if (q >= Q) beyond += s.queue_puts[at(q)];
        }
      if (queued_puts != first.puts + first.local_puts || queued_bytes != first.put_bytes + first.local_bytes)
        warnings.push_back(fmt("%s: rank %d: the per-queue counters (%llu puts, %llu bytes) do not add up to the puts (%llu, %llu bytes)",
                               name, r, static_cast<unsigned long long>(queued_puts), static_cast<unsigned long long>(queued_bytes),
                               static_cast<unsigned long long>(first.puts + first.local_puts),
                               static_cast<unsigned long long>(first.put_bytes + first.local_bytes)));
      if (beyond > 0)
        warnings.push_back(fmt("%s: rank %d: %llu puts on queues >= --queues %d", name, r, static_cast<unsigned long long>(beyond), Q));
      op.phases_rank.push_back(ph);
      op.dominant_rank.push_back(static_cast<int>(std::max_element(ph.begin(), ph.end()) - ph.begin()));
      for (int p = 0; p < kBenchPhases; ++p) op.phases_avg[at(p)] += ph[at(p)] / P;
      op.puts_rank.push_back(static_cast<double>(first.puts + first.local_puts));
      op.remote_puts_rank.push_back(static_cast<double>(first.puts));
      op.bytes_rank.push_back(static_cast<double>(first.put_bytes + first.local_bytes));
      op.remote_bytes_rank.push_back(static_cast<double>(first.put_bytes));
      op.puts += op.puts_rank.back();
      op.remote_puts += op.remote_puts_rank.back();
      if (varies) warnings.push_back(fmt("%s: rank %d: epx's put counters differ between iterations of the same routing", name, r));

      // Cross-check: epx's bytes = payload + the same metadata bytes for every row it sent.
      // A pull-mode combine moves the same rows, counted at the reader (the token's source):
      // one row per (token, destination) of its dispatch.
      const bool pulled = first.pulled_bytes + first.local_pulled_bytes > 0;
      if (pulled) op.pulled = true;
      const std::int64_t rows = is_dispatch || pulled ? rc.sent_rows[at(r)] : rc.recv_rows[at(r)];
      const std::int64_t local_rows = is_dispatch || pulled ? rc.sent_local_rows[at(r)] : rc.recv_local_rows[at(r)];
      const auto engine = static_cast<std::int64_t>(pulled ? first.pulled_bytes + first.local_pulled_bytes
                                                           : first.put_bytes + first.local_bytes);
      const auto engine_local = static_cast<std::int64_t>(pulled ? first.local_pulled_bytes : first.local_bytes);
      const std::int64_t expected = pulled ? rows * static_cast<std::int64_t>(rc.y_row_bytes) : op.payload_bytes[at(r)];
      const std::int64_t expected_local = pulled ? local_rows * static_cast<std::int64_t>(rc.y_row_bytes) : op.local_bytes[at(r)];
      const std::int64_t extra = engine - expected;
      const std::int64_t extra_local = engine_local - expected_local;
      const bool meta_expected = is_dispatch && !o.cached;
      const std::int64_t per_row = rows > 0 ? extra / rows : 0;
      op.metadata_bytes_per_row.push_back(rows > 0 ? static_cast<double>(extra) / static_cast<double>(rows) : 0.0);
      const std::int64_t bound = meta_expected ? 8 + 16 * static_cast<std::int64_t>(rc.topk) + 64 : 0;
      // Flag blocks (480 B payload + flag + padding) and relays (rows forwarded once more,
      // with records) put more than payload + metadata: there the check is a lower bound.
      const bool ok = moves_rows_once(o) ? extra >= 0 && (rows == 0 ? extra == 0 : extra == per_row * rows) && per_row <= bound &&
                                               extra_local == per_row * local_rows
                                         : extra >= 0;
      if (!ok)
        warnings.push_back(fmt("%s: rank %d: epx counted %lld bytes (%lld local) but the routing gives %lld payload bytes "
                               "(%lld local) for %lld rows: the difference is not %s",
                               name, r, static_cast<long long>(engine), static_cast<long long>(engine_local),
                               static_cast<long long>(expected), static_cast<long long>(expected_local),
                               static_cast<long long>(rows),
                               meta_expected ? "the same small metadata size per row" : "zero (no metadata expected)"));
    }
    const double all_puts = op.puts;
    double all_bytes = 0;
    for (double b : op.bytes_rank) all_bytes += b;
    op.bytes_per_put = all_puts > 0 ? all_bytes / all_puts : 0;
    op.dominant = static_cast<int>(std::max_element(op.phases_avg.begin(), op.phases_avg.end()) - op.phases_avg.begin());
  }

  // Counters off vs on.
  std::vector<std::vector<double>> off(at(P)), on(at(P));
  for (int r = 0; r < P; ++r) {
    off[at(r)] = is_dispatch ? recs[at(r)].off_dispatch_us : recs[at(r)].off_combine_us;
    on[at(r)] = is_dispatch ? recs[at(r)].on_dispatch_us : recs[at(r)].on_combine_us;
  }
  op.off = summarize(max_over(off));
  op.on = summarize(max_over(on));
  op.overhead = op.off.n > 0 && op.on.n > 0;
  op.counters_ratio = op.overhead && op.off.p50 > 0 ? op.on.p50 / op.off.p50 : 0;
  std::vector<std::vector<double>> before(at(P)), after(at(P));
  for (int r = 0; r < P; ++r) {
    const auto& other = o.counters ? off[at(r)] : on[at(r)];
    const size_t half = other.size() / 2;
    before[at(r)].assign(other.begin(), other.begin() + static_cast<std::ptrdiff_t>(half));
    after[at(r)].assign(other.begin() + static_cast<std::ptrdiff_t>(half), other.end());
  }
  op.compare_before = summarize(max_over(before));
  op.compare_after = summarize(max_over(after));
  op.drift = op.compare_after.p50 > 0 ? std::fabs(op.compare_before.p50 / op.compare_after.p50 - 1) : 0;
  return op;
}

}  // namespace

const char* bench_phase_name(int i) noexcept {
  return i < kNumPhases ? to_string(static_cast<Phase>(i)) : "other";
}

const std::vector<std::string>& worker_metric_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (int p = 0; p < kNumPhases; ++p) n.push_back(std::string(to_string(static_cast<Phase>(p))) + "_us");
    for (const char* c : {"puts", "put_bytes", "local_puts", "local_bytes"}) n.push_back(c);
    for (int q = 0; q < kMaxStatQueues; ++q) n.push_back("q" + std::to_string(q) + "_puts");
    for (int q = 0; q < kMaxStatQueues; ++q) n.push_back("q" + std::to_string(q) + "_bytes");
    for (int q = 0; q < kMaxStatQueues; ++q) n.push_back("q" + std::to_string(q) + "_wait_us");
    return n;
  }();
  return names;
}

BenchReport aggregate_bench(const BenchOptions& o, const BenchProblem& p, const RouteCount& rc,
                            const std::vector<BenchRankRecord>& records) {
  BenchReport r;
  r.options = o;
  r.ranks = p.ranks;
  r.experts = p.experts;
  r.hidden = p.hidden;
  r.topk = p.topk;
  r.max_tokens = p.max_tokens;
  r.fp8 = p.fp8;
  r.source = p.source;
  r.cores = std::thread::hardware_concurrency();
  r.count = rc;
  for (const BenchRankRecord& rec : records) r.workers = std::max(r.workers, rec.workers);
  for (const BenchRankRecord& rec : records) {
    r.window_bytes = std::max(r.window_bytes, rec.window_bytes);
    r.peak_rss_bytes.push_back(rec.peak_rss_bytes);
    r.anon_rss_bytes.push_back(rec.anon_rss_bytes);
    r.one_copy_calls += rec.one_copy_calls;
    r.copy_calls += rec.copy_calls;
    r.view_calls += rec.view_calls;
    if (!rec.copy_why.empty()) r.copy_why = rec.copy_why;
  }
  r.dispatch = aggregate_op("dispatch", true, o, rc, records, r.warnings);
  r.combine = aggregate_op("combine", false, o, rc, records, r.warnings);
  const double mt = r.dispatch.memcpy_max_rank.avg + r.combine.memcpy_max_rank.avg;
  r.memcpy_gbps = gbps(static_cast<double>(r.dispatch.total_moved + r.combine.total_moved), mt);
  for (const BenchRankRecord& rec : records)
    if (rec.out_rows != rc.out_rows[at(rec.rank)])
      r.warnings.push_back(fmt("rank %d: epx's dispatch output has %lld rows, the routing gives %lld", rec.rank,
                               static_cast<long long>(rec.out_rows), static_cast<long long>(rc.out_rows[at(rec.rank)])));

  // Route histogram.
  RouteReport& h = r.route;
  const int P = rc.ranks;
  h.unique_dest_hist.assign(rc.unique_dest_hist.empty() ? 1 : rc.unique_dest_hist[0].size(), 0);
  std::int64_t tokens = 0, dests = 0;
  for (const auto& rank_hist : rc.unique_dest_hist)
    for (size_t n = 0; n < rank_hist.size(); ++n) {
      h.unique_dest_hist[n] += rank_hist[n];
      tokens += rank_hist[n];
      dests += rank_hist[n] * static_cast<std::int64_t>(n);
    }
  h.avg_unique_dest = tokens > 0 ? static_cast<double>(dests) / static_cast<double>(tokens) : 0;
  if (P > 0) {
    const auto [mn, mx] = std::minmax_element(rc.recv_rows.begin(), rc.recv_rows.end());
    h.recv_min = *mn;
    h.recv_max = *mx;
    h.recv_max_rank = static_cast<int>(mx - rc.recv_rows.begin());
    h.recv_avg = static_cast<double>(std::accumulate(rc.recv_rows.begin(), rc.recv_rows.end(), std::int64_t{0})) / P;
    h.recv_imbalance = h.recv_avg > 0 ? static_cast<double>(h.recv_max) / h.recv_avg : 0;
    const auto [emn, emx] = std::minmax_element(rc.expert_rows.begin(), rc.expert_rows.end());
    h.expert_min = *emn;
    h.expert_max = *emx;
    h.expert_max_id = static_cast<int>(emx - rc.expert_rows.begin());
    h.expert_avg = static_cast<double>(std::accumulate(rc.expert_rows.begin(), rc.expert_rows.end(), std::int64_t{0})) /
                   static_cast<double>(rc.expert_rows.size());
    h.expert_imbalance = h.expert_avg > 0 ? static_cast<double>(h.expert_max) / h.expert_avg : 0;
    for (int q = 0; q < P; ++q) {
      const double rt = r.dispatch.rank[at(q)].avg + r.combine.rank[at(q)].avg;
      h.round_trip_avg_us += rt / P;
      if (q == 0 || rt > h.slowest_round_trip_us) {
        h.slowest_round_trip_us = rt;
        h.slowest_rank = q;
      }
    }
  }
  return r;
}

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

void print_op(std::FILE* f, const BenchReport& rep, const OpReport& op, bool is_dispatch) {
  const RouteCount& rc = rep.count;
  const int P = rep.ranks;
  std::fprintf(f, "\n%s  (payload: %s)\n", is_dispatch ? "DISPATCH" : "COMBINE",
               is_dispatch ? fmt("each token once per unique destination rank, x row = %zu B", rc.x_row_bytes).c_str()
                           : fmt("the dispatched (token, rank) rows back, bf16 row = %zu B, at the expert rank", rc.y_row_bytes).c_str());
  summary_line(f, "max-rank latency (us)", op.max_rank);
  std::fprintf(f, "  %-28s avg %9s  (first rank's start to last rank's end; start skew avg %s us)\n", "span (us)",
               format_us(op.span.avg).c_str(), format_us(op.start_skew_us).c_str());
  const std::int64_t expansion = op.total_moved - op.total_payload;
  std::fprintf(f, "  %-28s %.2f GB/s  (%s MB%s / avg max-rank latency)\n", "algbw total", op.algbw_gbps,
               mb(static_cast<double>(op.total_payload)).c_str(),
               expansion > 0 ? (" + " + mb(static_cast<double>(expansion)) + " MB local expansion copies").c_str() : "");
  std::fprintf(f, "  %-28s %.2f GB/s  (same bytes, same %d ranks at once, max-rank avg %s us)  ->  epx = %.2fx memcpy\n",
               "memcpy, this machine", op.memcpy_gbps, P, format_us(op.memcpy_max_rank.avg).c_str(), op.ratio_vs_memcpy);
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
  if (op.counters && !op.pulled) {
    std::int64_t rows = 0;
    for (int r = 0; r < P; ++r) rows += is_dispatch ? rc.sent_rows[at(r)] : rc.recv_rows[at(r)];
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
  if (op.overhead) {
    const bool on_main = rep.options.counters;
    std::fprintf(f, "  %-28s on/off = %.3f  (median max-rank latency %s us on, %zu iters; %s us off, %zu iters)\n",
                 "counters overhead", op.counters_ratio, format_us(op.on.p50).c_str(), op.on.n, format_us(op.off.p50).c_str(), op.off.n);
    std::fprintf(f, "  %-28s counters %s: %s us before the timed loop, %s us after: drift %.1f%%%s\n", "", on_main ? "off" : "on",
                 format_us(op.compare_before.p50).c_str(), format_us(op.compare_after.p50).c_str(), 100 * op.drift,
                 std::fabs(op.counters_ratio - 1) <= op.drift ? " >= |on/off - 1|: the difference is within this machine's noise"
                                                               : "");
  }

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

}  // namespace

void print_bench_report(std::FILE* f, const BenchReport& r) {
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
               o.expanded() ? fmt(" (alignment %d)", o.alignment).c_str() : "", o.cached ? (o.zero_copy ? "cached zero-copy" : "cached") : (o.zero_copy ? "fresh zero-copy" : "fresh"), r.source.c_str());
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
  for (int q = 0; q < P; ++q)
    std::fprintf(f, "  %4d %7lld %10lld %8lld %10lld %8lld %6lld %9lld  %s%s\n", q, static_cast<long long>(rc.tokens[at(q)]),
                 static_cast<long long>(rc.sent_rows[at(q)]), static_cast<long long>(rc.sent_local_rows[at(q)]),
                 static_cast<long long>(rc.recv_rows[at(q)]), static_cast<long long>(rc.recv_local_rows[at(q)]),
                 static_cast<long long>(rc.recv_slots[at(q)]), static_cast<long long>(rc.out_rows[at(q)]),
                 hist_text(rc.unique_dest_hist[at(q)]).c_str(), q == h.slowest_rank ? "  <- slowest" : "");
  if (P > 0) {
    const int L = r.experts / P, s = h.slowest_rank;
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

  print_eplb_report(f, r.eplb);

  print_op(f, r, r.dispatch, true);
  print_op(f, r, r.combine, false);

  if (r.baseline_requested) {
    const BaselineResult& b = r.baseline;
    std::fprintf(f, "\nMPI BASELINE (epx_mpi_baseline: Megatron-style MPI_Alltoallv dispatcher, same routing, same iterations)\n");
    if (!b.ran) {
      std::fprintf(f, "  MPI baseline unavailable: %s\n", b.why_not.c_str());
    } else {
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
  }

  std::fprintf(f, "\nSUMMARY\n");
  for (const OpReport* op : {&r.dispatch, &r.combine}) {
    std::string line = fmt("  %-8s %.2f GB/s = %.2fx the limit (%s), %.2fx memcpy", op->name.c_str(), op->algbw_gbps,
                           op->ratio_vs_limit, op->limit_name.c_str(), op->ratio_vs_memcpy);
    if (r.baseline_requested && r.baseline.ran) {
      const Summary& m = op == &r.dispatch ? r.baseline.dispatch : r.baseline.combine;
      line += fmt(", %.2fx the MPI baseline's speed", op->max_rank.avg > 0 ? m.avg / op->max_rank.avg : 0);
    }
    double rank_mean = 0;
    for (const Summary& s : op->rank) rank_mean += s.avg / static_cast<double>(op->rank.size());
    const double slow = op->rank.empty() || rank_mean <= 0 ? 0 : 100 * (op->rank[at(op->slowest_rank)].avg / rank_mean - 1);
    if (op->counters) {
      const Planes pl = planes(*op);
      line += fmt("; time: data plane %.0f%%, control plane %.0f%%, sync %.0f%%, other %.0f%%; dominant phase %s", 100 * pl.data,
                  100 * pl.control, 100 * pl.sync, 100 * pl.other, bench_phase_name(op->dominant));
    }
    line += fmt("; slowest rank %d (+%.1f%% over the ranks' mean)", op->slowest_rank, slow);
    std::fprintf(f, "%s\n", line.c_str());
  }
  std::fprintf(f, "  %-8s (data plane = put_issue + epilogue, control plane = plan + notify, sync = wait_data + barrier)\n", "");
  if (!r.dispatch.counters)
    std::fprintf(f, "  payload check: not done (epx's byte counters are off: --no-counters)\n");
  else if (r.warnings.empty() && moves_rows_once(o))
    std::fprintf(f, "  payload check: epx's byte counters = the independent count of the routing (+ row metadata) on every rank\n");
  else if (r.warnings.empty())
    std::fprintf(f, "  payload check: epx's byte counters >= the independent count of the routing on every rank (%s)\n",
                 o.dataplane.protocol == Protocol::kFlag ? "flag blocks carry flags and padding" : "relays forward rows once more");
  for (const std::string& w : r.warnings) std::fprintf(f, "  WARNING: %s\n", w.c_str());
}

}  // namespace epx::tools
