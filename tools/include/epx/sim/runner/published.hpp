// `epx sim published`: every published series of a hardware profile (sim::PublishedSeries:
// how the system was measured, at which EP sizes it is predicted, its published points)
// run through the engine and the model, next to what was published. The data behind the
// SVG (and `epx sim --html`): SystemPrediction, one per profile.
#pragma once

#include <string>
#include <vector>

#include "epx/sim/hardware.hpp"
#include "epx/sim/runner/run.hpp"

namespace epx::tools {

/// One EP size of a series: the model's prediction and, where published, the figure.
struct SeriesPoint {
  int ep = 0;
  SimPoint predicted;                  ///< everything `epx sim` reports for it
  double dispatch_gbps = 0, combine_gbps = 0;  ///< predicted, in the series' metric
  bool published = false;              ///< `point` holds the published figure
  sim::PublishedPoint point;           ///< the published figure (calibrate: fitted on, else held out)
};

struct SeriesPrediction {
  sim::PublishedSeries series;  ///< label, metric ("epx" | "deepep"), run, EP sizes, points
  SimOptions options;           ///< what ran (the base options with the series' run applied)
  std::vector<SeriesPoint> points;  ///< one per series.ep, in order
};

/// A profile's published series, predicted.
struct SystemPrediction {
  std::string profile, description;
  double limit_low_gbps = 0, limit_high_gbps = 0;  ///< payload_limit_low / high (reporting band)
  std::vector<SeriesPrediction> series;
  double seconds = 0;
};

/// Runs every series of `hw` at every EP size it lists (progress on stderr with
/// base.progress). Throws kInvalidArgument if the profile has no published series.
SystemPrediction predict_published(const SimOptions& base, const sim::HardwareModel& hw);

/// The predictions and the published points as `epx sim published` prints them; as JSON
/// (one object per profile); as SVG (a panel per series: predicted lines, published points
/// as squares — filled: calibrated on, hollow: held out).
std::string published_table(const std::vector<SystemPrediction>& systems);
std::string published_json(const std::vector<SystemPrediction>& systems);
std::string published_svg(const std::vector<SystemPrediction>& systems);

}  // namespace epx::tools
