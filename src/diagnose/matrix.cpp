// The verdict on a wait matrix (DeepEP's ratio rule against the others' mean, epx/diagnose.hpp) and the
// report as text (the log's and `epx bench --diagnose`'s).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "epx/diagnose.hpp"
#include "epx/error.hpp"

namespace epx {
namespace {

constexpr double kTiny = 1e-8;  // a ratio to a baseline of 0 stays finite (the floor decides such a value)

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
  if (!std::isfinite(t.floor_us) || t.floor_us < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "diagnose_matrix: floor_us must be finite and >= 0, got " + std::to_string(t.floor_us));
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Abnormal against the mean of the others: above `threshold` times it, and above it by more
// than the floor. No others: never.
bool abnormal(double x, double others_sum, std::size_t others, double threshold, double floor_us, double* ratio) {
  if (others == 0) return false;
  const double base = others_sum / static_cast<double>(others);
  if (ratio) *ratio = x / (base + kTiny);
  return x > threshold * base && x - base > floor_us;
}

// The indices whose mean is abnormal against the mean of the OTHER means.
std::vector<int> abnormal_means(const std::vector<double>& means, double threshold, double floor_us) {
  double sum = 0;
  for (double v : means) sum += v;
  std::vector<int> out;
  for (std::size_t i = 0; i < means.size(); ++i)
    if (abnormal(means[i], sum - means[i], means.size() - 1, threshold, floor_us, nullptr)) out.push_back(static_cast<int>(i));
  return out;
}

// The links' typical value: the off-diagonal values outside the abnormal rows and columns.
struct Typical {
  double sum = 0;
  std::size_t n = 0;
  bool holds(std::size_t s, std::size_t d, const MatrixVerdict& v) const {
    return s != d && !contains(v.rows, static_cast<int>(s)) && !contains(v.cols, static_cast<int>(d));
  }
};

Typical typical_links(const std::vector<double>& m, std::size_t n, const MatrixVerdict& v) {
  Typical t;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d)
      if (t.holds(s, d, v)) {
        t.sum += m[s * n + d];
        ++t.n;
      }
  return t;
}

// A link stands out of its own row and column too: M[s][d] against the mean of the other
// off-diagonal values of row s (outside the abnormal columns) and of column d (outside the
// abnormal rows). A source late for some of its destinations (descheduled in the middle of
// its sends) lifts several links of its row: that is no slow link. None there: no test.
bool stands_out(const std::vector<double>& m, std::size_t n, const MatrixVerdict& v, std::size_t s, std::size_t d,
                const DiagnoseThresholds& t) {
  const double x = m[s * n + d];
  double row_sum = 0, col_sum = 0;
  std::size_t row_n = 0, col_n = 0;
  for (std::size_t k = 0; k < n; ++k) {
    if (k != s && k != d && !contains(v.cols, static_cast<int>(k))) {
      row_sum += m[s * n + k];
      ++row_n;
    }
    if (k != d && k != s && !contains(v.rows, static_cast<int>(k))) {
      col_sum += m[k * n + d];
      ++col_n;
    }
  }
  return (row_n == 0 || abnormal(x, row_sum, row_n, t.point, t.floor_us, nullptr)) &&
         (col_n == 0 || abnormal(x, col_sum, col_n, t.point, t.floor_us, nullptr));
}

// The rule without the link refinement: rows and columns by their means against the mean of
// the other rows' (columns') means; points, outside them, against the mean of the other
// off-diagonal points outside them, and standing out of their own row and column.
MatrixVerdict judge(const std::vector<double>& m, std::size_t n, const DiagnoseThresholds& t) {
  std::vector<double> row_mean(n, 0), col_mean(n, 0);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      row_mean[s] += m[s * n + d] / static_cast<double>(n);
      col_mean[d] += m[s * n + d] / static_cast<double>(n);
    }
  MatrixVerdict v;
  v.rows = abnormal_means(row_mean, t.row, t.floor_us);
  v.cols = abnormal_means(col_mean, t.col, t.floor_us);
  const Typical typ = typical_links(m, n, v);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      if (!typ.holds(s, d, v)) continue;
      const double x = m[s * n + d];
      double ratio = 0;
      if (abnormal(x, typ.sum - x, typ.n - 1, t.point, t.floor_us, &ratio) && stands_out(m, n, v, s, d, t))
        v.points.push_back({static_cast<int>(s), static_cast<int>(d), x, ratio});
    }
  return v;
}

bool is_link(const std::vector<AbnormalPoint>& links, std::size_t s, std::size_t d) {
  return std::any_of(links.begin(), links.end(), [&](const AbnormalPoint& l) {
    return l.src == static_cast<int>(s) && l.dst == static_cast<int>(d);
  });
}

// The typical link of `m` under verdict `v`, the links set aside left out (they hold stand-ins).
double typical_link(const std::vector<double>& m, std::size_t n, const MatrixVerdict& v,
                    const std::vector<AbnormalPoint>& links, bool* any) {
  const Typical all = typical_links(m, n, v);
  double sum = all.sum;
  std::size_t count = all.n;
  for (const AbnormalPoint& l : links)
    if (all.holds(static_cast<std::size_t>(l.src), static_cast<std::size_t>(l.dst), v)) {
      sum -= m[static_cast<std::size_t>(l.src) * n + static_cast<std::size_t>(l.dst)];
      --count;
    }
  *any = count > 0;
  return count > 0 ? sum / static_cast<double>(count) : 0;
}

// The largest point (s, d), s != d, not set aside yet, of an abnormal row s or an abnormal
// column d (which of the two crosses its threshold first is a coin toss for a single point),
// abnormal against the typical link, that alone makes one of them abnormal: with it set to
// the typical link, row s or column d is no longer abnormal (a row abnormal through several
// of its points stays a row). Returns false if there is none; else `m` has it set so.
bool set_aside_link(std::vector<double>& m, std::size_t n, const MatrixVerdict& v, const DiagnoseThresholds& t,
                    const std::vector<AbnormalPoint>& links, AbnormalPoint& link) {
  bool any = false;
  const double base = typical_link(m, n, v, links, &any);
  if (!any) return false;
  bool found = false;
  std::vector<double> best;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      if (s == d || (!contains(v.rows, static_cast<int>(s)) && !contains(v.cols, static_cast<int>(d))) ||
          is_link(links, s, d))
        continue;
      const std::size_t at = s * n + d;
      const double x = m[at];
      double ratio = 0;
      if (!abnormal(x, base, 1, t.point, t.floor_us, &ratio) || (found && x <= link.value_us)) continue;
      std::vector<double> repaired = m;
      repaired[at] = base;
      const MatrixVerdict w = judge(repaired, n, t);
      const bool row_cleared = contains(v.rows, static_cast<int>(s)) && !contains(w.rows, static_cast<int>(s));
      const bool col_cleared = contains(v.cols, static_cast<int>(d)) && !contains(w.cols, static_cast<int>(d));
      if (!row_cleared && !col_cleared) continue;
      found = true;
      link = {static_cast<int>(s), static_cast<int>(d), x, ratio};
      best = std::move(repaired);
    }
  if (found) m = std::move(best);
  return found;
}

// The links set aside hold the typical link of the matrix as it is now (the first stand-ins
// were taken with the later links still in, too high); returns the new verdict.
MatrixVerdict restand(std::vector<double>& m, std::size_t n, const DiagnoseThresholds& t, std::vector<AbnormalPoint>& links) {
  MatrixVerdict v = judge(m, n, t);
  bool any = false;
  const double base = typical_link(m, n, v, links, &any);
  if (!any) return v;
  for (AbnormalPoint& l : links) {
    m[static_cast<std::size_t>(l.src) * n + static_cast<std::size_t>(l.dst)] = base;
    l.ratio = l.value_us / (base + kTiny);
  }
  return judge(m, n, t);
}

}  // namespace

MatrixVerdict diagnose_matrix(const std::vector<double>& matrix, int P, const DiagnoseThresholds& t) {
  check_matrix(matrix, P, t);
  const auto n = static_cast<std::size_t>(P);
  std::vector<double> m = matrix;
  MatrixVerdict v = judge(m, n, t);
  std::vector<AbnormalPoint> links;
  AbnormalPoint link;
  // Each round sets aside another off-diagonal value: at most n (n - 1) rounds.
  while (t.links && links.size() < n * (n - 1) && set_aside_link(m, n, v, t, links, link)) {
    links.push_back(link);
    v = restand(m, n, t, links);
  }
  // A link set aside holds the typical value: it is listed once, as measured.
  std::erase_if(v.points, [&](const AbnormalPoint& p) {
    return is_link(links, static_cast<std::size_t>(p.src), static_cast<std::size_t>(p.dst));
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
  char head[256];
  std::snprintf(head, sizeof head,
                "diagnose: %zu ranks, exchange %llu, %.1f s; thresholds row %g col %g point %g (x the others' mean), "
                "floor %g us\n",
                r.ranks.size(), static_cast<unsigned long long>(r.exchanges), r.seconds, r.thresholds.row, r.thresholds.col,
                r.thresholds.point, r.thresholds.floor_us);
  std::string out = head;
  if (!r.error.empty()) out += "  the background exchange ended: " + r.error + "\n";
  if (r.exchanges == 0) return out + "  no exchange yet\n";
  for (int op = 0; op < kNumWaitOps; ++op) out += format_op(r, op);
  return out;
}

}  // namespace epx
