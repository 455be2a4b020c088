// `epx bench` results: the ranks' records aggregated into the numbers of the report (one
// definition for each, see bench_definitions() in tools/cli/bench/bench_cli.hpp). The text
// report and the JSON are the tool's (tools/cli/bench/).
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "epx/bench/eplb.hpp"
#include "epx/bench/mpi.hpp"
#include "epx/bench/options.hpp"
#include "epx/bench/routing.hpp"
#include "epx/bench/runner.hpp"
#include "epx/bench/stats.hpp"
#include "epx/diagnose.hpp"
#include "epx/stats.hpp"

namespace epx::tools {

/// printf into a std::string (one report line; truncated at 511 characters).
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

/// The engine's phases plus "other" (latency not covered by any phase).
inline constexpr int kBenchPhases = kNumPhases + 1;
const char* bench_phase_name(int i) noexcept;

/// Names of the metrics of the [rank, worker, metric] counter array (per call averages).
const std::vector<std::string>& worker_metric_names();

struct OpReport {
  std::string name;  ///< "dispatch" | "combine"
  std::vector<double> max_rank_series;  ///< [iters] max over ranks of the latency
  Summary max_rank;                     ///< of max_rank_series (us)
  Summary span;                         ///< per iteration, first rank's start to last rank's end
  double start_skew_us = 0;             ///< avg over iterations of (last start - first start)
  std::vector<std::vector<double>> rank_series;  ///< [P][iters] latency (us)
  std::vector<Summary> rank;                     ///< [P]
  int slowest_rank = 0;                          ///< highest avg latency
  std::vector<std::int64_t> payload_bytes, local_bytes;  ///< [P] from the routing
  std::int64_t total_payload = 0;
  /// Bytes the op moves: the payload plus, for an expanded dispatch, the receivers' local
  /// expansion copies. algbw and the memcpy reference (which copies the same) use these.
  std::vector<std::int64_t> moved_bytes;  ///< [P]
  std::int64_t total_moved = 0;
  std::vector<double> algbw_rank_gbps;  ///< payload / avg latency
  double algbw_gbps = 0;                ///< total payload / avg max-rank latency
  std::vector<double> memcpy_rank_us;   ///< [P] avg
  Summary memcpy_max_rank;
  double memcpy_gbps = 0, ratio_vs_memcpy = 0;
  Summary stream_max_rank;  ///< the streaming-store copy of the same bytes
  double stream_gbps = 0;
  double limit_gbps = 0, ratio_vs_limit = 0;  ///< the faster of memcpy and the streaming copy
  std::string limit_name;                     ///< "memcpy" | "streaming copy"
  // Engine counters (counters == false: none of these).
  bool counters = false;
  bool pulled = false;    ///< combine read the expert ranks' rows in place (pull mode: no puts)
  bool data_first = false;  ///< every timed call on every rank put its rows before the header exchange
  std::vector<double> puts_rank, remote_puts_rank, bytes_rank, remote_bytes_rank;  ///< [P] per call
  double puts = 0, remote_puts = 0, bytes_per_put = 0;                             ///< all ranks, per call
  std::vector<double> metadata_bytes_per_row;  ///< [P] (engine bytes - payload) / sent rows
  std::vector<std::array<double, kBenchPhases>> phases_rank;  ///< [P] avg of max over workers (us)
  std::array<double, kBenchPhases> phases_avg{};              ///< avg over ranks
  std::vector<int> dominant_rank;                            ///< [P]
  int dominant = 0;
  std::vector<std::vector<std::vector<double>>> worker_metrics;  ///< [P][W][metric]
  /// Per queue q < --queues, per call (avg over the timed iterations): puts and bytes summed
  /// over the ranks and their workers; wait = the senders' quiet() wait for the queue's
  /// puts to complete (summed over a rank's workers), avg over the ranks.
  std::vector<double> queue_puts, queue_bytes, queue_wait_us;                        ///< [Q]
  std::vector<std::vector<double>> queue_puts_rank, queue_bytes_rank, queue_wait_us_rank;  ///< [P][Q]
  // Counters off vs on.
  bool overhead = false;
  Summary off, on;  ///< max-rank latency per iteration, blocks off / on
  double counters_ratio = 0;  ///< median on / median off
  /// The comparison blocks (the setting the timed loop did not use) before and after the
  /// timed loop, separately: how much the machine drifted during the run.
  Summary compare_before, compare_after;
  double drift = 0;  ///< |median before / median after - 1|
};

struct RouteReport {
  std::vector<std::int64_t> unique_dest_hist;  ///< [min(K,P)+1], all ranks' tokens
  double avg_unique_dest = 0;
  std::int64_t recv_min = 0, recv_max = 0;
  double recv_avg = 0, recv_imbalance = 0;
  int recv_max_rank = 0;
  std::int64_t expert_min = 0, expert_max = 0;
  double expert_avg = 0, expert_imbalance = 0;
  int expert_max_id = 0;
  int slowest_rank = 0;            ///< highest avg dispatch + combine latency
  double slowest_round_trip_us = 0;
  double round_trip_avg_us = 0;    ///< avg over ranks
};

struct BenchReport {
  BenchOptions options;
  int ranks = 0, experts = 0, hidden = 0, topk = 0;
  std::int64_t max_tokens = 0;
  bool fp8 = false;
  std::string source;
  int workers = 0;  ///< per rank (0: unknown)
  unsigned cores = 0;
  RouteCount count;
  OpReport dispatch, combine;
  double memcpy_gbps = 0;  ///< (dispatch + combine payload) / (their max-rank memcpy times)
  RouteReport route;
  std::vector<std::string> warnings;
  bool baseline_requested = false;
  BaselineResult baseline;
  EplbReport eplb;  ///< --eplb (enabled == false otherwise); experts, count, route are then the physical routing's
  double wall_s = 0;
  std::uint64_t window_bytes = 0;  ///< largest window of a rank
  std::vector<std::uint64_t> peak_rss_bytes;  ///< [P] the rank's process (shared window pages it touched count)
  std::vector<std::uint64_t> anon_rss_bytes;  ///< [P] its private memory at the end
  std::uint64_t one_copy_calls = 0, copy_calls = 0, view_calls = 0;  ///< timed dispatches, all ranks
  std::string copy_why;  ///< why the last copy was one (a rank's CallStats::output_why)
  std::vector<RankInfo> rank_info;  ///< [P] each rank's pid and node
  /// --diagnose: the timed loop's wait matrices and verdicts (rank 0's Diagnose exchanges,
  /// summed over the intervals; exchanges == 0 without --diagnose); ops[].persistent: what
  /// persist.need of the persist.of = --diagnose-intervals intervals named.
  DiagnoseReport diagnose;
  std::vector<DiagnoseReport> diagnose_intervals;  ///< each interval's matrices and verdict
};

/// Whether every row travels exactly once with its metadata, so epx's byte counters must
/// equal the payload plus one metadata size per row (else they can only be larger).
bool moves_rows_once(const BenchOptions& o);

/// Aggregates the ranks' records; cross-checks the engine's byte counters and output rows
/// against the independent count (differences become warnings).
BenchReport aggregate_bench(const BenchOptions& o, const BenchProblem& p, const RouteCount& rc,
                            const std::vector<BenchRankRecord>& records);

}  // namespace epx::tools
