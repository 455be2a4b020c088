// `epx sim`'s figures as text: the table, the JSON and the SVG of simulated points
// (run.hpp's SimPoint), apart from the runner that makes them (run.cpp).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epx/sim/runner/run.hpp"

namespace epx::tools {

namespace {

// One printf-formatted line into `os` (the table's lines are at most a few hundred bytes).
template <class... A>
void put_line(std::ostringstream& os, const char* format, A... args) {
  char line[512];
  std::snprintf(line, sizeof line, format, args...);
  os << line;
}

void rates_table(std::ostringstream& os, const std::vector<SimPoint>& points) {
  os << "  EP | dispatch GB/s avg  slowest | max-rank us | combine GB/s avg  slowest | max-rank us\n";
  for (const SimPoint& p : points)
    put_line(os, "%4d | %17.1f %8.1f | %11.1f | %16.1f %8.1f | %11.1f\n", p.ep, p.dispatch_gbps, p.dispatch_gbps_slowest, p.dispatch_us,
             p.combine_gbps, p.combine_gbps_slowest, p.combine_us);
  os << "DeepEP's bottleneck bandwidth (docs/sim.md), GB/s per rank:\n";
  for (const SimPoint& p : points)
    put_line(os, "%4d | dispatch %7.1f | combine %7.1f | %s\n", p.ep, p.dispatch_bottleneck_gbps, p.combine_bottleneck_gbps,
             p.bottleneck_metric.c_str());
}

void without_table(std::ostringstream& os, const std::vector<SimPoint>& points) {
  if (points.empty() || points.front().combine_without.empty()) return;
  os << "combine GB/s (avg) with one mechanism of the model removed (same engine run):\n  EP |     full";
  for (const auto& [name, v] : points.front().combine_without) os << " | w/o " << name;
  os << "\n";
  for (const SimPoint& p : points) {
    put_line(os, "%4d | %8.1f", p.ep, p.combine_gbps);
    for (const auto& [name, v] : p.combine_without) put_line(os, " | %*.1f", static_cast<int>(name.size() + 4), v);
    os << "\n";
  }
}

void split_tables(std::ostringstream& os, const std::vector<SimPoint>& points) {
  os << "time split (us, average over ranks): data plane / control plane / sync / tail\n";
  for (const SimPoint& p : points) {
    const Split &d = p.dispatch_split, &c = p.combine_split;
    put_line(os, "%4d | dispatch %7.1f %7.1f %7.1f %7.1f | combine %7.1f %7.1f %7.1f %7.1f\n", p.ep, d.data_us, d.control_us, d.sync_us,
             d.tail_us, c.data_us, c.control_us, c.sync_us, c.tail_us);
  }
  bool nic = false;
  for (const SimPoint& p : points) nic = nic || p.dispatch_split.nic_mb > 0 || p.combine_split.nic_mb > 0;
  if (nic) {  // a profile with a NIC (scale-out): when each port's payload starts and ends
    os << "payload out per port (us, MB; average over ranks): scale-up first put - last landed (MB) | NIC first put - last landed (MB)\n";
    for (const SimPoint& p : points) {
      const Split &d = p.dispatch_split, &c = p.combine_split;
      put_line(os, "%4d | dispatch %7.1f - %7.1f (%6.1f) | %7.1f - %7.1f (%6.1f) | combine %7.1f - %7.1f (%6.1f) | %7.1f - %7.1f (%6.1f)\n",
               p.ep, d.scaleup_first_us, d.scaleup_last_us, d.scaleup_mb, d.nic_first_us, d.nic_last_us, d.nic_mb, c.scaleup_first_us,
               c.scaleup_last_us, c.scaleup_mb, c.nic_first_us, c.nic_last_us, c.nic_mb);
    }
  }
  if (!points.empty() && points.front().combine_split.reduce_tail_us > 0) {
    os << "combine's sums and per-peer hand-backs after the rank's last transport op (us, average over ranks; part of the data plane):";
    for (const SimPoint& p : points) put_line(os, " EP%d %.1f", p.ep, p.combine_split.reduce_tail_us);
    os << "\n";
  }
}

}  // namespace

std::string sim_table(const std::vector<SimPoint>& points, const sim::HardwareModel& hw) {
  std::ostringstream os;
  put_line(os, "hardware: %s (physical payload limit %.0f-%.0f GB/s per rank)\n", hw.name.c_str(), hw.payload_limit_low.gbps,
           hw.payload_limit_high.gbps);
  if (!points.empty() && points.front().steady)
    os << (points.front().cached ? "steady state: a cached dispatch and a combine after a first pair (rows first)\n"
                                 : "steady state: a second dispatch and combine after a first pair (rows first)\n");
  rates_table(os, points);
  without_table(os, points);
  split_tables(os, points);
  // The printed word stays "replay" (here and in the JSON keys) so that `epx sim`'s output and
  // the scripts reading it stay byte-identical; it is the time the model took (timing_seconds).
  os << "run time per EP size (engine on sim ranks + replay):\n";
  for (const SimPoint& p : points)
    put_line(os, "%4d | engine %.2f s (%.2f s CPU; %s, hidden %d) + replay %.2f s (%.2f s CPU), %llu events\n", p.ep, p.engine_seconds,
             p.engine_cpu_seconds, p.model_only ? "model-only" : "copy, payload scaled", p.run_hidden, p.timing_seconds,
             p.timing_cpu_seconds, static_cast<unsigned long long>(p.events));
  return os.str();
}

std::string sim_json(const std::vector<SimPoint>& points) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  auto split = [](const Split& s) {
    return nlohmann::ordered_json{{"data_us", s.data_us},
                                  {"control_us", s.control_us},
                                  {"sync_us", s.sync_us},
                                  {"tail_us", s.tail_us},
                                  {"reduce_tail_us", s.reduce_tail_us},
                                  {"scaleup_first_us", s.scaleup_first_us},
                                  {"scaleup_last_us", s.scaleup_last_us},
                                  {"scaleup_mb", s.scaleup_mb},
                                  {"nic_first_us", s.nic_first_us},
                                  {"nic_last_us", s.nic_last_us},
                                  {"nic_mb", s.nic_mb}};
  };
  for (const SimPoint& p : points) {
    nlohmann::ordered_json without = nlohmann::ordered_json::object();
    for (const auto& [name, v] : p.combine_without) without[name] = v;
    list.push_back({{"ep", p.ep},
                    {"dispatch_gbps", p.dispatch_gbps},
                    {"combine_gbps", p.combine_gbps},
                    {"dispatch_us", p.dispatch_us},
                    {"combine_us", p.combine_us},
                    {"dispatch_bottleneck_gbps", p.dispatch_bottleneck_gbps},
                    {"combine_bottleneck_gbps", p.combine_bottleneck_gbps},
                    {"bottleneck_metric", p.bottleneck_metric},
                    {"dispatch_gbps_slowest", p.dispatch_gbps_slowest},
                    {"combine_gbps_slowest", p.combine_gbps_slowest},
                    {"dispatch_split", split(p.dispatch_split)},
                    {"combine_split", split(p.combine_split)},
                    {"mode", p.model_only ? "model-only" : "copy-scaled"},
                    {"steady", p.steady},
                    {"cached", p.cached},
                    {"run_hidden", p.run_hidden},
                    {"engine_seconds", p.engine_seconds},
                    {"replay_seconds", p.timing_seconds},
                    {"engine_cpu_seconds", p.engine_cpu_seconds},
                    {"replay_cpu_seconds", p.timing_cpu_seconds},
                    {"events", p.events},
                    {"combine_gbps_without", without}});
  }
  return list.dump(2) + "\n";
}

std::string sim_svg(const std::vector<SimPoint>& points, const sim::HardwareModel& hw) {
  const double W = 640, Hh = 400, left = 60, right = 20, top = 30, bottom = 50;
  double ymax = hw.payload_limit_high.gbps * 1.1;
  for (const SimPoint& p : points) ymax = std::max({ymax, p.dispatch_gbps * 1.1, p.combine_gbps * 1.1});
  const std::size_t n = points.size();
  auto x = [&](std::size_t i) { return left + (n <= 1 ? 0.5 : static_cast<double>(i) / static_cast<double>(n - 1)) * (W - left - right); };
  auto y = [&](double v) { return top + (1 - v / ymax) * (Hh - top - bottom); };
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << Hh << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<text x=\"" << left << "\" y=\"18\">epx sim: predicted GB/s per rank vs EP size (" << hw.name << ")</text>\n";
  os << "<line x1=\"" << left << "\" y1=\"" << y(0) << "\" x2=\"" << W - right << "\" y2=\"" << y(0) << "\" stroke=\"black\"/>\n";
  os << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << y(0) << "\" stroke=\"black\"/>\n";
  for (int v = 0; v <= static_cast<int>(ymax); v += 100)
    os << "<text x=\"" << left - 35 << "\" y=\"" << y(v) + 4 << "\">" << v << "</text>\n";
  os << "<rect x=\"" << left << "\" y=\"" << y(hw.payload_limit_high.gbps) << "\" width=\"" << W - left - right << "\" height=\""
     << y(hw.payload_limit_low.gbps) - y(hw.payload_limit_high.gbps) << "\" fill=\"#ddd\"/>\n";
  auto poly = [&](const char* color, auto get) {
    os << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
    for (std::size_t i = 0; i < n; ++i) os << x(i) << "," << y(get(points[i])) << " ";
    os << "\"/>\n";
    for (std::size_t i = 0; i < n; ++i)
      os << "<circle cx=\"" << x(i) << "\" cy=\"" << y(get(points[i])) << "\" r=\"3\" fill=\"" << color << "\"/>\n";
  };
  poly("#1f77b4", [](const SimPoint& p) { return p.dispatch_gbps; });
  poly("#d62728", [](const SimPoint& p) { return p.combine_gbps; });
  for (std::size_t i = 0; i < n; ++i)
    os << "<text x=\"" << x(i) - 12 << "\" y=\"" << Hh - bottom + 18 << "\">EP" << points[i].ep << "</text>\n";
  os << "<text x=\"" << W - 220 << "\" y=\"" << top + 12 << "\" fill=\"#1f77b4\">dispatch (avg per rank)</text>\n";
  os << "<text x=\"" << W - 220 << "\" y=\"" << top + 28 << "\" fill=\"#d62728\">combine (avg per rank)</text>\n";
  os << "<text x=\"" << W - 220 << "\" y=\"" << top + 44 << "\" fill=\"#777\">grey band: physical payload limit</text>\n";
  os << "</svg>\n";
  return os.str();
}

}  // namespace epx::tools
