// The subcommands of the `epx` tool; each folder registers one on the CLI11 app (docs/tools.md).
#pragma once

#include <CLI/CLI.hpp>

namespace epx::tools {

void add_replay_command(CLI::App& app);  // replay/replay_command.cpp
void add_eplb_command(CLI::App& app);    // eplb/eplb_command.cpp
void add_bench_command(CLI::App& app);   // bench/bench_command.cpp
void add_sim_command(CLI::App& app);     // sim/sim_command.cpp
void add_html_command(CLI::App& app);    // html/html_command.cpp

}  // namespace epx::tools
