// `epx bench --baseline mpi`: the same routing through epx_mpi_baseline (the Megatron-style
// MPI all-to-all dispatcher a user writes without epx), run via mpirun after the epx run,
// checked to produce the same rows (FNV-1a 64 of each rank's outputs).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "bench_routing.hpp"
#include "bench_runner.hpp"
#include "bench_stats.hpp"

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

/// Writes `p` as a SPEC 7 input directory (meta.json, rank<r>/{topk_idx,topk_weights,x}.npy).
void write_routing_dir(const BenchProblem& p, const std::filesystem::path& dir);

/// Locates mpirun and epx_mpi_baseline and runs the baseline with the options' iterations
/// and layout on `p` (written under `work_dir`). Does not throw when MPI is missing or the
/// baseline fails: the result says why (ran == false).
BaselineResult run_mpi_baseline(const BenchOptions& o, const BenchProblem& p, const std::filesystem::path& work_dir);

/// Compares the baseline's per-rank rows and hashes with epx's records; sets verified.
void verify_baseline(BaselineResult& b, const std::vector<BenchRankRecord>& records);

}  // namespace epx::tools
