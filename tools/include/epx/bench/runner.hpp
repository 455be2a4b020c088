// `epx bench` on one rank: the timed dispatch/combine loop, the interleaved memcpy
// reference, the counters-off-vs-on blocks; the record each rank leaves in a file for the
// launching process to aggregate (ranks may be forked processes).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"
#include "epx/bench/routing.hpp"
#include "epx/config.hpp"
#include "epx/stats.hpp"
#include "epx/transport.hpp"

namespace epx::tools {

/// One dispatch or combine call on one rank.
struct BenchCall {
  double start_us = 0;  ///< CLOCK_MONOTONIC (system-wide, comparable across ranks)
  double lat_us = 0;    ///< wall time of the call
  std::vector<WorkerStats> workers;  ///< Buffer::last_stats() (empty with counters off)
  bool data_first = false;           ///< CallStats::data_first (rows before the header exchange)
};

/// Everything one rank measured.
struct BenchRankRecord {
  int rank = 0;
  int workers = 0;  ///< worker threads of the rank's Buffer (0: unknown, counters never on)
  std::uint64_t window_bytes = 0;  ///< the rank's transport window (receive area, replies, ...)
  std::vector<BenchCall> dispatch, combine;  ///< [iters]
  std::vector<double> memcpy_dispatch_start_us, memcpy_dispatch_us;  ///< [iters]
  std::vector<double> memcpy_combine_start_us, memcpy_combine_us;    ///< [iters]
  /// The same bytes copied with streaming stores (epx::stream_copy), right after the memcpy.
  std::vector<double> stream_dispatch_us, stream_combine_us;  ///< [iters]
  /// Timed dispatches by where recv_x came from (CallStats::output), and why the last copy was one.
  std::uint64_t one_copy_calls = 0, copy_calls = 0, view_calls = 0;
  std::string copy_why;
  std::uint64_t peak_rss_bytes = 0;  ///< getrusage(RUSAGE_SELF) ru_maxrss at the end (the rank's process; threads share one)
  std::uint64_t anon_rss_bytes = 0;  ///< /proc/self/status RssAnon at the end: private memory (heap), no shared window pages
  /// Counters off / on latencies: the timed loop's, and those of the comparison blocks with
  /// the other setting (before and after the timed loop).
  std::vector<double> off_dispatch_us, off_combine_us, on_dispatch_us, on_combine_us;
  std::int64_t out_rows = 0;  ///< rows of the dispatch output
  std::int64_t pid = 0;       ///< the rank's process
  std::string node;           ///< gethostname()
  /// --diagnose: the timed loop's wait matrices as every rank's Diagnose exchanges gave them,
  /// one per interval (--diagnose-intervals: [interval][WaitOp][src * P + dst] µs per call;
  /// [interval][WaitOp][dst] calls), and the seconds each covered.
  bool diagnosed = false;
  std::vector<std::array<std::vector<double>, kNumWaitOps>> diagnose_us;
  std::vector<std::array<std::vector<std::uint64_t>, kNumWaitOps>> diagnose_calls;
  std::vector<double> diagnose_seconds;
  bool hashed = false;        ///< hashes computed (--baseline mpi, bf16)
  std::uint64_t dispatch_hash = 0, combine_hash = 0;
};

/// Microseconds of CLOCK_MONOTONIC.
double bench_now_us() noexcept;

/// The Buffer of a bench run: the problem's shape with the options' data plane, workers and ring.
BufferConfig bench_buffer_config(const BenchOptions& o, const BenchProblem& p);

/// FNV-1a 64 of `n` bytes (what epx_mpi_baseline hashes its outputs with).
std::uint64_t fnv1a64(const void* data, std::size_t n) noexcept;

/// The rank's part of a bench run; writes its record to `record_dir`/rank<r>.bin.
void run_bench_rank(Transport& t, const BenchProblem& p, const RouteCount& rc, const BenchOptions& o,
                    const std::filesystem::path& record_dir);

std::filesystem::path bench_record_path(const std::filesystem::path& record_dir, int rank);
void write_bench_record(const std::filesystem::path& path, const BenchRankRecord& r);
/// Throws epx::Error(kIo) if the file is missing or truncated.
BenchRankRecord read_bench_record(const std::filesystem::path& path);

}  // namespace epx::tools
