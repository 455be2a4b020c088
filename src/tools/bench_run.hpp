// `epx bench` end to end: inputs -> P ranks -> aggregate -> report, --json, --trace.
#pragma once

#include <cstdio>

#include "bench_options.hpp"
#include "bench_report.hpp"

namespace epx::tools {

/// Runs the bench described by `o`: prints the report to `out` (rank 0's progress line goes
/// to stderr), writes --json / --trace, and stores the report in `*report` if given.
/// Returns the exit status: 0, or 3 when the MPI baseline produced different rows than epx.
/// Throws epx::Error on bad options or inputs and when a rank fails.
int run_bench(const BenchOptions& o, std::FILE* out = stdout, BenchReport* report = nullptr);

}  // namespace epx::tools
