// `epx bench --sweep`: what the command prints and writes of a measured sweep.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epx/bench/sweep.hpp"

namespace epx::tools {

/// The comparison table as cells: row 0 the header, then one row per SweepRow (a skipped
/// row has "skipped" in the first number column and nothing after it).
std::vector<std::vector<std::string>> sweep_table_cells(const std::vector<SweepAxis>& axes, const std::vector<SweepRow>& rows);

/// The table, columns padded to their widest cell, then the reasons of skipped rows and
/// the warnings of measured ones, each under its row number.
void print_sweep_table(std::FILE* out, const std::vector<SweepAxis>& axes, const std::vector<SweepRow>& rows);

/// {"tool", the common config, "axes", "sweep": [per combination {"index", "values",
/// "config", "skipped", "dispatch", "combine", "verified", "warnings"}], "definitions"}.
nlohmann::ordered_json sweep_json(const std::vector<SweepAxis>& axes, const std::vector<SweepRow>& rows);

/// Runs the sweep of `o.sweep` (every value checked before anything runs): a progress line
/// per combination on stderr, the table on `out`, --json. Stores the rows in `*rows` if given.
/// Returns 0. Throws epx::Error on a bad --sweep and when a rank fails.
int run_bench_sweep(const BenchOptions& o, std::FILE* out = stdout, std::vector<SweepRow>* rows = nullptr);

}  // namespace epx::tools
