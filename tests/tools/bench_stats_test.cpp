// `epx bench`: the one definition of avg / nearest-rank percentiles (bench_stats.hpp).
#include "epx/bench/stats.hpp"

#include <gtest/gtest.h>

#include <vector>

using epx::tools::max_over;
using epx::tools::percentile;
using epx::tools::summarize;

TEST(BenchStats, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 20; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  EXPECT_EQ(percentile(v, 50), 10);   // ceil(0.5 * 20) = 10th smallest
  EXPECT_EQ(percentile(v, 95), 19);   // ceil(0.95 * 20) = 19th
  EXPECT_EQ(percentile(v, 100), 20);
  EXPECT_EQ(percentile(v, 1), 1);
  EXPECT_EQ(percentile({3, 1, 2}, 50), 2);   // ceil(1.5) = 2nd
  EXPECT_EQ(percentile({3, 1, 2}, 95), 3);
  EXPECT_EQ(percentile({1, 2, 3, 4}, 50), 2);  // nearest rank, not interpolated
  EXPECT_EQ(percentile({7}, 50), 7);
  EXPECT_EQ(percentile({}, 50), 0);
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(percentile(hundred, 95), 95);
  EXPECT_EQ(percentile(hundred, 50), 50);
}

TEST(BenchStats, Summary) {
  const auto s = summarize({4, 1, 3, 2});
  EXPECT_EQ(s.n, 4u);
  EXPECT_DOUBLE_EQ(s.avg, 2.5);
  EXPECT_EQ(s.p50, 2);
  EXPECT_EQ(s.p95, 4);
  EXPECT_EQ(s.max, 4);
  const auto e = summarize({});
  EXPECT_EQ(e.n, 0u);
  EXPECT_EQ(e.avg, 0);
}

TEST(BenchStats, MaxOverRanksPerIteration) {
  EXPECT_EQ(max_over({{1, 5, 3}, {2, 4, 6}, {0, 0, 7}}), (std::vector<double>{2, 5, 7}));
  EXPECT_EQ(max_over({{1, 5, 3}, {2}}), (std::vector<double>{2}));
  EXPECT_TRUE(max_over({}).empty());
}
