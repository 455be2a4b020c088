#include "epx/bench/report.hpp"

#include "epx/bench/dataplane_options.hpp"

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

bool moves_rows_once(const BenchOptions& o) {
  return o.dataplane.protocol != Protocol::kFlag && o.dataplane.schedule.kind != ScheduleKind::kHierarchical;
}

namespace {

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

// What aggregate_op reads: one op's calls on every rank, and where its warnings go.
struct OpInput {
  const char* name;
  bool is_dispatch;
  const BenchOptions& o;
  const RouteCount& rc;
  const std::vector<BenchRankRecord>& recs;
  std::vector<std::string>& warnings;

  int ranks() const { return static_cast<int>(recs.size()); }
  const std::vector<BenchCall>& calls(int r) const { return is_dispatch ? recs[at(r)].dispatch : recs[at(r)].combine; }
  const std::vector<double>& memcpy_us(int r) const { return is_dispatch ? recs[at(r)].memcpy_dispatch_us : recs[at(r)].memcpy_combine_us; }
  const std::vector<double>& stream_us(int r) const { return is_dispatch ? recs[at(r)].stream_dispatch_us : recs[at(r)].stream_combine_us; }
};

// Latency per rank and max over ranks, the span and start skew of each iteration.
void aggregate_latency(const OpInput& in, OpReport& op) {
  const int P = in.ranks();
  op.rank_series.resize(at(P));
  for (int r = 0; r < P; ++r) {
    for (const BenchCall& c : in.calls(r)) op.rank_series[at(r)].push_back(c.lat_us);
    op.rank.push_back(summarize(op.rank_series[at(r)]));
    op.memcpy_rank_us.push_back(mean(in.memcpy_us(r)));
    if (op.rank[at(r)].avg > op.rank[at(op.slowest_rank)].avg) op.slowest_rank = r;
  }
  op.max_rank_series = max_over(op.rank_series);
  op.max_rank = summarize(op.max_rank_series);
  std::vector<double> span, skew;
  for (size_t i = 0; i < op.max_rank_series.size(); ++i) {
    double first = 1e300, last_start = -1e300, last_end = -1e300;
    for (int r = 0; r < P; ++r) {
      const BenchCall& c = in.calls(r)[i];
      first = std::min(first, c.start_us);
      last_start = std::max(last_start, c.start_us);
      last_end = std::max(last_end, c.start_us + c.lat_us);
    }
    span.push_back(last_end - first);
    skew.push_back(last_start - first);
  }
  op.span = summarize(span);
  op.start_skew_us = mean(skew);
}

// Payload (the independent count), the bytes moved (the layout's rows: RouteCount::moved_*),
// bandwidth, and the limit: the faster of the memcpy and the streaming copy of the moved bytes.
void aggregate_bandwidth(const OpInput& in, OpReport& op) {
  const int P = in.ranks();
  const RouteCount& rc = in.rc;
  std::vector<std::vector<double>> memcpy_series(at(P)), stream_series(at(P));
  for (int r = 0; r < P; ++r) {
    memcpy_series[at(r)] = in.memcpy_us(r);
    stream_series[at(r)] = in.stream_us(r);
    op.payload_bytes.push_back(in.is_dispatch ? rc.dispatch_bytes(r) : rc.combine_bytes(r));
    op.local_bytes.push_back(in.is_dispatch ? rc.dispatch_local_bytes(r) : rc.combine_local_bytes(r));
    op.total_payload += op.payload_bytes.back();
    op.moved_bytes.push_back(in.is_dispatch ? rc.moved_dispatch_bytes(r) : rc.moved_combine_bytes(r));
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
    for (const BenchCall& c : in.calls(r)) op.data_first = op.data_first && c.data_first;
}

// Rank r's phases (avg over calls of the max over workers, "other" = not covered) and its
// per-worker metrics (avg over calls).
void rank_phases(const std::vector<BenchCall>& cs, OpReport& op) {
  const auto& names = worker_metric_names();
  const double n = static_cast<double>(cs.size());
  std::array<double, kBenchPhases> ph{};
  const size_t W = cs.front().workers.size();
  std::vector<std::vector<double>> wm(W, std::vector<double>(names.size(), 0.0));
  for (const BenchCall& c : cs) {
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
  op.phases_rank.push_back(ph);
  op.dominant_rank.push_back(static_cast<int>(std::max_element(ph.begin(), ph.end()) - ph.begin()));
}

// Rank r's puts, bytes and wait per queue (avg over calls) into the op's totals; checks
// that every put is counted on exactly one queue, and only on queues < --queues.
void rank_queues(const OpInput& in, int r, int Q, const CallTotals& first, OpReport& op) {
  const auto& cs = in.calls(r);
  const double n = static_cast<double>(cs.size());
  const int P = in.ranks();
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
  std::uint64_t queued_puts = 0, queued_bytes = 0, beyond = 0;
  for (const WorkerStats& s : cs.front().workers)
    for (int q = 0; q < kMaxStatQueues; ++q) {
      queued_puts += s.queue_puts[at(q)];
      queued_bytes += s.queue_bytes[at(q)];
      if (q >= Q) beyond += s.queue_puts[at(q)];
    }
  if (queued_puts != first.puts + first.local_puts || queued_bytes != first.put_bytes + first.local_bytes)
    in.warnings.push_back(fmt("%s: rank %d: the per-queue counters (%llu puts, %llu bytes) do not add up to the puts (%llu, %llu bytes)",
                              in.name, r, static_cast<unsigned long long>(queued_puts), static_cast<unsigned long long>(queued_bytes),
                              static_cast<unsigned long long>(first.puts + first.local_puts),
                              static_cast<unsigned long long>(first.put_bytes + first.local_bytes)));
  if (beyond > 0)
    in.warnings.push_back(fmt("%s: rank %d: %llu puts on queues >= --queues %d", in.name, r, static_cast<unsigned long long>(beyond), Q));
}

// The payload rows rank r's counters count (all, local). Dispatch: its rows to every
// destination, one per (token, rank), or one per slot where the destination's expanded
// output took them in one copy (its output kind says so). A pulling combine: the rows it
// read, counted at the reader, one per (token, rank) of its dispatch or, expanded, one per
// slot (each slot's row of y). A pushing combine: the (token, rank) rows it sent back.
std::pair<std::int64_t, std::int64_t> counted_rows(const OpInput& in, int r, bool pulled) {
  const RouteCount& rc = in.rc;
  if (!in.is_dispatch && !pulled) return {rc.recv_rows[at(r)], rc.recv_local_rows[at(r)]};
  if (!rc.expanded) return {rc.sent_rows[at(r)], rc.sent_local_rows[at(r)]};
  const int P = in.ranks();
  std::int64_t rows = 0, local = 0;
  for (int d = 0; d < P; ++d) {
    const bool per_slot = pulled || in.recs[at(d)].one_copy_calls > 0;
    const std::int64_t n = (per_slot ? rc.pair_slots : rc.pair_rows)[at(r) * at(P) + at(d)];
    rows += n;
    if (d == r) local = n;
  }
  return {rows, local};
}

// Cross-check: epx's bytes = those rows + the same metadata bytes for every (token, rank)
// row it sent (metadata travels once per row of the plan, however many slots it fills).
void check_rank_bytes(const OpInput& in, int r, const CallTotals& first, OpReport& op) {
  const RouteCount& rc = in.rc;
  const bool pulled = first.pulled_bytes + first.local_pulled_bytes > 0;
  if (pulled) op.pulled = true;
  const std::int64_t rows = in.is_dispatch || pulled ? rc.sent_rows[at(r)] : rc.recv_rows[at(r)];
  const std::int64_t local_rows = in.is_dispatch || pulled ? rc.sent_local_rows[at(r)] : rc.recv_local_rows[at(r)];
  const auto [payload_rows, local_payload_rows] = counted_rows(in, r, pulled);
  const auto row_bytes = static_cast<std::int64_t>(in.is_dispatch ? rc.x_row_bytes : rc.y_row_bytes);
  const auto engine = static_cast<std::int64_t>(pulled ? first.pulled_bytes + first.local_pulled_bytes
                                                       : first.put_bytes + first.local_bytes);
  const auto engine_local = static_cast<std::int64_t>(pulled ? first.local_pulled_bytes : first.local_bytes);
  const std::int64_t expected = payload_rows * row_bytes;
  const std::int64_t expected_local = local_payload_rows * row_bytes;
  const std::int64_t extra = engine - expected;
  const std::int64_t extra_local = engine_local - expected_local;
  const bool meta_expected = in.is_dispatch && !in.o.cached;
  const std::int64_t per_row = rows > 0 ? extra / rows : 0;
  op.metadata_bytes_per_row.push_back(rows > 0 ? static_cast<double>(extra) / static_cast<double>(rows) : 0.0);
  const std::int64_t bound = meta_expected ? 8 + 16 * static_cast<std::int64_t>(rc.topk) + 64 : 0;
  // Flag blocks (480 B payload + flag + padding), relays (rows forwarded once more, with
  // records) and per-selection replies (a row per (token, expert), not per (token, rank))
  // put more than payload + metadata: there the check is a lower bound.
  const bool per_selection = !in.is_dispatch && rc.expanded && in.o.dataplane.combine_replies == CombineReplies::kSelections;
  const bool ok = moves_rows_once(in.o) && !per_selection ? extra >= 0 && (rows == 0 ? extra == 0 : extra == per_row * rows) && per_row <= bound &&
                                              extra_local == per_row * local_rows
                                        : extra >= 0;
  if (!ok)
    in.warnings.push_back(fmt("%s: rank %d: epx counted %lld bytes (%lld local) but the routing gives %lld payload bytes "
                              "(%lld local: %lld rows of %lld B) for %lld (token, rank) rows: the difference is not %s",
                              in.name, r, static_cast<long long>(engine), static_cast<long long>(engine_local),
                              static_cast<long long>(expected), static_cast<long long>(expected_local),
                              static_cast<long long>(payload_rows), static_cast<long long>(row_bytes), static_cast<long long>(rows),
                              meta_expected ? "the same small metadata size per row" : "zero (no metadata expected)"));
}

// Engine counters (none when any call of any rank ran with counters off).
void aggregate_counters(const OpInput& in, OpReport& op) {
  const int P = in.ranks();
  op.counters = P > 0;
  for (int r = 0; r < P; ++r)
    for (const BenchCall& c : in.calls(r))
      if (c.workers.empty()) op.counters = false;
  if (!op.counters) return;
  const int Q = std::clamp(in.o.dataplane.queues, 1, kMaxStatQueues);
  op.queue_puts.assign(at(Q), 0.0);
  op.queue_bytes.assign(at(Q), 0.0);
  op.queue_wait_us.assign(at(Q), 0.0);
  for (int r = 0; r < P; ++r) {
    const auto& cs = in.calls(r);
    const CallTotals first = totals(cs.front());
    bool varies = false;
    for (const BenchCall& c : cs)
      if (!(totals(c) == first)) varies = true;
    rank_phases(cs, op);
    rank_queues(in, r, Q, first, op);
    for (int p = 0; p < kBenchPhases; ++p) op.phases_avg[at(p)] += op.phases_rank.back()[at(p)] / P;
    op.puts_rank.push_back(static_cast<double>(first.puts + first.local_puts));
    op.remote_puts_rank.push_back(static_cast<double>(first.puts));
    op.bytes_rank.push_back(static_cast<double>(first.put_bytes + first.local_bytes));
    op.remote_bytes_rank.push_back(static_cast<double>(first.put_bytes));
    op.puts += op.puts_rank.back();
    op.remote_puts += op.remote_puts_rank.back();
    if (varies) in.warnings.push_back(fmt("%s: rank %d: epx's put counters differ between iterations of the same routing", in.name, r));
    check_rank_bytes(in, r, first, op);
  }
  const double all_puts = op.puts;
  double all_bytes = 0;
  for (double b : op.bytes_rank) all_bytes += b;
  op.bytes_per_put = all_puts > 0 ? all_bytes / all_puts : 0;
  op.dominant = static_cast<int>(std::max_element(op.phases_avg.begin(), op.phases_avg.end()) - op.phases_avg.begin());
}

// Counters off vs on, and the drift between the comparison blocks before and after.
void aggregate_overhead(const OpInput& in, OpReport& op) {
  const int P = in.ranks();
  const auto& recs = in.recs;
  std::vector<std::vector<double>> off(at(P)), on(at(P));
  for (int r = 0; r < P; ++r) {
    off[at(r)] = in.is_dispatch ? recs[at(r)].off_dispatch_us : recs[at(r)].off_combine_us;
    on[at(r)] = in.is_dispatch ? recs[at(r)].on_dispatch_us : recs[at(r)].on_combine_us;
  }
  op.off = summarize(max_over(off));
  op.on = summarize(max_over(on));
  op.overhead = op.off.n > 0 && op.on.n > 0;
  op.counters_ratio = op.overhead && op.off.p50 > 0 ? op.on.p50 / op.off.p50 : 0;
  std::vector<std::vector<double>> before(at(P)), after(at(P));
  for (int r = 0; r < P; ++r) {
    const auto& other = in.o.overhead_main_on() ? off[at(r)] : on[at(r)];
    const size_t half = other.size() / 2;
    before[at(r)].assign(other.begin(), other.begin() + static_cast<std::ptrdiff_t>(half));
    after[at(r)].assign(other.begin() + static_cast<std::ptrdiff_t>(half), other.end());
  }
  op.compare_before = summarize(max_over(before));
  op.compare_after = summarize(max_over(after));
  op.drift = op.compare_after.p50 > 0 ? std::fabs(op.compare_before.p50 / op.compare_after.p50 - 1) : 0;
}

OpReport aggregate_op(const char* name, bool is_dispatch, const BenchOptions& o, const RouteCount& rc,
                      const std::vector<BenchRankRecord>& recs, std::vector<std::string>& warnings) {
  const OpInput in{name, is_dispatch, o, rc, recs, warnings};
  OpReport op;
  op.name = name;
  aggregate_latency(in, op);
  aggregate_bandwidth(in, op);
  aggregate_counters(in, op);
  aggregate_overhead(in, op);
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

namespace {

// --diagnose: rank 0's matrices of each interval of the timed loop with DeepEP's verdict (the
// thresholds' defaults), and the whole loop's: the intervals' waits summed (µs per call x
// calls), over their calls, its verdict, and the persistent verdict over the intervals'.
void diagnose_of(const BenchOptions& o, const BenchRankRecord& rec, const std::vector<RankInfo>& ranks, BenchReport& r) {
  const std::size_t P = ranks.size();
  DiagnoseReport& d = r.diagnose;
  d.ranks = ranks;
  d.persist = {o.diagnose_intervals, o.diagnose_need};
  std::array<std::vector<double>, kNumWaitOps> total_us;
  for (std::size_t op = 0; op < d.ops.size(); ++op) {
    total_us[op].assign(P * P, 0);
    d.ops[op].calls.assign(P, 0);
  }
  std::array<std::vector<MatrixVerdict>, kNumWaitOps> verdicts;
  std::vector<std::array<MatrixVerdict, kNumWaitOps>> both;  // per interval, both ops: the per-rank verdict's input
  for (std::size_t k = 0; k < rec.diagnose_seconds.size(); ++k) {
    DiagnoseReport i;
    i.exchanges = k + 1;
    i.seconds = rec.diagnose_seconds[k];
    i.ranks = ranks;
    i.persist = d.persist;
    i.window = std::min<std::uint64_t>(k + 1, static_cast<std::uint64_t>(d.persist.of));
    for (std::size_t op = 0; op < d.ops.size(); ++op) {
      DiagnoseOp& io = i.ops[op];
      io.matrix_us = rec.diagnose_us[k][op];
      io.calls = rec.diagnose_calls[k][op];
      io.verdict = diagnose_matrix(io.matrix_us, static_cast<int>(P), i.thresholds);
      verdicts[op].push_back(io.verdict);
      io.persistent = persistent_verdict(verdicts[op], i.persist);
      for (std::size_t s = 0; s < P; ++s)
        for (std::size_t dst = 0; dst < P; ++dst)
          total_us[op][s * P + dst] += io.matrix_us[s * P + dst] * static_cast<double>(io.calls[dst]);
      for (std::size_t dst = 0; dst < P; ++dst) d.ops[op].calls[dst] += io.calls[dst];
    }
    both.emplace_back();
    for (std::size_t op = 0; op < d.ops.size(); ++op) both.back()[op] = i.ops[op].verdict;
    i.persistent = persistent_ranks(both, i.persist);
    d.seconds += i.seconds;
    r.diagnose_intervals.push_back(std::move(i));
  }
  d.exchanges = rec.diagnose_seconds.size();
  d.window = std::min<std::uint64_t>(d.exchanges, static_cast<std::uint64_t>(d.persist.of));
  for (std::size_t op = 0; op < d.ops.size(); ++op) {
    DiagnoseOp& w = d.ops[op];
    w.matrix_us.assign(P * P, 0);
    for (std::size_t s = 0; s < P; ++s)
      for (std::size_t dst = 0; dst < P; ++dst)
        if (w.calls[dst] > 0) w.matrix_us[s * P + dst] = total_us[op][s * P + dst] / static_cast<double>(w.calls[dst]);
    w.verdict = diagnose_matrix(w.matrix_us, static_cast<int>(P), d.thresholds);
    w.persistent = persistent_verdict(verdicts[op], d.persist);
  }
  d.persistent = persistent_ranks(both, d.persist);
}

/// What the report says the run was: the options, the problem's shape and the routing's count.
void describe_run(const BenchOptions& o, const BenchProblem& p, const RouteCount& rc, BenchReport& r) {
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
}

/// The ranks' own facts: workers, window, memory, how the outputs were handed over, who is where.
void gather_rank_facts(const std::vector<BenchRankRecord>& records, BenchReport& r) {
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
  for (const BenchRankRecord& rec : records) r.rank_info.push_back({rec.rank, rec.pid, rec.node});
}

/// A warning for each rank whose dispatch output has other than the routing's row count.
void warn_on_output_rows(const RouteCount& rc, const std::vector<BenchRankRecord>& records,
                         std::vector<std::string>& warnings) {
  for (const BenchRankRecord& rec : records)
    if (rec.out_rows != rc.out_rows[at(rec.rank)])
      warnings.push_back(fmt("rank %d: epx's dispatch output has %lld rows, the routing gives %lld", rec.rank,
                             static_cast<long long>(rec.out_rows), static_cast<long long>(rc.out_rows[at(rec.rank)])));
}

/// The routing's shape (destinations per token, rows per rank and per expert) and the
/// ranks' round trips.
RouteReport route_report(const RouteCount& rc, const OpReport& dispatch, const OpReport& combine) {
  RouteReport h;
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
  if (P <= 0) return h;
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
    const double rt = dispatch.rank[at(q)].avg + combine.rank[at(q)].avg;
    h.round_trip_avg_us += rt / P;
    if (q == 0 || rt > h.slowest_round_trip_us) {
      h.slowest_round_trip_us = rt;
      h.slowest_rank = q;
    }
  }
  return h;
}

}  // namespace

BenchReport aggregate_bench(const BenchOptions& o, const BenchProblem& p, const RouteCount& rc,
                            const std::vector<BenchRankRecord>& records) {
  BenchReport r;
  describe_run(o, p, rc, r);
  gather_rank_facts(records, r);
  if (!records.empty() && records[0].diagnosed) diagnose_of(o, records[0], r.rank_info, r);
  r.dispatch = aggregate_op("dispatch", true, o, rc, records, r.warnings);
  r.combine = aggregate_op("combine", false, o, rc, records, r.warnings);
  const double mt = r.dispatch.memcpy_max_rank.avg + r.combine.memcpy_max_rank.avg;
  r.memcpy_gbps = gbps(static_cast<double>(r.dispatch.total_moved + r.combine.total_moved), mt);
  warn_on_output_rows(rc, records, r.warnings);
  r.route = route_report(rc, r.dispatch, r.combine);
  return r;
}

}  // namespace epx::tools
