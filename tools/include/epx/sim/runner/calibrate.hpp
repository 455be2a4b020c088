// `epx sim calibrate` and `epx sim experiments`.
#pragma once

#include <string>
#include <vector>

#include "epx/sim/runner/run.hpp"

namespace epx::tools {

/// A published point the profile is fitted on (sim::HardwareModel::published, the points
/// marked "calibrate"), with the options its series runs with.
struct CalibrationTarget {
  std::string series;  ///< the series' label ("normal kernels")
  std::string metric;  ///< "epx" (README GB/s) or "deepep" (bottleneck bandwidth)
  SimOptions options;  ///< the base options with the series' run applied, ep = {point.ep}
  sim::PublishedPoint point;
};
/// The calibration points of `hw`, in file order. Throws kInvalidArgument if it has none, or
/// if its "calibrate" list is empty.
std::vector<CalibrationTarget> calibration_targets(const SimOptions& base, const sim::HardwareModel& hw);
/// The base options with a series' run applied (and progress / hardware kept).
SimOptions series_options(const SimOptions& base, const sim::PublishedSeries& series);
/// A point's GB/s in a series' metric.
double metric_gbps(const SimPoint& p, const std::string& metric, bool combine);

struct CalibrationPoint {
  CalibrationTarget target;
  double dispatch_gbps = 0, combine_gbps = 0;            ///< in the target's metric
  double dispatch_us = 0, combine_us = 0;                ///< max-rank
  double dispatch_error_pct = 0, combine_error_pct = 0;  ///< vs the middle of the range
};

struct Calibration {
  sim::HardwareModel model;
  std::vector<CalibrationPoint> points;
  int evaluations = 0;
  double seconds = 0;
};

/// Runs the engine once per calibration point of `start`, then fits the parameters its
/// "calibrate" list names (Nelder-Mead in log space on the squared relative errors to the
/// range middles).
Calibration calibrate(const SimOptions& o, const sim::HardwareModel& start, int max_evaluations = 110);
/// The calibrated points of a model, without fitting (runs and timings only).
std::vector<CalibrationPoint> calibration_points(const SimOptions& o, const sim::HardwareModel& hw);
std::string calibration_report(const Calibration& c);

/// One row of the experiment table: a variant of the base options and its modelled point.
struct ExperimentVariant {
  std::string name;   ///< "group width 16"
  std::string plane;  ///< what it moves: "data plane (incast / port contention)", ...
  SimOptions options;
  SimPoint point;     ///< dispatch_us < 0: the engine run failed
};

/// The best combination after one knob of one pass of the search.
struct ExperimentSearchStep {
  int pass = 0;       ///< 1-based
  std::string knob;   ///< schedule | queues | aggregate | protocol | send-policy
  SimOptions best;
  SimPoint best_point;
};

/// `epx sim experiments`: the variants at 128 ranks, then a coordinate descent over the
/// engine's data-plane knobs (schedule, queues, aggregation, protocol, send policy).
struct Experiments {
  SimOptions base;                          ///< the options with ep = {128}
  std::vector<ExperimentVariant> variants;  ///< [0] the baseline
  std::vector<ExperimentSearchStep> search;
  SimOptions best;
  SimPoint best_point, best_with_credits;   ///< the winner, and it with per-group credits (16)
  int engine_runs = 0;                      ///< engine runs at 128 ranks
  std::size_t evaluations = 0, candidates = 0;  ///< model evaluations; distinct search candidates
  double seconds = 0;
};

/// Runs the experiment table and the search (progress on stderr with o.progress).
Experiments run_experiments(const SimOptions& o, const sim::HardwareModel& hw);

/// The table and the search as `epx sim experiments` prints them.
std::string experiments_report(const Experiments& e, const sim::HardwareModel& hw);

}  // namespace epx::tools
