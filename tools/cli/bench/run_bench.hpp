// `epx bench`: a measurement of the bench library (epx/bench/run.hpp) printed as the
// command prints it.
#pragma once

#include <cstdio>

#include "epx/bench/run.hpp"

namespace epx::tools {

/// Runs the bench described by `o`: prints the report to `out` (rank 0's progress line goes
/// to stderr), writes --json / --trace, and stores the report in `*report` if given.
/// Returns the exit status: 0, or 3 when the MPI baseline produced different rows than epx.
/// Throws epx::Error on bad options or inputs and when a rank fails.
int run_bench(const BenchOptions& o, std::FILE* out = stdout, BenchReport* report = nullptr);

/// --transport shmem: this process is one rank of a job oshrun / mpirun started; rank 0
/// prints the report (and fills `report`), the others print nothing.
int run_bench_shmem(const BenchOptions& o, std::FILE* out, BenchReport* report);

}  // namespace epx::tools
