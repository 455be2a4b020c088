// `epx bench` — being written (issue 3).
#include "commands.hpp"

namespace epx::tools {
void add_bench_command(CLI::App& app) { app.add_subcommand("bench", "Measure dispatch and combine (being written)"); }
}  // namespace epx::tools
