// The bench's child programs (the baselines: mpirun + a peer program, python3 + a script):
// locating them and running them with a deadline, their output to a log.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace epx::tools {

/// A regular file this process may execute.
bool is_executable(const std::filesystem::path& p);
/// `name` in a directory of PATH, or "".
std::string on_path(const std::string& name);
/// `name` in <build>/bench/ next to the running epx executable, else on PATH, else "";
/// `tried` gets the places looked in.
std::string find_next_to_epx(const std::string& name, std::string& tried);
/// `s` quoted for a POSIX shell (for printing the command that ran).
std::string shell_quote(const std::string& s);
/// The last `max_bytes` of the file at `p` (a log), trailing blank lines dropped.
std::string tail_of(const std::filesystem::path& p, std::size_t max_bytes);
/// Runs argv (argv[0] a path) with stdout + stderr to `log`, killed after `limit`. Returns ""
/// on exit status 0, else what happened ("exit status 2", "timed out after 600 s", ...).
std::string run_process(const std::vector<std::string>& argv, const std::filesystem::path& log,
                        std::chrono::seconds limit);

}  // namespace epx::tools
