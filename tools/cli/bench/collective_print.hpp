// `epx bench --op all_gather | reduce_scatter | all_reduce` printed (a row of bench_ops.hpp).
#pragma once

#include <cstdio>

#include "epx/bench/collective.hpp"

namespace epx::tools {

/// Measures the collective of `o` (measure_collective), prints the report to `out`, writes
/// --json (the op's section holds max_rank_us {avg, p50, p95, max} as dispatch's does) and
/// --trace. Returns collective_status().
int run_collective_bench(const BenchOptions& o, std::FILE* out);

}  // namespace epx::tools
