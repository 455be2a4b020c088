// epx/diagnose.hpp — which rank or link is slow, in a running job (DeepEP's Diagnose).
//
//   epx::Buffer buffer(transport, config);
//   epx::Diagnose diag(transport, buffer, {.interval = std::chrono::seconds(10)});  // collective
//   diag.start();                          // an exchange of the waits every interval, in the background
//   ... dispatch / combine as usual ...
//   diag.stop();                           // collective: one last exchange, then the thread ends
//   epx::DiagnoseReport r = diag.report();  // on every rank: the last interval's matrices and verdicts
//
// The matrix, per op (dispatch, combine): M[src][dst] = the average time per call, in µs,
// that rank dst waited for rank src's header and rows during the interval — rank dst's
// PeerWaits (epx/stats.hpp: recorded by every Buffer call, always on). Rows are sources
// (the ranks waited for), columns destinations (the ranks that waited). Every rank holds the
// whole matrix after each exchange.
//
// The verdict is DeepEP's rule (deep_ep/diagnose.py, diagnose_matrix), by ratios to means:
//   * abnormal row s:    mean of row s    / mean of the row means    > thresholds.row   (3): a slow source —
//                        every rank waits for s (s is late: stopped, starved of CPU, ...);
//   * abnormal column d: mean of column d / mean of the column means > thresholds.col   (3): a slow
//                        destination — d waits for everyone (d itself is slow to take its rows in);
//   * abnormal point:    M[s][d]          / mean of M                > thresholds.point (5): a slow link
//                        s -> d; points in an abnormal row or column are not listed again —
//                        except (thresholds.links, the one refinement) a point that alone makes
//                        its row and its column abnormal: it is listed, they are not.
// The ratios need a few ranks to mean anything: with P ranks a row can be at most P times the
// mean, so rows and columns are never flagged at P <= 3, points never at P <= 2 (4 ranks: a
// row is flagged when its waits exceed the rest of the matrix's, a point at 5x the mean).
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

/// DeepEP's defaults: a row or column 3x the mean of the row / column means, a point 5x the matrix mean.
struct DiagnoseThresholds {
  double row = 3.0;
  double col = 3.0;
  double point = 5.0;
  /// A row and a column abnormal only through their crossing point are that point, a slow
  /// link (see diagnose_matrix); false: DeepEP's verdict exactly (the row and the column).
  bool links = true;
};

/// One slow link: M[src][dst] = value_us, ratio = value_us / mean(M).
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

/// Local, pure: DeepEP's rule (above) on the P x P matrix `m` (row-major, m[src * P + dst],
/// every value >= 0), then, with thresholds.links, one refinement: DeepEP's rule reports a
/// single dominant point (s, d) as abnormal row s and column d (a point's row and column
/// carry at least 1/P of the whole matrix each, so at small P they cross 3x first) and
/// suppresses the point. A point above the point threshold at the crossing of an abnormal
/// row s and column d, with which set to the mean of the other values neither row s nor
/// column d is abnormal, is reported as a point instead (largest first, repeatedly; the
/// rest is judged on the matrix with those points set aside). Throws kInvalidArgument
/// unless m.size() == P * P, P >= 1, every value finite and >= 0, and every threshold > 0.
/// An all-zero matrix flags nothing.
MatrixVerdict diagnose_matrix(const std::vector<double>& m, int num_ranks, const DiagnoseThresholds& thresholds = {});

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
  MatrixVerdict verdict;
};

/// The result of the latest exchange, the same on every rank.
struct DiagnoseReport {
  std::uint64_t exchanges = 0;   ///< exchanges so far (0: none yet; ops and seconds are then empty / 0)
  double seconds = 0;            ///< the interval covered: since the previous exchange (or the construction)
  std::array<DiagnoseOp, kNumWaitOps> ops;  ///< [WaitOp]: dispatch, combine
  std::vector<RankInfo> ranks;   ///< [P]
  DiagnoseThresholds thresholds;
  std::string error;             ///< why the background exchange ended early ("" = it did not)
};

/// The report as text: per op the verdict (naming the nodes of each rank and point) and the
/// matrix; what the log and `epx bench --diagnose` print.
std::string format_report(const DiagnoseReport& report);

struct DiagnoseOptions {
  /// Between two background exchanges (start()); > 0. DeepEP's default: 10 s.
  std::chrono::milliseconds interval{10000};
  DiagnoseThresholds thresholds{};
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

  /// Local: the latest exchange's result (any thread).
  DiagnoseReport report() const;
  int rank() const noexcept;
  int num_ranks() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace epx
