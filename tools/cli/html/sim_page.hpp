// `epx sim --html`: the simulator's predictions per hardware profile as a page (html_page.hpp),
// drawn from the points `epx sim --json` writes (sim_json) and the profile's published points.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epx/sim/hardware.hpp"
#include "epx/sim/runner/calibrate.hpp"
#include "epx/sim/runner/run.hpp"

namespace epx::tools {

/// One hardware profile's predictions and the measurements published for it (GB/s ranges
/// per EP size; empty when none are known).
struct SimPageProfile {
  const sim::HardwareModel* hardware = nullptr;
  std::vector<SimPoint> points;
  std::vector<sim::PublishedPoint> published;
};

/// The published points of a profile that are in the page's metric (GB/s per rank as the
/// README defines it: series with metric "epx", e.g. the Ascend 950 supernode's); series in
/// DeepEP's bottleneck bandwidth (h800-deepep) are drawn by `epx sim published --svg`.
std::vector<sim::PublishedPoint> published_points(const sim::HardwareModel& hw);

/// {"tool": "epx sim", "options": {shape, data plane}, "profiles": [{"hardware",
/// "payload_limit_gbps": {"low", "high"}, "published": [{"ep", "dispatch_gbps": {"low",
/// "high"}, "combine_gbps": {...}}], "points": [the objects of sim_json]}]}.
nlohmann::ordered_json sim_page_json(const SimOptions& o, const std::vector<SimPageProfile>& profiles);

/// Writes the page (`text` = the table as printed, under the charts).
void write_sim_html(const std::filesystem::path& path, const SimOptions& o, const std::vector<SimPageProfile>& profiles,
                    const std::string& text);

}  // namespace epx::tools
