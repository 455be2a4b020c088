// `epx bench --op`: the one table of ops. A new op is a row in bench_ops() (bench_ops.cpp):
// its --op name, one line of --help, and the function that measures it, prints its report
// and writes --json / --trace; the function lives in a file of its own next to this one,
// over a measurement in the bench library (tools/bench). Options an op does not use are
// ignored by it (BenchOptions holds every op's options).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"

namespace epx::tools {

struct BenchOp {
  const char* name;  ///< the --op value, e.g. "dispatch", "all_reduce"
  const char* help;  ///< one line for --help: what is timed
  /// Runs the bench of `o` and prints its report to `out`; returns the exit status (0, or 3
  /// when a baseline's results differ from epx's). Throws epx::Error on bad options.
  int (*run)(const BenchOptions& o, std::FILE* out);
};

/// Every op, in --help order; the first is the default (--op dispatch).
const std::vector<BenchOp>& bench_ops();

/// The op named `name`; throws kInvalidArgument listing the ops otherwise.
const BenchOp& find_bench_op(const std::string& name);

/// "dispatch | all_gather | ...": the ops for --help.
std::string bench_op_names();

}  // namespace epx::tools
