// The persistent verdict (epx::persistent_verdict): what the verdicts of at least `need` of the
// last `of` intervals name, each row, column and point counted on its own — against the rule
// written out plainly here (count every name over the window, keep those counted `need` times),
// on hand-made sequences and on random ones.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "epx/diagnose.hpp"
#include "epx/error.hpp"

namespace epx {
namespace {

MatrixVerdict verdict(std::vector<int> rows, std::vector<int> cols, std::vector<std::pair<int, int>> points = {},
                      double value = 100) {
  MatrixVerdict v;
  v.rows = std::move(rows);
  v.cols = std::move(cols);
  for (auto [s, d] : points) v.points.push_back({s, d, value, value / 10});
  return v;
}

std::vector<std::pair<int, int>> point_pairs(const MatrixVerdict& v) {
  std::vector<std::pair<int, int>> out;
  for (const AbnormalPoint& p : v.points) out.emplace_back(p.src, p.dst);
  return out;
}

// The rule, plainly: take the last `of` verdicts (all if fewer); a row is persistent when it is
// in the rows of at least `need` of them; the same for columns, and for points by (src, dst).
struct Plain {
  std::set<int> rows, cols;
  std::set<std::pair<int, int>> points;
};

Plain plain_rule(const std::vector<MatrixVerdict>& all, int of, int need) {
  std::map<int, int> rows, cols;
  std::map<std::pair<int, int>, int> points;
  const std::size_t first = all.size() > static_cast<std::size_t>(of) ? all.size() - static_cast<std::size_t>(of) : 0;
  for (std::size_t i = first; i < all.size(); ++i) {
    for (int r : all[i].rows) ++rows[r];
    for (int c : all[i].cols) ++cols[c];
    for (const AbnormalPoint& p : all[i].points) ++points[{p.src, p.dst}];
  }
  Plain out;
  for (auto [r, n] : rows)
    if (n >= need) out.rows.insert(r);
  for (auto [c, n] : cols)
    if (n >= need) out.cols.insert(c);
  for (auto [p, n] : points)
    if (n >= need) out.points.insert(p);
  return out;
}

TEST(DiagnosePersist, AFaultStaysASchedulerNameMoves) {
  // Rank 2 is a slow source in 4 of 5 intervals (a stopped rank); ranks 0, 5, 6 are each
  // named once (the scheduler left each behind for one interval); a point (3, 4) twice.
  const std::vector<MatrixVerdict> v = {verdict({2}, {}), verdict({0, 2}, {}, {{3, 4}}), verdict({}, {5}),
                                        verdict({2, 6}, {}, {{3, 4}}), verdict({2}, {})};
  const MatrixVerdict p = persistent_verdict(v, {5, 3});
  EXPECT_EQ(p.rows, std::vector<int>{2});
  EXPECT_TRUE(p.cols.empty());
  EXPECT_TRUE(p.points.empty());  // twice is not 3 of 5
  const MatrixVerdict two = persistent_verdict(v, {5, 2});
  EXPECT_EQ(two.rows, std::vector<int>{2});
  ASSERT_EQ(two.points.size(), 1u);
  EXPECT_EQ(two.points[0].src, 3);
  EXPECT_EQ(two.points[0].dst, 4);
  // Only the last `of` count: in the last 3 intervals rank 2 is a row twice (4 times in all 5).
  EXPECT_TRUE(persistent_verdict(v, {3, 3}).rows.empty());
  EXPECT_EQ(persistent_verdict(v, {3, 2}).rows, std::vector<int>{2});
  EXPECT_EQ(persistent_verdict(v, {2, 1}).rows, (std::vector<int>{2, 6}));
}

TEST(DiagnosePersist, KindsAreCountedApart) {
  // Rank 1 a row in one interval, a column in another and in a point in a third: no kind
  // reaches 2 of 3, and a point is not its row.
  const std::vector<MatrixVerdict> v = {verdict({1}, {}), verdict({}, {1}), verdict({}, {}, {{1, 3}})};
  EXPECT_TRUE(persistent_verdict(v, {3, 2}).clean());
  EXPECT_FALSE(persistent_verdict(v, {3, 1}).clean());
}

TEST(DiagnosePersist, PointKeepsTheLatestValue) {
  std::vector<MatrixVerdict> v = {verdict({}, {}, {{0, 1}}, 500), verdict({}, {}, {{0, 1}}, 900), verdict({}, {})};
  const MatrixVerdict p = persistent_verdict(v, {3, 2});
  ASSERT_EQ(p.points.size(), 1u);
  EXPECT_EQ(p.points[0].value_us, 900);
  EXPECT_EQ(p.points[0].ratio, 90);
}

TEST(DiagnosePersist, TooFewIntervalsNameNothing) {
  const std::vector<MatrixVerdict> v = {verdict({2}, {3}, {{0, 1}}), verdict({2}, {3}, {{0, 1}})};
  EXPECT_TRUE(persistent_verdict(v, {5, 3}).clean());
  EXPECT_TRUE(persistent_verdict({}, {5, 1}).clean());
  const MatrixVerdict p = persistent_verdict(v, {5, 2});
  EXPECT_EQ(p.rows, std::vector<int>{2});
  EXPECT_EQ(p.cols, std::vector<int>{3});
  EXPECT_EQ(point_pairs(p), (std::vector<std::pair<int, int>>{{0, 1}}));
}

TEST(DiagnosePersist, RefusesABadRule) {
  auto refused = [](DiagnosePersist rule) {
    try {
      persistent_verdict({}, rule);
    } catch (const Error& e) {
      return e.code() == ErrorCode::kInvalidArgument;
    }
    return false;
  };
  EXPECT_TRUE(refused({0, 0}));
  EXPECT_TRUE(refused({3, 0}));
  EXPECT_TRUE(refused({3, 4}));
  EXPECT_FALSE(refused({3, 3}));
}

// Random sequences of verdicts (each index at most once per list, as diagnose_matrix lists
// them) at several windows: the same names as the plain rule, in ascending order.
TEST(DiagnosePersist, MatchesThePlainRuleOnRandomSequences) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const int P = 2 + static_cast<int>(rng() % 7);
    const int of = 1 + static_cast<int>(rng() % 8);
    const int need = 1 + static_cast<int>(rng() % static_cast<unsigned>(of));
    std::vector<MatrixVerdict> all(rng() % 12);
    for (MatrixVerdict& v : all) {
      for (int r = 0; r < P; ++r) {
        if (rng() % 3 == 0) v.rows.push_back(r);
        if (rng() % 4 == 0) v.cols.push_back(r);
      }
      for (int s = 0; s < P; ++s)
        for (int d = 0; d < P; ++d)
          if (s != d && rng() % 6 == 0) v.points.push_back({s, d, static_cast<double>(rng() % 1000), 7});
    }
    const MatrixVerdict got = persistent_verdict(all, {of, need});
    const Plain want = plain_rule(all, of, need);
    EXPECT_EQ(got.rows, std::vector<int>(want.rows.begin(), want.rows.end())) << "trial " << trial;
    EXPECT_EQ(got.cols, std::vector<int>(want.cols.begin(), want.cols.end())) << "trial " << trial;
    const std::vector<std::pair<int, int>> want_points(want.points.begin(), want.points.end());
    EXPECT_EQ(point_pairs(got), want_points) << "trial " << trial;
  }
}

// The text report carries both verdicts.
TEST(DiagnosePersist, ReportPrintsBothVerdicts) {
  DiagnoseReport r;
  r.exchanges = 4;
  r.window = 4;
  r.persist = {5, 3};
  r.ranks = {{0, 10, "a"}, {1, 11, "a"}, {2, 12, "b"}};
  for (DiagnoseOp& o : r.ops) {
    o.matrix_us.assign(9, 1.0);
    o.calls.assign(3, 7);
  }
  r.ops[0].verdict = verdict({0}, {});
  r.ops[0].persistent = verdict({2}, {});
  const std::string text = format_report(r);
  EXPECT_NE(text.find("dispatch: ABNORMAL this interval; persistently (named in 3 of the last 5 intervals, 4 so far): ABNORMAL"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  slow sources (rows): 0 (a)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  persistent:\n    slow sources (rows): 2 (b)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("combine: nothing abnormal this interval; persistently (named in 3 of the last 5 intervals, 4 so far): nothing abnormal"),
            std::string::npos)
      << text;
}

// ---- the per-rank verdict (persistent_ranks): both ops, a rank's row or column, a link's pair ----

using Both = std::array<MatrixVerdict, kNumWaitOps>;

// The rule, plainly: over the last `of` intervals, a rank counts in an interval when some op
// names it as a row or a column; a pair {a, b} counts when every op names (a, b) or (b, a).
struct PlainRanks {
  std::set<int> ranks;
  std::set<std::pair<int, int>> pairs;
};

PlainRanks plain_ranks(const std::vector<Both>& all, int of, int need) {
  std::map<int, int> ranks;
  std::map<std::pair<int, int>, int> pairs;
  const std::size_t first = all.size() > static_cast<std::size_t>(of) ? all.size() - static_cast<std::size_t>(of) : 0;
  for (std::size_t i = first; i < all.size(); ++i) {
    std::set<int> named;
    std::array<std::set<std::pair<int, int>>, kNumWaitOps> op_pairs;
    for (std::size_t op = 0; op < all[i].size(); ++op) {
      named.insert(all[i][op].rows.begin(), all[i][op].rows.end());
      named.insert(all[i][op].cols.begin(), all[i][op].cols.end());
      for (const AbnormalPoint& p : all[i][op].points) op_pairs[op].insert({std::min(p.src, p.dst), std::max(p.src, p.dst)});
    }
    for (int r : named) ++ranks[r];
    for (const auto& pr : op_pairs[0])
      if (op_pairs[1].count(pr)) ++pairs[pr];
  }
  PlainRanks out;
  for (auto [r, n] : ranks)
    if (n >= need) out.ranks.insert(r);
  for (auto [pr, n] : pairs)
    if (n >= need) out.pairs.insert(pr);
  return out;
}

std::set<std::pair<int, int>> link_pairs(const RankVerdict& v) {
  std::set<std::pair<int, int>> out;
  for (const AbnormalPoint& p : v.links) out.insert({std::min(p.src, p.dst), std::max(p.src, p.dst)});
  return out;
}

TEST(DiagnosePersistRanks, ARanksEvidenceMovesBetweenOpsAndKinds) {
  // Measured (a rank stopped in bursts of 80 ms, 5 intervals): rank 2 a dispatch row, then a
  // combine row, then a dispatch column, then nothing, then a combine column. No kind of one
  // op reaches 3 of 5; the rank is named in 4 of 5.
  const std::vector<Both> v = {Both{verdict({2}, {}), verdict({}, {})}, Both{verdict({}, {}), verdict({2}, {})},
                               Both{verdict({}, {2}), verdict({5}, {})}, Both{verdict({}, {}), verdict({}, {})},
                               Both{verdict({}, {}), verdict({}, {2})}};
  for (int op = 0; op < kNumWaitOps; ++op) {
    std::vector<MatrixVerdict> one;
    for (const Both& b : v) one.push_back(b[static_cast<std::size_t>(op)]);
    EXPECT_TRUE(persistent_verdict(one, {5, 3}).clean()) << "op " << op;
  }
  const RankVerdict r = persistent_ranks(v, {5, 3});
  EXPECT_EQ(r.ranks, std::vector<int>{2});
  EXPECT_TRUE(r.links.empty());
  EXPECT_TRUE(persistent_ranks(v, {5, 5}).clean());  // 4 of 5
  EXPECT_EQ(persistent_ranks(v, {5, 4}).ranks, std::vector<int>{2});
}

TEST(DiagnosePersistRanks, ARankCountsOncePerInterval) {
  // Rank 1 a row and a column of both ops in each of two intervals: two intervals, not eight.
  const Both all_of_it{verdict({1}, {1}), verdict({1}, {1})};
  const std::vector<Both> v = {all_of_it, all_of_it, Both{}};
  EXPECT_TRUE(persistent_ranks(v, {3, 3}).clean());
  EXPECT_EQ(persistent_ranks(v, {3, 2}).ranks, std::vector<int>{1});
}

TEST(DiagnosePersistRanks, ALinkIsAPairThatBothOpsName) {
  // (0, 1) in dispatch and (1, 0) in combine: the link {0, 1}, in 3 intervals. (6, 5) in
  // combine alone (a source that serves that destination last), every interval: no link. A
  // point is no evidence against its ranks.
  std::vector<Both> v;
  for (int i = 0; i < 4; ++i)
    v.push_back(Both{verdict({}, {}, i == 2 ? std::vector<std::pair<int, int>>{} : std::vector<std::pair<int, int>>{{0, 1}},
                             100.0 + i),
                     verdict({}, {}, {{1, 0}, {6, 5}}, 200.0 + i)});
  const RankVerdict r = persistent_ranks(v, {4, 3});
  EXPECT_TRUE(r.ranks.empty());
  ASSERT_EQ(r.links.size(), 1u);
  // The latest counting interval's largest point of the pair: combine's (1, 0) of interval 3.
  EXPECT_EQ(r.links[0].src, 1);
  EXPECT_EQ(r.links[0].dst, 0);
  EXPECT_EQ(r.links[0].value_us, 203.0);
  EXPECT_TRUE(persistent_ranks(v, {4, 4}).clean());
}

TEST(DiagnosePersistRanks, WindowAndBadRules) {
  const std::vector<Both> v = {Both{verdict({3}, {})}, Both{verdict({3}, {})}, Both{}, Both{}};
  EXPECT_EQ(persistent_ranks(v, {4, 2}).ranks, std::vector<int>{3});
  EXPECT_TRUE(persistent_ranks(v, {3, 2}).clean());  // only the last 3 count
  EXPECT_TRUE(persistent_ranks({}, {5, 1}).clean());
  for (DiagnosePersist bad : {DiagnosePersist{0, 0}, DiagnosePersist{3, 0}, DiagnosePersist{3, 4}}) {
    try {
      persistent_ranks(v, bad);
      ADD_FAILURE() << "accepted need " << bad.need << " of " << bad.of;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(DiagnosePersistRanks, MatchesThePlainRuleOnRandomSequences) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 400; ++trial) {
    const int P = 2 + static_cast<int>(rng() % 7);
    const int of = 1 + static_cast<int>(rng() % 8);
    const int need = 1 + static_cast<int>(rng() % static_cast<unsigned>(of));
    std::vector<Both> all(rng() % 12);
    for (Both& b : all)
      for (MatrixVerdict& v : b) {
        for (int r = 0; r < P; ++r) {
          if (rng() % 5 == 0) v.rows.push_back(r);
          if (rng() % 6 == 0) v.cols.push_back(r);
        }
        for (int s = 0; s < P; ++s)
          for (int d = 0; d < P; ++d)
            if (s != d && rng() % 4 == 0) v.points.push_back({s, d, static_cast<double>(rng() % 1000), 7});
      }
    const RankVerdict got = persistent_ranks(all, {of, need});
    const PlainRanks want = plain_ranks(all, of, need);
    EXPECT_EQ(got.ranks, std::vector<int>(want.ranks.begin(), want.ranks.end())) << "trial " << trial;
    EXPECT_EQ(link_pairs(got), want.pairs) << "trial " << trial;
    EXPECT_EQ(got.links.size(), want.pairs.size()) << "trial " << trial;  // one per pair
  }
}

TEST(DiagnosePersistRanks, ReportPrintsIt) {
  DiagnoseReport r;
  r.exchanges = 5;
  r.window = 5;
  r.persist = {5, 3};
  r.ranks = {{0, 10, "a"}, {1, 11, "a"}, {2, 12, "b"}};
  for (DiagnoseOp& o : r.ops) {
    o.matrix_us.assign(9, 1.0);
    o.calls.assign(3, 7);
  }
  r.persistent.ranks = {2};
  r.persistent.links = {{0, 1, 812.5, 9.5}};
  const std::string text = format_report(r);
  EXPECT_NE(text.find("named in 3 of the last 5 intervals, 5 so far): ABNORMAL\n  slow ranks: 2 (b)\n"
                      "  slow links: 0 -> 1 (a -> a) 812.5 us 9.5x;\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace epx
