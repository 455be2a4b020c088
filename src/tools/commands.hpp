// The subcommands of the `epx` tool; each file registers one on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace epx::tools {

void add_replay_command(CLI::App& app);  // replay_command.cpp
void add_eplb_command(CLI::App& app);    // eplb_command.cpp
void add_bench_command(CLI::App& app);   // bench_command.cpp
void add_sim_command(CLI::App& app);     // sim_command.cpp

}  // namespace epx::tools
