// The simulator guard: the ascend950 predictions at EP8..128 of
//   epx sim --hardware ascend950-supernode --ep 8,16,32,64,128 --tokens 16384 --hidden 7168
//           --topk 6 --experts 256 --fp8 --alignment 128
// pinned to tests/tools/data/sim_guard_ascend950.json within ±3 % (dispatch and combine,
// GB/s per rank, README definition). The engine's data plane changes (send policy, FP8
// scale rows, one-copy layouts, hierarchical combine) move what the model predicts for the
// 128-rank supernode; this test is what notices. A change that moves them on purpose
// replaces the file with the one this test prints on failure and says why in its commit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epx/sim/hardware.hpp"
#include "epx/sim/runner/run.hpp"

#ifndef EPX_TESTS_DIR
#error "EPX_TESTS_DIR must name tests/ (tests/CMakeLists.txt sets it)"
#endif

namespace epx::tools {
namespace {

constexpr double kTolerancePct = 3.0;
constexpr const char* kFile = EPX_TESTS_DIR "/tools/data/sim_guard_ascend950.json";
constexpr const char* kCommand =
    "epx sim --hardware ascend950-supernode --ep 8,16,32,64,128 --tokens 16384 --hidden 7168 --topk 6 --experts 256 "
    "--fp8 --alignment 128";

SimOptions guard_options() {
  SimOptions o;  // the defaults are the calibration shape; spelled out so a new default cannot move the guard
  o.hardware = "ascend950-supernode";
  o.ep = {8, 16, 32, 64, 128};
  o.tokens = 16384, o.hidden = 7168, o.topk = 6, o.experts = 256, o.fp8 = true, o.alignment = 128;
  o.layout = "expanded", o.schedule = "rotated", o.queues = 1, o.aggregate = 1 << 20, o.protocol = "explicit";
  o.send_policy = "auto";
  o.progress = false;
  return o;
}

std::string file_for(const std::vector<SimPoint>& points) {
  nlohmann::ordered_json j;
  j["command"] = kCommand;
  j["metric"] = "GB/s per rank, average over ranks (README definition)";
  j["tolerance_pct"] = kTolerancePct;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const SimPoint& p : points) {
    const auto r1 = [](double v) { return std::round(v * 10) / 10; };
    list.push_back({{"ep", p.ep}, {"dispatch_gbps", r1(p.dispatch_gbps)}, {"combine_gbps", r1(p.combine_gbps)}});
  }
  j["points"] = list;
  return j.dump(2) + "\n";
}

TEST(SimGuard, Ascend950PredictionsStayWithin3PercentOfTheCheckedInFile) {
  std::ifstream in(kFile);
  ASSERT_TRUE(in) << "cannot read " << kFile;
  const nlohmann::json pinned = nlohmann::json::parse(in);
  const sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  const std::vector<SimPoint> points = simulate(guard_options(), hw);
  ASSERT_EQ(points.size(), pinned["points"].size());
  std::ostringstream moved;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const nlohmann::json& want = pinned["points"][i];
    ASSERT_EQ(points[i].ep, want["ep"].get<int>());
    for (const auto& [name, got] : {std::pair{"dispatch", points[i].dispatch_gbps}, std::pair{"combine", points[i].combine_gbps}}) {
      const double was = want[std::string(name) + "_gbps"].get<double>();
      const double pct = 100 * (got / was - 1);
      std::printf("EP%d %s: %.1f GB/s (pinned %.1f, %+.2f %%)\n", points[i].ep, name, got, was, pct);
      if (std::fabs(pct) > kTolerancePct) {
        char line[200];
        std::snprintf(line, sizeof line, "  EP%d %s moved %.1f -> %.1f GB/s (%+.1f %%, beyond +-%.0f %%)\n", points[i].ep, name, was,
                      got, pct, kTolerancePct);
        moved << line;
      }
    }
  }
  EXPECT_TRUE(moved.str().empty())
      << "the ascend950 supernode predictions moved (" << kCommand << "):\n"
      << moved.str() << "If the change means to move them, replace " << kFile
      << " with the following and say why in the commit:\n"
      << file_for(points);
}

}  // namespace
}  // namespace epx::tools
