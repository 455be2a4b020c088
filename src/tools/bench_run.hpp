// `epx bench` end to end: inputs -> P ranks -> aggregate -> report, --json, --trace.
#pragma once

#include <cstdio>
#include <vector>

#include "bench_mpi.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"
#include "bench_runner.hpp"

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

/// Runs the bench described by `o`: prints the report to `out` (rank 0's progress line goes
/// to stderr), writes --json / --trace, and stores the report in `*report` if given.
/// Returns the exit status: 0, or 3 when the MPI baseline produced different rows than epx.
/// Throws epx::Error on bad options or inputs and when a rank fails.
int run_bench(const BenchOptions& o, std::FILE* out = stdout, BenchReport* report = nullptr);

/// --transport shmem: this process is one rank of a job oshrun / mpirun started; rank 0
/// prints the report (and fills `report`), the others print nothing.
int run_bench_shmem(const BenchOptions& o, std::FILE* out, BenchReport* report);

}  // namespace epx::tools
