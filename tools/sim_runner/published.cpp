#include "epx/sim/runner/published.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epx/error.hpp"
#include "epx/sim/runner/calibrate.hpp"

namespace epx::tools {

SystemPrediction predict_published(const SimOptions& base, const sim::HardwareModel& hw) {
  if (hw.published.empty())
    throw Error(ErrorCode::kInvalidArgument, "epx sim published: hardware '" + hw.name + "' has no \"published\" series");
  const auto t0 = std::chrono::steady_clock::now();
  SystemPrediction sys{hw.name, hw.description, hw.payload_limit_low.gbps, hw.payload_limit_high.gbps, {}, 0};
  for (const sim::PublishedSeries& s : hw.published) {
    SeriesPrediction sp{s, series_options(base, s), {}};
    sp.options.hardware = hw.name;
    validate_sim_options(sp.options);
    if (base.progress) std::fprintf(stderr, "[epx sim published] %s, %s\n", hw.name.c_str(), s.label.c_str());
    for (const SimPoint& p : simulate(sp.options, hw)) {
      SeriesPoint pt;
      pt.ep = p.ep;
      pt.predicted = p;
      pt.dispatch_gbps = metric_gbps(p, s.metric, false);
      pt.combine_gbps = metric_gbps(p, s.metric, true);
      for (const sim::PublishedPoint& q : s.points)
        if (q.ep == p.ep) pt.published = true, pt.point = q;
      sp.points.push_back(pt);
    }
    sys.series.push_back(std::move(sp));
  }
  sys.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sys;
}

namespace {

double mid(double lo, double hi) { return (lo + hi) / 2; }

std::string published_text(double lo, double hi) {
  char b[48];
  if (lo == hi) std::snprintf(b, sizeof b, "%.0f", lo);
  else std::snprintf(b, sizeof b, "%.0f-%.0f", lo, hi);
  return b;
}

}  // namespace

std::string published_table(const std::vector<SystemPrediction>& systems) {
  std::ostringstream os;
  char line[400];
  for (const SystemPrediction& sys : systems) {
    os << "hardware " << sys.profile << ": " << sys.description << "\n";
    for (const SeriesPrediction& sp : sys.series) {
      os << "  " << sp.series.label << " (metric " << (sp.series.metric == "deepep" ? "DeepEP bottleneck bandwidth" : "GB/s per rank, README")
         << "; " << sp.options.tokens << " tokens/rank, top-" << sp.options.topk << " of " << sp.options.experts
         << (sp.options.groups > 0 ? ", group-limited " + std::to_string(sp.options.topk_groups) + " of " + std::to_string(sp.options.groups) : "")
         << ", schedule " << sp.options.schedule << ")\n";
      os << "     EP | dispatch GB/s  published   error |     us  published | combine GB/s  published   error |     us  published | kind\n";
      for (const SeriesPoint& p : sp.points) {
        const sim::PublishedPoint& q = p.point;
        std::string de = "", ce = "", dus = "", cus = "";
        if (p.published) {
          char b[32];
          std::snprintf(b, sizeof b, "%+.1f%%", 100 * (p.dispatch_gbps / mid(q.dispatch_lo, q.dispatch_hi) - 1));
          de = b;
          std::snprintf(b, sizeof b, "%+.1f%%", 100 * (p.combine_gbps / mid(q.combine_lo, q.combine_hi) - 1));
          ce = b;
          if (q.dispatch_us > 0) dus = std::to_string(static_cast<int>(q.dispatch_us));
          if (q.combine_us > 0) cus = std::to_string(static_cast<int>(q.combine_us));
        }
        std::snprintf(line, sizeof line, "   %4d | %13.1f %10s %7s | %6.1f %10s | %12.1f %10s %7s | %6.1f %10s | %s\n", p.ep, p.dispatch_gbps,
                      p.published ? published_text(q.dispatch_lo, q.dispatch_hi).c_str() : "-", de.c_str(), p.predicted.dispatch_us,
                      dus.c_str(), p.combine_gbps, p.published ? published_text(q.combine_lo, q.combine_hi).c_str() : "-", ce.c_str(),
                      p.predicted.combine_us, cus.c_str(),
                      !p.published ? "predicted" : q.calibrate ? "calibrated on" : "held out");
        os << line;
      }
    }
    std::snprintf(line, sizeof line, "  (%.0f s)\n", sys.seconds);
    os << line;
  }
  return os.str();
}

std::string published_json(const std::vector<SystemPrediction>& systems) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const SystemPrediction& sys : systems) {
    nlohmann::ordered_json series = nlohmann::ordered_json::array();
    for (const SeriesPrediction& sp : sys.series) {
      nlohmann::ordered_json points = nlohmann::ordered_json::array();
      for (const SeriesPoint& p : sp.points) {
        nlohmann::ordered_json j{{"ep", p.ep},
                                 {"dispatch_gbps", p.dispatch_gbps},
                                 {"combine_gbps", p.combine_gbps},
                                 {"dispatch_us", p.predicted.dispatch_us},
                                 {"combine_us", p.predicted.combine_us},
                                 {"bottleneck_metric", p.predicted.bottleneck_metric}};
        if (p.published) {
          j["published"] = {{"dispatch_gbps", {p.point.dispatch_lo, p.point.dispatch_hi}},
                            {"combine_gbps", {p.point.combine_lo, p.point.combine_hi}},
                            {"dispatch_us", p.point.dispatch_us},
                            {"combine_us", p.point.combine_us},
                            {"calibrate", p.point.calibrate}};
        }
        points.push_back(j);
      }
      series.push_back({{"label", sp.series.label}, {"metric", sp.series.metric}, {"source", sp.series.source}, {"points", points}});
    }
    list.push_back({{"profile", sys.profile},
                    {"description", sys.description},
                    {"limit_gbps", {sys.limit_low_gbps, sys.limit_high_gbps}},
                    {"series", series},
                    {"seconds", sys.seconds}});
  }
  return list.dump(2) + "\n";
}

std::string published_svg(const std::vector<SystemPrediction>& systems) {
  const double W = 640, panel = 260, left = 60, right = 30, top = 40, bottom = 40;  // right: room for the last EP label
  std::size_t panels = 0;
  for (const SystemPrediction& s : systems) panels += s.series.size();
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << panel * static_cast<double>(panels) + 10
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  double y0 = 0;
  for (const SystemPrediction& sys : systems)
    for (const SeriesPrediction& sp : sys.series) {
      double ymax = 10;
      for (const SeriesPoint& p : sp.points)
        ymax = std::max({ymax, p.dispatch_gbps, p.combine_gbps, p.point.dispatch_hi, p.point.combine_hi});
      ymax *= 1.15;
      const std::size_t n = sp.points.size();
      auto x = [&](std::size_t i) { return left + (n <= 1 ? 0.5 : static_cast<double>(i) / static_cast<double>(n - 1)) * (W - left - right); };
      auto y = [&](double v) { return y0 + top + (1 - v / ymax) * (panel - top - bottom); };
      os << "<text x=\"" << left << "\" y=\"" << y0 + 16 << "\">" << sys.profile << ", " << sp.series.label << ": "
         << (sp.series.metric == "deepep" ? "DeepEP bottleneck GB/s" : "GB/s per rank") << " vs EP</text>\n";
      os << "<text x=\"" << left << "\" y=\"" << y0 + 30 << "\" font-size=\"10\" fill=\"#555\">lines: epx sim; squares: published "
         << "(filled: calibrated on, hollow: held out)</text>\n";
      os << "<line x1=\"" << left << "\" y1=\"" << y(0) << "\" x2=\"" << W - right << "\" y2=\"" << y(0) << "\" stroke=\"black\"/>\n";
      os << "<line x1=\"" << left << "\" y1=\"" << y(ymax) << "\" x2=\"" << left << "\" y2=\"" << y(0) << "\" stroke=\"black\"/>\n";
      const double step = ymax > 300 ? 100 : ymax > 120 ? 50 : ymax > 60 ? 20 : 10;
      for (double v = 0; v < ymax; v += step) os << "<text x=\"" << left - 35 << "\" y=\"" << y(v) + 4 << "\">" << v << "</text>\n";
      for (const auto& [color, combine] : {std::pair{"#1f77b4", false}, std::pair{"#d62728", true}}) {
        os << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
        for (std::size_t i = 0; i < n; ++i) os << x(i) << "," << y(combine ? sp.points[i].combine_gbps : sp.points[i].dispatch_gbps) << " ";
        os << "\"/>\n";
        for (std::size_t i = 0; i < n; ++i) {
          const SeriesPoint& p = sp.points[i];
          if (!p.published) continue;
          const double v = combine ? mid(p.point.combine_lo, p.point.combine_hi) : mid(p.point.dispatch_lo, p.point.dispatch_hi);
          os << "<rect x=\"" << x(i) - 5 << "\" y=\"" << y(v) - 5 << "\" width=\"10\" height=\"10\" stroke=\"" << color
             << "\" stroke-width=\"2\" fill=\"" << (p.point.calibrate ? color : "none") << "\"/>\n";
        }
      }
      for (std::size_t i = 0; i < n; ++i)
        os << "<text x=\"" << x(i) << "\" y=\"" << y0 + panel - bottom + 18 << "\" text-anchor=\"middle\">EP" << sp.points[i].ep
           << "</text>\n";
      os << "<text x=\"" << W - 160 << "\" y=\"" << y0 + top + 4 << "\" fill=\"#1f77b4\">dispatch</text>\n";
      os << "<text x=\"" << W - 90 << "\" y=\"" << y0 + top + 4 << "\" fill=\"#d62728\">combine</text>\n";
      y0 += panel;
    }
  os << "</svg>\n";
  return os.str();
}

}  // namespace epx::tools
