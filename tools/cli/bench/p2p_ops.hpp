// `epx bench --op pp` and `--op engram` (rows of bench_ops.cpp): their options, the run over
// epx/bench/p2p.hpp's measurements, the text report and --json.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>

#include "epx/bench/options.hpp"

namespace epx::tools {

/// Adds --pp-* / --engram-* / --peers / --peer-python to `sub`.
void add_p2p_options(CLI::App* sub, BenchOptions& o);

int run_pp_op(const BenchOptions& o, std::FILE* out);
int run_engram_op(const BenchOptions& o, std::FILE* out);

}  // namespace epx::tools
