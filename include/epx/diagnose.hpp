// epx/diagnose.hpp — which rank or link is slow, in a running job (DeepEP's Diagnose).
//
//   epx::Buffer buffer(transport, config);
//   epx::Diagnose diag(transport, buffer, {.interval = std::chrono::seconds(10)});  // collective
//   diag.start();                          // an exchange of the waits every interval, in the background
//   ... dispatch / combine as usual ...
//   diag.stop();                           // collective: one last exchange, then the thread ends
//   epx::DiagnoseReport r = diag.report();  // on every rank: the last interval's matrices and verdicts,
//                                           // and the persistent verdicts over the last intervals
//
// The matrix, per op (dispatch, combine): M[src][dst] = the average time per call, in µs,
// that rank dst waited for rank src's header and rows during the interval — rank dst's
// PeerWaits (epx/stats.hpp: recorded by every Buffer call, always on). Rows are sources
// (the ranks waited for), columns destinations (the ranks that waited). Every rank holds the
// whole matrix after each exchange.
//
// The verdict is DeepEP's rule (deep_ep/diagnose.py, diagnose_matrix) — ratios to a typical
// value — with the typical value taken from the OTHERS, never including the value judged
// (docs/diagnose.md, "The verdict"):
//   * abnormal row s:    mean of row s    / mean of the other rows' means    > thresholds.row   (3): a
//                        slow source — every rank waits for s (s is late: stopped, starved of CPU, ...);
//   * abnormal column d: mean of column d / mean of the other columns' means > thresholds.col   (3): a
//                        slow destination — d waits for everyone (d is slow to take its rows in);
//                        a row's and a column's mean are over their links (the diagonal, a
//                        rank's wait for itself, left out), so the floor below is per link;
//   * abnormal point:    M[s][d]          / mean of the other links          > thresholds.point (5), and
//                        the same against the other values of its own row and of its own column: a
//                        slow link s -> d; the links are the off-diagonal values outside the abnormal
//                        rows and columns, whose points are not listed again — except
//                        (thresholds.links) a point that alone makes its row or column abnormal:
//                        it is listed, that row or column is not;
//   and each also above the others' mean by more than thresholds.floor_us (50 µs per call), and
//   above the others' MEDIAN by more than floor_us and by more than thresholds.spread (5) robust
//   deviations of the others (1.4826 x their median absolute deviation): a value stands out
//   only of others tight enough for it to, and a few slow others lower no bar.
// DeepEP divides by the mean of all rows, the slow one's included: a single slow rank at k
// times the others reaches only kP / (k + P - 1) (8 ranks, k = 4.6: 3.2x; 4 ranks: never
// 4x), so a rank stopped in bursts could hide in the mean it inflates. Against the others'
// mean, its ratio is k at every P. Nothing is flagged at P = 1 (there are no others).
//
// That is the verdict of ONE interval (DiagnoseOp::verdict, DeepEP's meaning). Beside it, the
// persistent verdict names only what the interval verdicts named in at least
// options.persist.need of the last options.persist.of intervals: a rank the scheduler left
// behind, or a stall of the whole machine, is abnormal in one interval and gone in the next; a
// stopped, starved or badly linked rank stays. DiagnoseReport::persistent counts per RANK (a
// row or column of either op) and per link (a point pair named by both ops): the verdict to
// act on. DiagnoseOp::persistent counts each op's rows, columns and points apart.
//
// The exchange runs on an endpoint of the transport of its own (Transport::open_endpoint(): a
// small window of its own, never the Buffer's), from the thread that start() creates: every
// rank puts its totals into every rank's window (2·(P+1) numbers), then one signal; nothing
// else of the job waits for it. A transport without endpoints is used itself (it must then
// carry nothing else, e.g. a transport connected for the Diagnose alone). Each exchange waits
// at most the transport's timeout for every rank: a rank that does not answer ends the
// background exchange on the others with `error` set (and logged); the last matrices stay.
//
// Lifecycle: construction is collective (it also exchanges every rank's pid and node name,
// gethostname()); start(), stop(), exchange() are collective; report() and watch() are
// local. The transport must outlive the Diagnose; watched buffers need not (PeerWaits is shared).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "epx/stats.hpp"
#include "epx/transport.hpp"

namespace epx {

class Buffer;

/// DeepEP's defaults: a row or column 3x the typical row / column, a point 5x the typical link
/// (each against the mean of the others, above), an absolute floor and a robust deviation.
struct DiagnoseThresholds {
  double row = 3.0;
  double col = 3.0;
  double point = 5.0;
  /// A row and a column abnormal only through their crossing point are that point, a slow
  /// link (see diagnose_matrix); false: no such refinement (the row and the column).
  bool links = true;
  /// µs per call: a row, column or point is abnormal only if it also exceeds its typical
  /// value by more than this (a wait of 5 µs against 1 µs is a ratio of 5, not a fault; a
  /// descheduled rank costs milliseconds). >= 0; 0 = ratios alone.
  double floor_us = 50.0;
  /// Robust deviations: a row, column or point is abnormal only if it also exceeds the
  /// others' median by more than `spread` x 1.4826 x the others' median absolute deviation
  /// (a normal noise's standard deviation). >= 0; 0 = no such test.
  double spread = 5.0;
};

/// One slow link: M[src][dst] = value_us, ratio = value_us / the typical link (the mean of the
/// other off-diagonal values outside the abnormal rows and columns).
struct AbnormalPoint {
  int src = 0;
  int dst = 0;
  double value_us = 0;
  double ratio = 0;
};

/// The verdict on one matrix (each list ascending; points by src, then dst).
struct MatrixVerdict {
  std::vector<int> rows;               ///< slow sources
  std::vector<int> cols;               ///< slow destinations
  std::vector<AbnormalPoint> points;   ///< slow links, outside the abnormal rows and columns
  bool clean() const noexcept { return rows.empty() && cols.empty() && points.empty(); }
};

/// Local, pure: the rule (above) on the P x P matrix `m` (row-major, m[src * P + dst], every
/// value >= 0), then, with thresholds.links, one refinement: a single dominant point (s, d)
/// lifts row s and column d with it (at 4 ranks a point 9x the typical link makes its row
/// 3x the others), and the rule would report the row or column and suppress the point. A
/// point of an abnormal row s or column d, abnormal against the typical link, with which set
/// to the typical link row s or column d is no longer abnormal, is reported as a point
/// instead of it (largest first, repeatedly; the rest is judged on the matrix with those
/// points set aside). Throws kInvalidArgument unless m.size() == P * P, P >= 1, every value finite
/// and >= 0, every threshold > 0, floor_us and spread finite and >= 0. An all-equal or all-zero
/// matrix flags nothing.
MatrixVerdict diagnose_matrix(const std::vector<double>& m, int num_ranks, const DiagnoseThresholds& thresholds = {});

/// The persistent verdict's rule: a row, column or point is named persistently when the
/// per-interval verdict (diagnose_matrix) named it in at least `need` of the last `of`
/// intervals. One interval is a snapshot: on an oversubscribed machine the scheduler can leave
/// any rank behind for a whole interval (measured: 3-6x the others, as late as a stopped
/// rank), and one stall of the whole machine is charged to whatever each rank waited for at
/// that moment; such names move from interval to interval, a fault stays (docs/diagnose.md,
/// "Over intervals"). 1 <= need <= of.
struct DiagnosePersist {
  int of = 5;
  int need = 3;
};

/// Local, pure: the persistent verdict of one op over its intervals' verdicts (oldest first):
/// of the last `rule.of` of them (all of them if fewer), every row, column and point
/// (src, dst) that at least `rule.need` name, each counted on its own (a row is counted as a
/// row only, a point only as that point). A point's value_us and ratio are those of the latest
/// interval that named it. Fewer than `need` verdicts name nothing. Throws kInvalidArgument
/// unless 1 <= need <= of.
MatrixVerdict persistent_verdict(const std::vector<MatrixVerdict>& verdicts, const DiagnosePersist& rule);

/// The persistent verdict per rank and per link, over both ops (DiagnoseReport::persistent).
/// A fault's evidence moves between the kinds and ops of the interval verdicts: a rank
/// stopped in bursts is a dispatch row in one interval, a combine row in the next, a column in
/// a third (a stop inside one of its own waits is charged to the peer it waited for), so no
/// single kind of one op need reach `need` of `of` while the rank is named in every interval.
struct RankVerdict {
  /// Slow ranks, ascending: named as a row or a column of either op in at least need of the
  /// last `of` intervals (an interval counts a rank once, however many kinds name it).
  std::vector<int> ranks;
  /// Slow links, by src then dst: a pair of ranks {a, b} that BOTH ops named as a point (a, b)
  /// or (b, a) in at least need of the last `of` intervals — a slow link carries both ops'
  /// rows (and both directions' TCP acknowledgements), while one op's send order makes single
  /// points of its own (a source serves some destination last in every call). Listed as the
  /// latest counting interval's largest such point (its value and ratio).
  std::vector<AbnormalPoint> links;
  bool clean() const noexcept { return ranks.empty() && links.empty(); }
};

/// Local, pure: the per-rank rule (RankVerdict) over the intervals' verdicts (oldest first;
/// [WaitOp] per interval): of the last `rule.of` of them (all if fewer). Fewer than `need`
/// intervals name nothing. Throws kInvalidArgument unless 1 <= need <= of.
RankVerdict persistent_ranks(const std::vector<std::array<MatrixVerdict, kNumWaitOps>>& intervals, const DiagnosePersist& rule);

/// Where a rank runs: its process id and node (gethostname()).
struct RankInfo {
  int rank = 0;
  std::int64_t pid = 0;
  std::string node;
};

/// One op of one exchange.
struct DiagnoseOp {
  std::vector<double> matrix_us;     ///< [P * P], row-major [src][dst]: µs per call (0 where dst made no call)
  std::vector<std::uint64_t> calls;  ///< [P]: the calls of this op each rank made in the interval
  MatrixVerdict verdict;             ///< this interval's verdict: DeepEP's rule (diagnose_matrix)
  /// What `verdict` named in at least persist.need of the last persist.of intervals, this one
  /// included (persistent_verdict; DiagnoseReport::window of them so far).
  MatrixVerdict persistent;
};

/// The result of the latest exchange, the same on every rank.
struct DiagnoseReport {
  std::uint64_t exchanges = 0;   ///< exchanges so far (0: none yet; ops and seconds are then empty / 0)
  double seconds = 0;            ///< the interval covered: since the previous exchange (or the construction)
  std::array<DiagnoseOp, kNumWaitOps> ops;  ///< [WaitOp]: dispatch, combine
  std::vector<RankInfo> ranks;   ///< [P]
  DiagnoseThresholds thresholds;
  DiagnosePersist persist;       ///< the rule of ops[].persistent and of persistent
  std::uint64_t window = 0;      ///< the intervals ops[].persistent counted over: min(exchanges, persist.of)
  /// The persistent verdict per rank and link, both ops together (persistent_ranks): the slow
  /// ranks and links to act on. ops[].persistent counts each op and kind apart.
  RankVerdict persistent;
  std::string error;             ///< why the background exchange ended early ("" = it did not)
};

/// The report as text: per op the interval's verdict (naming the nodes of each rank and
/// point), the persistent verdict and the matrix; what the log and `epx bench --diagnose` print.
std::string format_report(const DiagnoseReport& report);

struct DiagnoseOptions {
  /// Between two background exchanges (start()); > 0. DeepEP's default: 10 s.
  std::chrono::milliseconds interval{10000};
  DiagnoseThresholds thresholds{};
  /// The persistent verdict's rule (DiagnoseOp::persistent): named in `need` of the last `of`
  /// exchanges (at DeepEP's 10 s: 30 s of the last 50).
  DiagnosePersist persist{};
  /// Non-empty: rank 0 appends each exchange's format_report() to `log_dir`/diagnose.log
  /// (the directory is created), rotated when it would pass log_max_bytes: .log -> .log.1
  /// -> ... -> .log.<log_backups> (the oldest dropped).
  std::string log_dir;
  std::uint64_t log_max_bytes = std::uint64_t{64} << 20;
  int log_backups = 2;
};

class Diagnose {
 public:
  /// Collective: watches `buffer` (built on `transport`). Throws kInvalidArgument on bad
  /// options (every rank), kUnsupported if `transport` has no endpoints (its one window is
  /// the Buffer's), kTimeout / kPeerFailed if a rank never arrives.
  Diagnose(Transport& transport, const Buffer& buffer, const DiagnoseOptions& options = {});
  /// Collective: watches nothing yet (watch() adds). A transport without endpoints is used
  /// itself: it must carry nothing else meanwhile.
  explicit Diagnose(Transport& transport, const DiagnoseOptions& options = {});
  /// Collective unless a rank failed: stop(), a barrier, the endpoint released; errors swallowed.
  ~Diagnose();
  Diagnose(const Diagnose&) = delete;
  Diagnose& operator=(const Diagnose&) = delete;

  /// Local: adds `waits` (e.g. Buffer::peer_waits(), of the same ranks) to the sums, from now
  /// on. Every rank should watch the same buffers. Thread-safe.
  void watch(std::shared_ptr<const PeerWaits> waits);
  void watch(const Buffer& buffer);

  /// Collective: the background exchange, every options.interval. Once per Diagnose.
  void start();
  /// Collective, idempotent: the background exchange's last round (the report then covers
  /// everything up to here) and its thread's end; returns when every rank has called it (or
  /// its thread already ended because a peer stopped or failed). Nothing if never started.
  void stop();
  /// Collective: one exchange now, on the calling thread (not while started).
  void exchange();

  /// Local: the latest exchange's result (any thread): its matrices and verdicts, and the
  /// persistent verdicts over the exchanges before it.
  DiagnoseReport report() const;
  int rank() const noexcept;
  int num_ranks() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epx
