// `epx bench --html` and `epx html`: the bench report as a page (html_page.hpp), drawn from
// the object `epx bench --json` writes (bench_json), so page and JSON carry the same numbers.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "epx/bench/report.hpp"

namespace epx::tools {

/// The page's title: "epx bench: P ranks, S tokens/rank, H, K, E" from a bench JSON object.
std::string bench_page_title(const nlohmann::ordered_json& bench);

/// Writes the page of `r` (its bench_json, with `text` = the text report under the charts).
void write_bench_html(const std::filesystem::path& path, const BenchReport& r, const std::string& text);

/// Writes the page of a saved `epx bench --json` object (a single run: not a --sweep's).
/// Throws epx::Error kInvalidArgument naming `source` when `bench` is not one.
void write_bench_html(const std::filesystem::path& path, const nlohmann::ordered_json& bench, const std::string& source);

}  // namespace epx::tools
