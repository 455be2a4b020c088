// `epx bench` statistics: the one definition of avg / percentiles every number uses.
#pragma once

#include <cstddef>
#include <vector>

namespace epx::tools {

/// avg, nearest-rank p50 / p95, and max of a sample (all 0 for an empty one).
struct Summary {
  double avg = 0, p50 = 0, p95 = 0, max = 0;
  std::size_t n = 0;
};

/// Nearest-rank percentile, p in (0, 100]: the smallest sample x with at least p% of the
/// samples <= x, i.e. sorted[ceil(p/100 * n) - 1]. 0 for an empty sample.
double percentile(std::vector<double> samples, double p);

Summary summarize(const std::vector<double>& samples);

/// Per index i, the max over the series of series[s][i] (series of unequal length: the
/// indices all of them have).
std::vector<double> max_over(const std::vector<std::vector<double>>& series);

double mean(const std::vector<double>& v);

}  // namespace epx::tools
