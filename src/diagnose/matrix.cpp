// The verdict on a wait matrix (DeepEP's ratio rule against the others' mean, and the others' median and
// robust deviation: epx/diagnose.hpp), the persistent verdict over intervals, and the
// report as text (the log's and `epx bench --diagnose`'s).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
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
  if (!std::isfinite(t.spread) || t.spread < 0)
    throw Error(ErrorCode::kInvalidArgument, "diagnose_matrix: spread must be finite and >= 0, got " + std::to_string(t.spread));
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The typical value of a set of others: their mean (DeepEP's ratios are to it), their median
// and their robust deviation, 1.4826 x the median absolute deviation from the median (the
// standard deviation for normal noise; a few outliers among the others move neither).
struct Others {
  double sum = 0;
  std::vector<double> values;
  void add(double v) {
    sum += v;
    values.push_back(v);
  }
  std::size_t size() const noexcept { return values.size(); }
  double mean() const noexcept { return values.empty() ? 0 : sum / static_cast<double>(values.size()); }
};

double median_of(std::vector<double>& v) {
  const std::size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
  const double hi = v[h];
  if (v.size() % 2 == 1) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h)) + hi) / 2;
}

// Abnormal against the others: above `threshold` times their mean (DeepEP's ratio, the value's
// own weight left out of it), above that mean by more than the floor, and above their median
// by more than the floor and by more than thresholds.spread robust deviations of the others
// (so a value is named only where the others are tight enough for it to stand out, and a
// few slow others do not lower the bar). No others: never. `ratio` (when given) is set
// whenever there are others.
bool abnormal(double x, const Others& o, double threshold, const DiagnoseThresholds& t, double* ratio) {
  if (o.size() == 0) return false;
  const double base = o.mean();
  if (ratio) *ratio = x / (base + kTiny);
  if (!(x > threshold * base && x - base > t.floor_us)) return false;
  std::vector<double> v = o.values;
  const double med = median_of(v);
  for (double& y : v) y = std::fabs(y - med);
  const double sigma = 1.4826 * median_of(v);
  return x - med > std::max(t.floor_us, t.spread * sigma);
}

// The indices whose mean is abnormal against the OTHER means.
std::vector<int> abnormal_means(const std::vector<double>& means, double threshold, const DiagnoseThresholds& t) {
  std::vector<int> out;
  for (std::size_t i = 0; i < means.size(); ++i) {
    Others o;
    for (std::size_t k = 0; k < means.size(); ++k)
      if (k != i) o.add(means[k]);
    if (abnormal(means[i], o, threshold, t, nullptr)) out.push_back(static_cast<int>(i));
  }
  return out;
}

// The links' typical value: the off-diagonal values outside the abnormal rows and columns.
bool typical(std::size_t s, std::size_t d, const MatrixVerdict& v) {
  return s != d && !contains(v.rows, static_cast<int>(s)) && !contains(v.cols, static_cast<int>(d));
}

bool is_link(const std::vector<AbnormalPoint>& links, std::size_t s, std::size_t d) {
  return std::any_of(links.begin(), links.end(), [&](const AbnormalPoint& l) {
    return l.src == static_cast<int>(s) && l.dst == static_cast<int>(d);
  });
}

// The typical links of `m` under verdict `v`, but (s, d) itself (none: n, n) and the links set
// aside (they hold stand-ins).
Others typical_links(const std::vector<double>& m, std::size_t n, const MatrixVerdict& v,
                     const std::vector<AbnormalPoint>& links, std::size_t skip_s, std::size_t skip_d) {
  Others o;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d)
      if (typical(s, d, v) && !(s == skip_s && d == skip_d) && !is_link(links, s, d)) o.add(m[s * n + d]);
  return o;
}

// A link stands out of its own row and column too: M[s][d] against the other off-diagonal
// values of row s (outside the abnormal columns) and of column d (outside the abnormal
// rows), by the same test. A source late for some of its destinations (descheduled in the
// middle of its sends) lifts several links of its row: that is no slow link. None there: no test.
bool stands_out_of_row(const std::vector<double>& m, std::size_t n, const MatrixVerdict& v, std::size_t s, std::size_t d,
                       const DiagnoseThresholds& t) {
  Others row;
  for (std::size_t k = 0; k < n; ++k)
    if (k != s && k != d && !contains(v.cols, static_cast<int>(k))) row.add(m[s * n + k]);
  return row.size() == 0 || abnormal(m[s * n + d], row, t.point, t, nullptr);
}

bool stands_out_of_col(const std::vector<double>& m, std::size_t n, const MatrixVerdict& v, std::size_t s, std::size_t d,
                       const DiagnoseThresholds& t) {
  Others col;
  for (std::size_t k = 0; k < n; ++k)
    if (k != d && k != s && !contains(v.rows, static_cast<int>(k))) col.add(m[k * n + d]);
  return col.size() == 0 || abnormal(m[s * n + d], col, t.point, t, nullptr);
}

bool stands_out(const std::vector<double>& m, std::size_t n, const MatrixVerdict& v, std::size_t s, std::size_t d,
                const DiagnoseThresholds& t) {
  return stands_out_of_row(m, n, v, s, d, t) && stands_out_of_col(m, n, v, s, d, t);
}

// The rule without the link refinement: rows and columns by their means against the other
// rows' (columns') means; points, outside them, against the other typical links, and standing
// out of their own row and column.
MatrixVerdict judge(const std::vector<double>& m, std::size_t n, const DiagnoseThresholds& t) {
  // A row's (column's) mean is over its links, the diagonal (a rank's wait for itself, 0) left
  // out: the ratios are the same either way, but the floor is per call and link, and with
  // the diagonal in, a row's mean is (n - 1) / n of its links' (3/4 at n = 4, where a rank
  // stopped 20 ms at a time added 60-80 µs per link and its row stayed under 50).
  std::vector<double> row_mean(n, 0), col_mean(n, 0);
  const double links = n > 1 ? static_cast<double>(n - 1) : 1.0;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      if (s == d && n > 1) continue;
      row_mean[s] += m[s * n + d] / links;
      col_mean[d] += m[s * n + d] / links;
    }
  MatrixVerdict v;
  v.rows = abnormal_means(row_mean, t.row, t);
  v.cols = abnormal_means(col_mean, t.col, t);
  double sum = 0;
  std::size_t count = 0;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d)
      if (typical(s, d, v)) {
        sum += m[s * n + d];
        ++count;
      }
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t d = 0; d < n; ++d) {
      if (!typical(s, d, v) || count < 2) continue;
      const double x = m[s * n + d];
      // The others' mean alone first: the others' median and deviation only for what passes it.
      const double base = (sum - x) / static_cast<double>(count - 1);
      if (!(x > t.point * base && x - base > t.floor_us)) continue;
      double ratio = 0;
      if (abnormal(x, typical_links(m, n, v, {}, s, d), t.point, t, &ratio) && stands_out(m, n, v, s, d, t))
        v.points.push_back({static_cast<int>(s), static_cast<int>(d), x, ratio});
    }
  return v;
}

// The largest point (s, d), s != d, not set aside yet, of an abnormal row s or an abnormal
// column d (which of the two crosses its threshold first is a coin toss for a single point),
// abnormal against the typical link, that alone makes one of them abnormal: with it set to
// the typical link, row s or column d is no longer abnormal (a row abnormal through several
// of its points stays a row), and it stands out of that row's or column's other values. Returns false if there is none; else `m` has it set so.
bool set_aside_link(std::vector<double>& m, std::size_t n, const MatrixVerdict& v, const DiagnoseThresholds& t,
                    const std::vector<AbnormalPoint>& links, AbnormalPoint& link) {
  const Others others = typical_links(m, n, v, links, n, n);
  if (others.size() == 0) return false;
  const double base = others.mean();
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
      if ((found && x <= link.value_us) || !abnormal(x, others, t.point, t, &ratio)) continue;
      std::vector<double> repaired = m;
      repaired[at] = base;
      const MatrixVerdict w = judge(repaired, n, t);
      // A row (column) is the point only if the point stands out of the row's (column's)
      // other values: a slow source at 4 ranks has 3 links, and one of them a little higher
      // than the others carries the row across its threshold, but it is the row that is slow.
      const bool row_cleared = contains(v.rows, static_cast<int>(s)) && !contains(w.rows, static_cast<int>(s)) &&
                               stands_out_of_row(m, n, v, s, d, t);
      const bool col_cleared = contains(v.cols, static_cast<int>(d)) && !contains(w.cols, static_cast<int>(d)) &&
                               stands_out_of_col(m, n, v, s, d, t);
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
  const Others others = typical_links(m, n, v, links, n, n);
  if (others.size() == 0) return v;
  const double base = others.mean();
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

MatrixVerdict persistent_verdict(const std::vector<MatrixVerdict>& verdicts, const DiagnosePersist& rule) {
  if (rule.of < 1 || rule.need < 1 || rule.need > rule.of)
    throw Error(ErrorCode::kInvalidArgument, "persistent_verdict: expected 1 <= need <= of, got need " +
                                                 std::to_string(rule.need) + " of " + std::to_string(rule.of));
  const std::size_t n = std::min(verdicts.size(), static_cast<std::size_t>(rule.of));
  const auto first = verdicts.end() - static_cast<std::ptrdiff_t>(n);
  const auto need = static_cast<std::size_t>(rule.need);
  MatrixVerdict out;
  // Rows and columns: the indices named at least `need` times (each verdict lists an index once).
  auto persistent = [&](std::vector<int> MatrixVerdict::*field) {
    std::vector<int> all;
    for (auto v = first; v != verdicts.end(); ++v) all.insert(all.end(), ((*v).*field).begin(), ((*v).*field).end());
    std::sort(all.begin(), all.end());
    std::vector<int> kept;
    for (std::size_t i = 0; i < all.size();) {
      std::size_t j = i;
      while (j < all.size() && all[j] == all[i]) ++j;
      if (j - i >= need) kept.push_back(all[i]);
      i = j;
    }
    return kept;
  };
  out.rows = persistent(&MatrixVerdict::rows);
  out.cols = persistent(&MatrixVerdict::cols);
  // Points: the same by (src, dst); the latest naming interval's value and ratio (the later
  // verdicts come later in `all`, and the stable sort keeps that order).
  std::vector<AbnormalPoint> all;
  for (auto v = first; v != verdicts.end(); ++v) all.insert(all.end(), v->points.begin(), v->points.end());
  std::stable_sort(all.begin(), all.end(),
                   [](const AbnormalPoint& a, const AbnormalPoint& b) { return a.src != b.src ? a.src < b.src : a.dst < b.dst; });
  for (std::size_t i = 0; i < all.size();) {
    std::size_t j = i;
    while (j < all.size() && all[j].src == all[i].src && all[j].dst == all[i].dst) ++j;
    if (j - i >= need) out.points.push_back(all[j - 1]);
    i = j;
  }
  return out;
}

namespace {
using Interval = std::array<MatrixVerdict, kNumWaitOps>;
using Link = std::pair<int, int>;  // {a < b}

// The ranks any op of one interval names as a row or a column, each once.
std::vector<int> ranks_named(const Interval& interval) {
  std::vector<int> named;
  for (const MatrixVerdict& v : interval) {
    named.insert(named.end(), v.rows.begin(), v.rows.end());
    named.insert(named.end(), v.cols.begin(), v.cols.end());
  }
  std::sort(named.begin(), named.end());
  named.erase(std::unique(named.begin(), named.end()), named.end());
  return named;
}

// The links every op of one interval names as a point (either direction), each with the
// largest such point of the interval.
std::map<Link, AbnormalPoint> links_every_op_names(const Interval& interval) {
  auto link_of = [](const AbnormalPoint& p) { return Link{std::min(p.src, p.dst), std::max(p.src, p.dst)}; };
  std::map<Link, AbnormalPoint> out;
  for (const MatrixVerdict& v : interval)
    for (const AbnormalPoint& p : v.points) {
      const Link key = link_of(p);
      const bool in_all = std::all_of(interval.begin(), interval.end(), [&](const MatrixVerdict& w) {
        return std::any_of(w.points.begin(), w.points.end(), [&](const AbnormalPoint& q) { return link_of(q) == key; });
      });
      if (!in_all) continue;
      auto [at, fresh] = out.emplace(key, p);
      if (!fresh && p.value_us > at->second.value_us) at->second = p;
    }
  return out;
}
}  // namespace

RankVerdict persistent_ranks(const std::vector<Interval>& intervals, const DiagnosePersist& rule) {
  if (rule.of < 1 || rule.need < 1 || rule.need > rule.of)
    throw Error(ErrorCode::kInvalidArgument, "persistent_ranks: expected 1 <= need <= of, got need " +
                                                 std::to_string(rule.need) + " of " + std::to_string(rule.of));
  const std::size_t n = std::min(intervals.size(), static_cast<std::size_t>(rule.of));
  const auto need = static_cast<std::size_t>(rule.need);
  std::map<int, std::size_t> rank_count;  // rank -> intervals naming it
  struct Seen {
    std::size_t count = 0;
    AbnormalPoint latest;  // the largest point of the last interval that named the link
  };
  std::map<Link, Seen> link_seen;
  for (auto it = intervals.end() - static_cast<std::ptrdiff_t>(n); it != intervals.end(); ++it) {
    for (int r : ranks_named(*it)) ++rank_count[r];
    for (const auto& kv : links_every_op_names(*it)) {
      Seen& seen = link_seen[kv.first];
      ++seen.count;
      seen.latest = kv.second;
    }
  }
  RankVerdict out;
  for (const auto& kv : rank_count)
    if (kv.second >= need) out.ranks.push_back(kv.first);
  for (const auto& kv : link_seen)
    if (kv.second.count >= need) out.links.push_back(kv.second.latest);
  std::sort(out.links.begin(), out.links.end(),
            [](const AbnormalPoint& a, const AbnormalPoint& b) { return a.src != b.src ? a.src < b.src : a.dst < b.dst; });
  return out;
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

std::string format_verdict(const MatrixVerdict& v, const std::vector<RankInfo>& ranks, const char* indent) {
  std::string out = std::string(indent) + "slow sources (rows): " + list(v.rows, ranks) + "\n";
  out += std::string(indent) + "slow destinations (columns): " + list(v.cols, ranks) + "\n";
  out += std::string(indent) + "slow links (points):";
  if (v.points.empty()) out += " none";
  char buf[160];
  for (const AbnormalPoint& p : v.points) {
    std::snprintf(buf, sizeof buf, " %d -> %d (%s -> %s) %.1f us %.1fx;", p.src, p.dst, node_of(ranks, p.src).c_str(),
                  node_of(ranks, p.dst).c_str(), p.value_us, p.ratio);
    out += buf;
  }
  return out + "\n";
}

std::string format_op(const DiagnoseReport& r, int op) {
  const DiagnoseOp& o = r.ops[static_cast<std::size_t>(op)];
  const std::size_t P = o.calls.size();
  std::string out = std::string(to_string(static_cast<WaitOp>(op))) + ": ";
  out += o.verdict.clean() ? "nothing abnormal" : "ABNORMAL";
  out += " this interval; persistently (named in " + std::to_string(r.persist.need) + " of the last " +
         std::to_string(r.persist.of) + " intervals, " + std::to_string(r.window) +
         " so far): " + (o.persistent.clean() ? "nothing abnormal\n" : "ABNORMAL\n");
  out += format_verdict(o.verdict, r.ranks, "  ");
  out += "  persistent:\n" + format_verdict(o.persistent, r.ranks, "    ");
  char buf[64];
  out += "  wait per call, us: matrix[src][dst] (calls per dst:";
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
                "floor %g us, spread %g (robust deviations of the others above their median)\n",
                r.ranks.size(), static_cast<unsigned long long>(r.exchanges), r.seconds, r.thresholds.row, r.thresholds.col,
                r.thresholds.point, r.thresholds.floor_us, r.thresholds.spread);
  std::string out = head;
  if (!r.error.empty()) out += "  the background exchange ended: " + r.error + "\n";
  if (r.exchanges == 0) return out + "  no exchange yet\n";
  out += "persistently, both ops (a rank: a row or column of either op; a link: a point of both ops; named in " +
         std::to_string(r.persist.need) + " of the last " + std::to_string(r.persist.of) + " intervals, " +
         std::to_string(r.window) + " so far): " + (r.persistent.clean() ? "nothing abnormal\n" : "ABNORMAL\n");
  out += "  slow ranks: " + list(r.persistent.ranks, r.ranks) + "\n  slow links:";
  if (r.persistent.links.empty()) out += " none";
  char buf[160];
  for (const AbnormalPoint& p : r.persistent.links) {
    std::snprintf(buf, sizeof buf, " %d -> %d (%s -> %s) %.1f us %.1fx;", p.src, p.dst, node_of(r.ranks, p.src).c_str(),
                  node_of(r.ranks, p.dst).c_str(), p.value_us, p.ratio);
    out += buf;
  }
  out += "\n";
  for (int op = 0; op < kNumWaitOps; ++op) out += format_op(r, op);
  return out;
}

}  // namespace epx
