// The bench engine end to end: options -> routing -> P ranks -> records -> aggregated report
// (the `epx bench` command prints it, tools/cli/bench/).
#pragma once

#include <string>
#include <vector>

#include "epx/bench/mpi.hpp"
#include "epx/bench/options.hpp"
#include "epx/bench/report.hpp"
#include "epx/bench/runner.hpp"

namespace epx::tools {

/// One measured bench: the report and the ranks' raw records (for --trace).
struct BenchMeasurement {
  BenchReport report;
  std::vector<BenchRankRecord> records;
};

/// The MPI baseline's result into the report: checked against the ranks' records (same
/// rows and combine output) and its payload bytes against `count`'s.
void attach_baseline(BenchReport& rep, BaselineResult baseline, const std::vector<BenchRankRecord>& records,
                     const RouteCount& count);

/// The bench's exit status: 0, or 3 when the MPI baseline produced different rows than epx.
int bench_status(const BenchReport& rep);

/// Validates `o`, builds the routing, runs the P ranks once, aggregates their records and
/// runs the MPI baseline if asked. Prints nothing but the progress lines on stderr.
/// Throws epx::Error on bad options or inputs and when a rank fails.
BenchMeasurement measure_bench(const BenchOptions& o);

/// What measure_bench_shmem leaves on each rank of the job.
struct ShmemBenchMeasurement {
  bool root = false;        ///< rank 0: `report` holds the job's report; other ranks get none
  int num_nodes = 0;        ///< nodes of the job (discover_nodes)
  std::string node_layout;  ///< describe_nodes: "node 0 (host): ranks 0 1; ..."
  std::string runtime;      ///< the OpenSHMEM runtime's heap and what epx set (epx::shmem_runtime_info), rank 0's
  BenchReport report;
};

/// --transport shmem: this process is one rank of a job oshrun / mpirun started (P from the
/// launcher); every rank runs its part, rank 0 gathers the records and aggregates them (and
/// the in-job MPI baseline with --baseline mpi). Collective; prints only progress on stderr.
/// Throws kUnsupported for --sweep, --eplb, --trace (they need the fork launcher).
ShmemBenchMeasurement measure_bench_shmem(const BenchOptions& o);

}  // namespace epx::tools
