// `epx bench --baseline mpi`: the same routing through epx_mpi_baseline (the Megatron-style
// MPI all-to-all dispatcher a user writes without epx), run via mpirun after the epx run,
// checked to produce the same rows (FNV-1a 64 of each rank's outputs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"
#include "epx/bench/routing.hpp"
#include "epx/bench/runner.hpp"
#include "epx/bench/stats.hpp"

namespace epx::tools {

struct BaselineResult {
  bool ran = false;
  std::string why_not;  ///< when !ran: what is missing or what failed
  std::string command;  ///< the mpirun command line
  Summary dispatch, combine;  ///< max-rank latency (us), the same definitions as epx's
  std::vector<double> dispatch_rank_us, combine_rank_us;  ///< per-rank averages
  std::vector<std::int64_t> recv_rows, payload_bytes;     ///< per rank, as the baseline counted them
  std::vector<std::string> dispatch_hash, combine_hash;   ///< per rank, "0x%016x"
  bool verified = false;     ///< same rows and same combine output as epx on every rank
  std::string verify_detail;  ///< what matched or the first differences
};

/// Writes `p` as a docs/spec.md §7 input directory (meta.json, rank<r>/{topk_idx,topk_weights,x}.npy);
/// with `only_rank` >= 0 meta.json and that rank's directory only.
void write_routing_dir(const BenchProblem& p, const std::filesystem::path& dir, int only_rank = -1);

/// epx_mpi_baseline's arguments for the options' iterations and layout on `routing`, JSON to `json`;
/// with the node-first combine order, the topology's servers as --node-of-rank (the same additions).
std::vector<std::string> baseline_args(const BenchOptions& o, const std::filesystem::path& routing,
                                       const std::filesystem::path& json);

/// Fills `b`'s timings and per-rank facts from the baseline's JSON (`iters` timed
/// iterations); on a missing or malformed file sets b.why_not instead.
void read_baseline_json(const std::filesystem::path& json, int iters, BaselineResult& b);

/// Locates mpirun and epx_mpi_baseline and runs the baseline with the options' iterations
/// and layout on `p` (written under `work_dir`). Does not throw when MPI is missing or the
/// baseline fails: the result says why (ran == false).
BaselineResult run_mpi_baseline(const BenchOptions& o, const BenchProblem& p, const std::filesystem::path& work_dir);

/// --transport shmem --baseline mpi: the baseline inside the launcher's job, on the same
/// ranks (epx_mpi_baseline::run over MPI_COMM_WORLD, which Open MPI's shmem_init started):
/// every rank writes its part of `p` under `work_dir` (its own directory: machines need not
/// share a file system) and calls it; collective. Rank 0's result has the timings and the
/// per-rank facts; the others' only `ran`. Without the baseline library in this build, or
/// without MPI initialised, ran == false and why_not says why, on every rank, collectively
/// consistent (nothing is called).
BaselineResult run_mpi_baseline_in_job(const BenchOptions& o, const BenchProblem& p, int rank,
                                       const std::filesystem::path& work_dir);

/// Compares the baseline's per-rank rows and hashes with epx's records; sets verified.
void verify_baseline(BaselineResult& b, const std::vector<BenchRankRecord>& records);

}  // namespace epx::tools
