// `epx bench` on the command line: the options (CLI11) over epx::tools::BenchOptions
// (epx/bench/options.hpp) and the --help footer.
#pragma once

#include <CLI/CLI.hpp>

#include "epx/bench/options.hpp"

namespace epx::tools {

/// Registers every option of `epx bench` on `sub` (bound to `o`) and its --help footer,
/// which says what each reported number counts.
void add_bench_options(CLI::App* sub, BenchOptions& o);

/// The text of --help's footer (also the definitions printed in the JSON).
const char* bench_definitions();

}  // namespace epx::tools
