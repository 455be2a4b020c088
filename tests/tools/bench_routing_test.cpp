// `epx bench`: the payload count and the generated routings (epx/bench/routing.hpp),
// checked against a brute-force count written here.
#include "epx/bench/routing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

using epx::tools::BenchOptions;
using epx::tools::BenchProblem;
using epx::tools::count_routes;
using epx::tools::make_problem;
using epx::tools::RouteCount;

namespace {

struct Brute {
  std::vector<std::int64_t> sent, sent_local, recv, recv_local, slots, expert, out_rows;
  std::vector<std::int64_t> pair;  // [s * P + d]
  std::vector<std::int64_t> slots_sent, slots_local, pair_slots;  // (t, k) slots: by source, to itself, [s * P + d]
  std::vector<std::vector<std::int64_t>> hist;
};

// For every (source, token, destination): does any valid slot of the token live there?
Brute brute_force(int P, int E, int K, const std::vector<std::vector<std::int64_t>>& idx, bool expanded, int A) {
  const int L = E / P;
  Brute b;
  b.sent.assign(P, 0), b.sent_local.assign(P, 0), b.recv.assign(P, 0), b.recv_local.assign(P, 0);
  b.slots.assign(P, 0), b.expert.assign(E, 0), b.out_rows.assign(P, 0), b.pair.assign(P * P, 0);
  b.hist.assign(P, std::vector<std::int64_t>(std::min(K, P) + 1, 0));
  b.slots_sent.assign(P, 0), b.slots_local.assign(P, 0), b.pair_slots.assign(P * P, 0);
  for (int s = 0; s < P; ++s) {
    const std::int64_t S = static_cast<std::int64_t>(idx[s].size()) / K;
    for (std::int64_t t = 0; t < S; ++t) {
      int n = 0;
      for (int d = 0; d < P; ++d) {
        bool there = false;
        for (int k = 0; k < K; ++k) {
          const std::int64_t e = idx[s][t * K + k];
          if (e >= 0 && e / L == d) there = true;
        }
        if (!there) continue;
        ++n;
        ++b.sent[s];
        ++b.recv[d];
        ++b.pair[s * P + d];
        if (d == s) ++b.sent_local[s], ++b.recv_local[d];
      }
      ++b.hist[s][n];
      for (int k = 0; k < K; ++k) {
        const std::int64_t e = idx[s][t * K + k];
        if (e < 0) continue;
        ++b.expert[e], ++b.slots[e / L], ++b.slots_sent[s], ++b.pair_slots[s * P + e / L];
        if (e / L == s) ++b.slots_local[s];
      }
    }
  }
  for (int d = 0; d < P; ++d) {
    if (!expanded) {
      b.out_rows[d] = b.recv[d];
      continue;
    }
    for (int j = 0; j < L; ++j) b.out_rows[d] += (b.expert[d * L + j] + A - 1) / A * A;
  }
  return b;
}

RouteCount count(int P, int E, int K, const std::vector<std::vector<std::int64_t>>& idx, std::size_t xrow, std::size_t yrow,
                 bool expanded, int A) {
  std::vector<const std::int64_t*> ptr;
  std::vector<std::int64_t> tokens;
  for (const auto& v : idx) {
    ptr.push_back(v.data());
    tokens.push_back(static_cast<std::int64_t>(v.size()) / K);
  }
  return count_routes(P, E, K, ptr, tokens, xrow, yrow, expanded, A);
}

void expect_matches(const RouteCount& c, const Brute& b, std::size_t xrow, std::size_t yrow, bool expanded) {
  const int P = c.ranks;
  for (int r = 0; r < P; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(c.sent_rows[r], b.sent[r]);
    EXPECT_EQ(c.sent_local_rows[r], b.sent_local[r]);
    EXPECT_EQ(c.recv_rows[r], b.recv[r]);
    EXPECT_EQ(c.recv_local_rows[r], b.recv_local[r]);
    EXPECT_EQ(c.recv_slots[r], b.slots[r]);
    EXPECT_EQ(c.out_rows[r], b.out_rows[r]);
    EXPECT_EQ(c.unique_dest_hist[r], b.hist[r]);
    EXPECT_EQ(c.dispatch_bytes(r), b.sent[r] * static_cast<std::int64_t>(xrow));
    EXPECT_EQ(c.dispatch_local_bytes(r), b.sent_local[r] * static_cast<std::int64_t>(xrow));
    EXPECT_EQ(c.combine_bytes(r), b.recv[r] * static_cast<std::int64_t>(yrow));
    EXPECT_EQ(c.combine_local_bytes(r), b.recv_local[r] * static_cast<std::int64_t>(yrow));
    EXPECT_EQ(c.sent_slots[r], b.slots_sent[r]);
    EXPECT_EQ(c.recv_local_slots[r], b.slots_local[r]);
    // The layout's rows: the payload when compact, a row per slot when expanded.
    EXPECT_EQ(c.moved_dispatch_bytes(r), (expanded ? b.slots_sent[r] : b.sent[r]) * static_cast<std::int64_t>(xrow));
    EXPECT_EQ(c.moved_combine_bytes(r), (expanded ? b.slots[r] : b.recv[r]) * static_cast<std::int64_t>(yrow));
  }
  EXPECT_EQ(c.expert_rows, b.expert);
  EXPECT_EQ(c.pair_rows, b.pair);
  EXPECT_EQ(c.pair_slots, b.pair_slots);
}

}  // namespace

TEST(BenchRouting, PayloadMatchesBruteForceOnHandWrittenRouting) {
  // P = 3, E = 6 (L = 2), K = 3; masked slots, two experts of one token on one rank, an
  // empty rank and a token with no valid slot.
  const int P = 3, E = 6, K = 3;
  const std::vector<std::vector<std::int64_t>> idx = {
      {0, 1, 2,    /* ranks 0, 0, 1 -> 2 destinations */
       5, -1, 4,   /* rank 2 twice -> 1 */
       -1, -1, -1, /* none */
       3, 0, 5},   /* ranks 1, 0, 2 -> 3 */
      {},
      {1, -1, 2, 4, 5, 3}};
  const std::size_t xrow = 7168 * 2, yrow = 7168 * 2;
  for (const bool expanded : {false, true})
    for (const int A : {1, 4}) {
      const RouteCount c = count(P, E, K, idx, xrow, yrow, expanded, A);
      expect_matches(c, brute_force(P, E, K, idx, expanded, A), xrow, yrow, expanded);
    }
  const RouteCount c = count(P, E, K, idx, xrow, yrow, false, 1);
  // Spelled out for rank 0: 2 + 1 + 0 + 3 = 6 rows, 2 of them to itself (tokens 0 and 3).
  EXPECT_EQ(c.sent_rows[0], 6);
  EXPECT_EQ(c.sent_local_rows[0], 2);
  EXPECT_EQ(c.dispatch_bytes(0), 6 * 14336);
  EXPECT_EQ(c.unique_dest_hist[0], (std::vector<std::int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(c.sent_rows[1], 0);
  // Rank 0's 6 rows by destination: 2 to itself, 2 to rank 1 (tokens 0, 3), 2 to rank 2 (tokens 1, 3).
  EXPECT_EQ(std::vector<std::int64_t>(c.pair_rows.begin(), c.pair_rows.begin() + 3), (std::vector<std::int64_t>{2, 2, 2}));
  // Its 8 valid slots: 3 at itself (experts 0, 1, 0), 2 at rank 1 (experts 2, 3), 3 at rank 2 (5, 4, 5).
  EXPECT_EQ(c.sent_slots[0], 8);
  EXPECT_EQ(std::vector<std::int64_t>(c.pair_slots.begin(), c.pair_slots.begin() + 3), (std::vector<std::int64_t>{3, 2, 3}));
  const RouteCount x = count(P, E, K, idx, xrow, yrow, true, 1);
  EXPECT_EQ(x.moved_dispatch_bytes(0), 8 * 14336);  // expanded: a row per slot
  EXPECT_EQ(x.dispatch_bytes(0), 6 * 14336);        // the payload stays per (token, rank)
}

TEST(BenchRouting, PayloadMatchesBruteForceOnGeneratedRoutings) {
  for (const double skew : {0.0, 1.5}) {
    BenchOptions o;
    o.ranks = 4, o.experts = 16, o.topk = 5, o.hidden = 256, o.tokens = 37, o.skew = skew, o.seed = 7;
    for (const bool fp8 : {false, true}) {
      o.fp8 = fp8;
      const BenchProblem p = make_problem(o);
      ASSERT_EQ(p.ranks, 4);
      std::vector<std::vector<std::int64_t>> idx;
      for (const auto& r : p.rank) idx.push_back(r.topk_idx);
      const std::size_t xrow = fp8 ? 256 + 2 * 4 : 512;
      EXPECT_EQ(p.x_row_bytes(), xrow);
      const RouteCount c = count_routes(p, true, 8);
      expect_matches(c, brute_force(4, 16, 5, idx, true, 8), xrow, 512, true);
    }
  }
}

TEST(BenchRouting, GeneratedRoutingIsValidDeterministicAndSkewed) {
  BenchOptions o;
  o.ranks = 4, o.experts = 32, o.topk = 4, o.hidden = 128, o.tokens = 400, o.seed = 3;
  const BenchProblem a = make_problem(o), b = make_problem(o);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(a.rank[r].topk_idx, b.rank[r].topk_idx);
    ASSERT_EQ(a.rank[r].x.nbytes(), 400u * 128 * 2);
    for (std::int64_t t = 0; t < 400; ++t) {
      std::set<std::int64_t> seen;
      float w = 0;
      for (int k = 0; k < 4; ++k) {
        const std::int64_t e = a.rank[r].topk_idx[t * 4 + k];
        EXPECT_TRUE(e >= 0 && e < 32);
        seen.insert(e);
        w += a.rank[r].topk_weights[t * 4 + k];
      }
      EXPECT_EQ(seen.size(), 4u) << "an expert twice in token " << t;
      EXPECT_NEAR(w, 1.0f, 1e-5);
    }
  }
  o.skew = 1.2;
  const RouteCount skewed = count_routes(make_problem(o), false, 1);
  EXPECT_GT(skewed.expert_rows[0], 3 * skewed.expert_rows[31]);
  EXPECT_GT(skewed.recv_rows[0], skewed.recv_rows[3]);
}

namespace {

// DeepSeek-V3's group-limited top-k written directly: every group's experts sorted by score,
// the group's score the first two summed; the groups sorted by score; the kept groups'
// experts sorted by score; the first K. Ties: lower index first, in both sorts.
std::vector<std::int64_t> grouped_reference(const std::vector<double>& s, int G, int T, int K) {
  const int E = static_cast<int>(s.size()), n = E / G;
  auto by_score = [&](std::vector<std::pair<double, int>> v) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    return v;
  };
  std::vector<std::pair<double, int>> groups;
  for (int g = 0; g < G; ++g) {
    std::vector<std::pair<double, int>> members;
    for (int e = g * n; e < (g + 1) * n; ++e) members.emplace_back(s[e], e);
    members = by_score(members);
    groups.emplace_back(n > 1 ? members[0].first + members[1].first : members[0].first, g);
  }
  groups = by_score(groups);
  std::vector<std::pair<double, int>> kept;
  for (int i = 0; i < T; ++i)
    for (int e = groups[i].second * n; e < (groups[i].second + 1) * n; ++e) kept.emplace_back(s[e], e);
  kept = by_score(kept);
  std::vector<std::int64_t> out;
  for (int k = 0; k < K; ++k) out.push_back(kept[k].second);
  return out;
}

}  // namespace

TEST(BenchRouting, GroupLimitedTopkMatchesTheDirectReference) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  for (const auto& [E, G, T, K] : std::vector<std::array<int, 4>>{{256, 8, 4, 8}, {64, 8, 2, 6}, {16, 16, 3, 3}, {32, 4, 4, 7}}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<double> s(E);
      for (double& v : s) v = trial % 4 == 0 ? std::floor(u(rng) * 4) / 4 : u(rng);  // every 4th: many ties
      std::vector<std::int64_t> got(K);
      epx::tools::group_limited_topk(s.data(), E, G, T, K, got.data());
      ASSERT_EQ(got, grouped_reference(s, G, T, K)) << "E " << E << " G " << G << " T " << T << " K " << K << " trial " << trial;
    }
  }
}

// The generator with --groups 8 --topk-groups 4 (DeepSeek-V3's shape): K distinct experts
// from at most 4 groups per token, every group about equally often (uniform scores), the
// same problem for the same seed; at EP64 (a group = a node of 8 ranks) a token reaches at
// most 4 nodes. Bad group options are refused naming the flag.
TEST(BenchRouting, GroupLimitedGenerationKeepsTokensInTheirBestGroups) {
  BenchOptions o;
  o.ranks = 64, o.experts = 256, o.topk = 8, o.hidden = 128, o.tokens = 300, o.seed = 5, o.groups = 8, o.topk_groups = 4;
  const BenchProblem a = make_problem(o), b = make_problem(o);
  EXPECT_NE(a.source.find("group-limited"), std::string::npos) << a.source;
  std::vector<std::int64_t> group_tokens(8, 0);
  std::int64_t tokens = 0;
  for (int r = 0; r < 64; ++r) {
    ASSERT_EQ(a.rank[r].topk_idx, b.rank[r].topk_idx);
    for (std::int64_t t = 0; t < 300; ++t, ++tokens) {
      std::set<std::int64_t> experts, groups, nodes;
      for (int k = 0; k < 8; ++k) {
        const std::int64_t e = a.rank[r].topk_idx[t * 8 + k];
        ASSERT_TRUE(e >= 0 && e < 256);
        experts.insert(e), groups.insert(e / 32), nodes.insert(e / 4 / 8);
      }
      EXPECT_EQ(experts.size(), 8u);
      EXPECT_LE(groups.size(), 4u);
      EXPECT_LE(nodes.size(), 4u);
      for (std::int64_t g : groups) ++group_tokens[g];
    }
  }
  // Every group equally often (symmetric scores): a group is kept with probability 1/2 and
  // then usually holds one of the 8 experts; each frequency within 0.03 (~8 sigma) of the mean.
  double mean = 0;
  for (int g = 0; g < 8; ++g) mean += static_cast<double>(group_tokens[g]) / tokens / 8;
  EXPECT_GT(mean, 0.35);
  EXPECT_LE(mean, 0.5);
  for (int g = 0; g < 8; ++g) EXPECT_NEAR(static_cast<double>(group_tokens[g]) / tokens, mean, 0.03) << "group " << g;
  o.seed = 6;
  EXPECT_NE(make_problem(o).rank[0].topk_idx, a.rank[0].topk_idx);
  const auto refused = [](int G, int T, int K, double skew) {
    try {
      epx::tools::check_group_limit(G, T, 256, K, skew);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refused(0, 0, 8, 0), "");
  EXPECT_EQ(refused(8, 4, 8, 0), "");
  EXPECT_NE(refused(7, 4, 8, 0).find("--groups"), std::string::npos);
  EXPECT_NE(refused(8, 9, 8, 0).find("--topk-groups"), std::string::npos);
  EXPECT_NE(refused(8, 0, 8, 0).find("--topk-groups"), std::string::npos);
  EXPECT_NE(refused(64, 1, 8, 0).find("--topk 8"), std::string::npos);
  EXPECT_NE(refused(8, 4, 8, 1.0).find("--skew"), std::string::npos);
}
