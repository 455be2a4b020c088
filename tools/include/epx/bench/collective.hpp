// `epx bench --op all_gather | reduce_scatter | all_reduce`: a BucketBuffer collective timed
// over P ranks with the measurement plane of dispatch (per-rank latency, phases, the copy
// limit measured by the same processes in the same run, max-rank percentiles), against
// Open MPI (epx_mpi_collective) or torch.distributed gloo in the same run.
//
// A call moves --bytes N in --tensors T tensors of N / T bytes each (rounded down to a
// multiple of P x 64 bytes: whole float32 shards of whole cache lines): N is the whole
// tensor (all_gather's result, reduce_scatter's input, all_reduce's tensor). Inputs are the
// same numbers on every side (baselines/collective_data.hpp), restored before every iteration
// (untimed); scale 1, comm precision fp32.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"
#include "epx/bench/stats.hpp"
#include "epx/transport.hpp"

namespace epx::tools {

/// --op is one of the bucket collectives.
bool is_collective_op(const std::string& op) noexcept;

/// nccl-tests' bus bandwidth: algbw x 2(P-1)/P for all_reduce, x (P-1)/P for all_gather
/// and reduce_scatter.
double busbw_factor(const std::string& op, int ranks) noexcept;

/// What one rank measured.
struct CollectiveRankRecord {
  int rank = 0;
  std::string algorithm;                   ///< BucketBuffer::last_algorithm() of the timed calls
  std::vector<double> start_us, lat_us;    ///< [iters] CLOCK_MONOTONIC start, wall time of the call
  std::vector<double> exchange_us, data_us, done_us;  ///< [iters] BucketStats
  std::vector<double> memcpy_us, stream_us;  ///< [iters] this rank copying N bytes (memcpy; streaming stores)
  std::uint64_t window_bytes = 0, peak_rss_bytes = 0;
  std::string hash;             ///< FNV-1a 64 of the rank's outputs of the last iteration, "0x%016x"
  std::vector<float> samples;   ///< the outputs at collective_data.hpp's sample indices
  /// "" when the samples equal docs/spec.md §8's result bit for bit, else the first difference
  std::string check;
};

struct CollectiveBaseline {
  bool requested = false, ran = false;
  std::string name;     ///< "mpi" | "gloo"
  std::string why_not;  ///< when !ran
  std::string command;
  std::string note;     ///< what the baseline calls, when it is not the op itself
  Summary max_rank;     ///< max-rank latency of a call (all T tensors), us
  std::vector<double> rank_avg_us;
  std::vector<std::string> hashes;
  std::vector<std::vector<float>> samples;
  bool bitwise = false;   ///< compared bit for bit (all_gather), else within float32 tolerance
  bool verified = false;
  std::string verify_detail;
  double speedup = 0;     ///< baseline avg max-rank / epx's (> 1: epx faster)
};

struct CollectiveReport {
  BenchOptions options;
  std::string op, transport, algorithm;
  int ranks = 0, tensors = 0, iters = 0;
  std::uint64_t tensor_bytes = 0, call_bytes = 0;  ///< each tensor; all of a call (N)
  std::vector<double> max_rank_series;
  Summary max_rank, span;
  std::vector<Summary> rank;
  int slowest_rank = 0;
  double algbw_gbps = 0, busbw_gbps = 0;  ///< N / avg max-rank latency; x busbw_factor
  Summary memcpy_max_rank, stream_max_rank;
  double memcpy_gbps = 0, stream_gbps = 0;  ///< per rank: N / avg max-rank copy time
  double limit_gbps = 0, busbw_vs_limit = 0;
  std::string limit_name;
  std::vector<double> exchange_rank_us, data_rank_us, done_rank_us;  ///< [P] avg
  double exchange_us = 0, data_us = 0, done_us = 0;                  ///< avg over ranks
  std::uint64_t window_bytes = 0;
  std::vector<std::uint64_t> peak_rss_bytes;
  std::vector<std::string> check_failures;  ///< ranks whose results were not docs/spec.md §8's
  CollectiveBaseline baseline;
  int num_nodes = 1;
  std::string node_layout;
  double wall_s = 0;
};

struct CollectiveMeasurement {
  bool root = true;  ///< --transport shmem: only rank 0 holds the report
  CollectiveReport report;
  std::vector<CollectiveRankRecord> records;
};

/// Checks the collective options (--bytes, --tensors, --dtype, --baseline) for `o.op`.
void validate_collective_options(const BenchOptions& o);

/// One rank's part: the timed loop on `t`; returns its record. Collective over t's ranks.
CollectiveRankRecord run_collective_rank(Transport& t, const BenchOptions& o);

/// The records of every rank aggregated (without the baseline).
CollectiveReport aggregate_collective(const BenchOptions& o, const std::vector<CollectiveRankRecord>& records);

/// Runs the bench: forks P ranks (or, --transport shmem, runs this process's rank of the
/// launcher's job), aggregates, and runs --baseline mpi | gloo. Prints progress only.
CollectiveMeasurement measure_collective(const BenchOptions& o);

/// 0, or 3 when a rank's result was not docs/spec.md §8's or the baseline's differs from epx's.
int collective_status(const CollectiveReport& rep);

/// Record <-> JSON (the ranks' files, --json's per-rank part).
std::string collective_record_json(const CollectiveRankRecord& r);
CollectiveRankRecord collective_record_from_json(const std::string& text);

/// --baseline mpi: epx_mpi_collective via mpirun (or, in a shmem job, in the same
/// processes); --baseline gloo: python/epx/bench_collective.py. Fills rep.baseline and
/// compares it with the records. Does not throw when the baseline is missing or fails.
void run_collective_baseline(const BenchOptions& o, CollectiveReport& rep, const std::vector<CollectiveRankRecord>& records,
                             const std::filesystem::path& work_dir);

}  // namespace epx::tools
