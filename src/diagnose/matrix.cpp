// The verdict on a wait matrix (DeepEP's ratio-to-mean rule, epx/diagnose.hpp) and the
// report as text (the log's and `epx bench --diagnose`'s).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "epx/diagnose.hpp"
#include "epx/error.hpp"

namespace epx {
namespace {

constexpr double kTiny = 1e-8;  // keeps an all-zero matrix from dividing by zero (and flags nothing)

void check_matrix(const std::vector<double>& m, int P, const DiagnoseThresholds& t) {
  if (P < 1 || m.size() != static_cast<std::size_t>(P) * static_cast<std::size_t>(P))
    throw Error(ErrorCode::kInvalidArgument, "diagnose_matrix: expected " + std::to_string(P) + " x " +
                                                 std::to_string(P) + " values, got " + std::to_string(m.size()));
  for (std::size_t i = 0; i < m.size(); ++i)
    if (!std::isfinite(m[i]) || m[i] < 0)
      throw Error(ErrorCode::kInvalidArgument, "diagnose_matrix: value [" + std::to_string(i / static_cast<std::size_t>(P)) +
                                                   "][" + std::to_string(i % static_cast<std::size_t>(P)) +
                                                   "] = " + std::to_string(m[i]) + " (expected a finite value >= 0)");
  if (!(t.row > 0) || !(t.col > 0) || !(t.point > 0))
    throw Error(ErrorCode::kInvalidArgument, "diagnose_matrix: thresholds must be > 0, got row " + std::to_string(t.row) +
                                                 ", col " + std::to_string(t.col) + ", point " + std::to_string(t.point));
}

// The indices whose mean is more than `threshold` times the mean of the means.
std::vector<int> above(const std::vector<double>& means, double threshold) {
  double mean = 0;
  for (double v : means) mean += v;
  mean /= static_cast<double>(means.size());
  std::vector<int> out;
  for (std::size_t i = 0; i < means.size(); ++i)
    if (means[i] / (mean + kTiny) > threshold) out.push_back(static_cast<int>(i));
  return out;
}

bool contains(const std::vector<int>& v, int x) {
  for (int y : v)
    if (y == x) return true;
  return false;
}

}  // namespace

namespace {

// DeepEP's rule as it is: abnormal rows and columns by their means, points outside them.
MatrixVerdict deepep_rule(const std::vector<double>& m, std::size_t n, const DiagnoseThresholds& t) {
  std::vector<double> row_mean(n, 0), col_mean(n, 0);
  double mean = 0;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      row_mean[s] += m[s * n + d] / static_cast<double>(n);
      col_mean[d] += m[s * n + d] / static_cast<double>(n);
      mean += m[s * n + d];
    }
  mean /= static_cast<double>(n * n);
  MatrixVerdict v;
  v.rows = above(row_mean, t.row);
  v.cols = above(col_mean, t.col);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      const double x = m[s * n + d];
      const double ratio = x / (mean + kTiny);
      if (ratio > t.point && !contains(v.rows, static_cast<int>(s)) && !contains(v.cols, static_cast<int>(d)))
        v.points.push_back({static_cast<int>(s), static_cast<int>(d), x, ratio});
    }
  return v;
}

double mean_of(const std::vector<double>& m) {
  double sum = 0;
  for (double x : m) sum += x;
  return sum / static_cast<double>(m.size());
}

// The largest point (s, d) of an abnormal row s or an abnormal column d (which of the two
// crosses its threshold first is a coin toss for a single point), above the point
// threshold, that alone makes them abnormal: with it set to the mean of the other values,
// neither is. Returns false if there is none; else `m` has it set so.
bool set_aside_link(std::vector<double>& m, std::size_t n, const MatrixVerdict& v, const DiagnoseThresholds& t,
                    AbnormalPoint& link) {
  const double mean = mean_of(m);
  bool found = false;
  std::vector<double> best;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      if (!contains(v.rows, static_cast<int>(s)) && !contains(v.cols, static_cast<int>(d))) continue;
      const std::size_t at = s * n + d;
      const double x = m[at];
      if (s == d || x / (mean + kTiny) <= t.point || (found && x <= link.value_us)) continue;
      std::vector<double> repaired = m;
      repaired[at] = (mean * static_cast<double>(n * n) - x) / static_cast<double>(n * n - 1);
      const MatrixVerdict w = deepep_rule(repaired, n, t);
      if (contains(w.rows, static_cast<int>(s)) || contains(w.cols, static_cast<int>(d))) continue;
      found = true;
      link = {static_cast<int>(s), static_cast<int>(d), x, x / (mean + kTiny)};
      best = std::move(repaired);
    }
  if (found) m = std::move(best);
  return found;
}

}  // namespace

MatrixVerdict diagnose_matrix(const std::vector<double>& matrix, int P, const DiagnoseThresholds& t) {
  check_matrix(matrix, P, t);
  const auto n = static_cast<std::size_t>(P);
  std::vector<double> m = matrix;
  MatrixVerdict v = deepep_rule(m, n, t);
  std::vector<AbnormalPoint> links;
  AbnormalPoint link;
  while (t.links && links.size() < n && set_aside_link(m, n, v, t, link)) {
    links.push_back(link);
    v = deepep_rule(m, n, t);
  }
  // A link set aside holds the mean of the rest: on the matrix without a later, larger link
  // that value can pass the point threshold by itself; the link is listed once, as measured.
  std::erase_if(v.points, [&](const AbnormalPoint& p) {
    return std::any_of(links.begin(), links.end(), [&](const AbnormalPoint& l) { return l.src == p.src && l.dst == p.dst; });
  });
  v.points.insert(v.points.end(), links.begin(), links.end());
  std::sort(v.points.begin(), v.points.end(),
            [](const AbnormalPoint& a, const AbnormalPoint& b) { return a.src != b.src ? a.src < b.src : a.dst < b.dst; });
  return v;
}

namespace {

std::string list(const std::vector<int>& v, const std::vector<RankInfo>& ranks) {
  if (v.empty()) return "none";
  std::string out;
  for (int r : v) {
    if (!out.empty()) out += ", ";
    out += std::to_string(r);
    if (static_cast<std::size_t>(r) < ranks.size()) out += " (" + ranks[static_cast<std::size_t>(r)].node + ")";
  }
  return out;
}

std::string node_of(const std::vector<RankInfo>& ranks, int r) {
  return static_cast<std::size_t>(r) < ranks.size() ? ranks[static_cast<std::size_t>(r)].node : "?";
}

std::string format_op(const DiagnoseReport& r, int op) {
  const DiagnoseOp& o = r.ops[static_cast<std::size_t>(op)];
  const std::size_t P = o.calls.size();
  std::string out = std::string(to_string(static_cast<WaitOp>(op))) + ": ";
  out += o.verdict.clean() ? "nothing abnormal\n" : "ABNORMAL\n";
  out += "  slow sources (rows): " + list(o.verdict.rows, r.ranks) + "\n";
  out += "  slow destinations (columns): " + list(o.verdict.cols, r.ranks) + "\n";
  out += "  slow links (points):";
  if (o.verdict.points.empty()) out += " none";
  char buf[160];
  for (const AbnormalPoint& p : o.verdict.points) {
    std::snprintf(buf, sizeof buf, " %d -> %d (%s -> %s) %.1f us %.1fx;", p.src, p.dst, node_of(r.ranks, p.src).c_str(),
                  node_of(r.ranks, p.dst).c_str(), p.value_us, p.ratio);
    out += buf;
  }
  out += "\n  wait per call, us: matrix[src][dst] (calls per dst:";
  for (std::uint64_t c : o.calls) out += " " + std::to_string(c);
  out += ")\n";
  for (std::size_t s = 0; s < P; ++s) {
    out += "  [";
    for (std::size_t d = 0; d < P; ++d) {
      std::snprintf(buf, sizeof buf, "%10.1f", o.matrix_us[s * P + d]);
      out += buf;
    }
    out += " ]\n";
  }
  return out;
}

}  // namespace

std::string format_report(const DiagnoseReport& r) {
  char head[200];
  std::snprintf(head, sizeof head, "diagnose: %zu ranks, exchange %llu, %.1f s; thresholds row %g col %g point %g\n",
                r.ranks.size(), static_cast<unsigned long long>(r.exchanges), r.seconds, r.thresholds.row, r.thresholds.col,
                r.thresholds.point);
  std::string out = head;
  if (!r.error.empty()) out += "  the background exchange ended: " + r.error + "\n";
  if (r.exchanges == 0) return out + "  no exchange yet\n";
  for (int op = 0; op < kNumWaitOps; ++op) out += format_op(r, op);
  return out;
}

}  // namespace epx
