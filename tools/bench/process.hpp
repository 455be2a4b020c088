// epx_bench's private helpers for its baselines (epx_mpi_baseline, epx_mpi_collective, the
// gloo script): finding a program and running it with a deadline.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace epx::tools {

/// A regular file this process may execute.
bool executable(const std::filesystem::path& p);
/// `name` in a directory of $PATH, or "".
std::string on_path(const std::string& name);
/// The program `name` next to the epx executable (<build>/src/tools/epx -> <build>/baselines/),
/// then on PATH; `tried` gets the places looked at. "" if none.
std::string find_program_near_epx(const std::string& name, std::string& tried);
/// `s` quoted for a shell command line (for showing the command).
std::string shell_quote(const std::string& s);
/// The last `max_bytes` of a file, trailing blanks cut.
std::string tail_of(const std::filesystem::path& p, std::size_t max_bytes);
/// Runs argv (argv[0] a path) with stdout + stderr to `log`, killed after `limit`; returns
/// "" on exit status 0, else what happened ("exit status 2", "timed out after 600 s").
std::string run_process(const std::vector<std::string>& argv, const std::filesystem::path& log, std::chrono::seconds limit,
                        const std::vector<std::string>& env = {});

}  // namespace epx::tools
