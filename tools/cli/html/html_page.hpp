// One self-contained HTML page of a report (`epx bench --html`, `epx sim --html`, `epx html`):
// the report's data as JSON in the page, drawn as inline SVG by our own script (report.js in
// this folder) — no network, no third-party code; a Content-Security-Policy forbids any load.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace epx::tools {

/// What the page draws: "bench" (the object of `epx bench --json`, bench_json) or "sim"
/// (sim_page_json: {"tool": "epx sim", "options", "profiles": [...]}).
enum class PageKind { kBench, kSim };

/// The page: `title`, `data` embedded as JSON (every '<' escaped, so no text of it can end
/// the script element), and `text` (the text report as printed; may be empty) under the charts.
std::string html_page(PageKind kind, const std::string& title, const nlohmann::ordered_json& data, const std::string& text);

/// Writes html_page(...) to `path` (epx::Error kIo on failure).
void write_html_page(const std::filesystem::path& path, PageKind kind, const std::string& title, const nlohmann::ordered_json& data,
                     const std::string& text);

}  // namespace epx::tools
