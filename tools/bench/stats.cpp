#include "epx/bench/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace epx::tools {

double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double n = static_cast<double>(samples.size());
  // The small epsilon keeps e.g. 0.95 * 20 = 19.000000000000004 at rank 19.
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * n - 1e-9));
  rank = std::clamp<std::size_t>(rank, 1, samples.size());
  return samples[rank - 1];
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

Summary summarize(const std::vector<double>& samples) {
  Summary s;
  s.n = samples.size();
  if (samples.empty()) return s;
  s.avg = mean(samples);
  s.p50 = percentile(samples, 50);
  s.p95 = percentile(samples, 95);
  s.max = *std::max_element(samples.begin(), samples.end());
  return s;
}

std::vector<double> max_over(const std::vector<std::vector<double>>& series) {
  if (series.empty()) return {};
  std::size_t n = series.front().size();
  for (const auto& s : series) n = std::min(n, s.size());
  std::vector<double> out(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = series.front()[i];
    for (const auto& s : series) out[i] = std::max(out[i], s[i]);
  }
  return out;
}

}  // namespace epx::tools
