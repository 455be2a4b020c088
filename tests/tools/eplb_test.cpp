// Unit tests of the EPLB planner (epx/eplb.hpp) and the `epx eplb` subcommand.
#include "epx/eplb.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "epx/error.hpp"
#include "epx/io/npy.hpp"

namespace fs = std::filesystem;
using epx::EplbPlan;
using epx::ErrorCode;
using epx::rebalance_experts;
using I64 = std::vector<std::int64_t>;

namespace {

const std::vector<float> kPublishedWeight = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                                             20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
const I64 kPublishedPhy2log = {5, 6,  5, 7, 8, 4,  3, 4, 10, 9, 10, 2, 0, 1, 11, 1,
                               7, 10, 6, 8, 6, 11, 8, 9, 2,  4, 5,  1, 5, 0, 3,  1};

std::size_t u(std::int64_t v) {
  return static_cast<std::size_t>(v);
}

// log2phy / logcnt / max_replicas agree with phy2log; every expert has >= 1 replica; counts sum to num_replicas.
void expect_consistent(const EplbPlan& p) {
  const auto L = u(p.layers), E = u(p.logical_experts), R = u(p.num_replicas), M = u(p.max_replicas);
  ASSERT_EQ(p.phy2log.size(), L * R);
  ASSERT_EQ(p.logcnt.size(), L * E);
  ASSERT_EQ(p.log2phy.size(), L * E * M);
  EXPECT_EQ(p.max_replicas, *std::max_element(p.logcnt.begin(), p.logcnt.end()));
  for (std::size_t l = 0; l < L; ++l) {
    std::vector<std::int64_t> count(E, 0);
    for (std::size_t s = 0; s < R; ++s) {
      const auto e = p.phy2log[l * R + s];
      ASSERT_GE(e, 0);
      ASSERT_LT(u(e), E);
      ++count[u(e)];
    }
    std::int64_t total = 0;
    std::set<std::int64_t> seen;
    for (std::size_t e = 0; e < E; ++e) {
      const auto cnt = p.logcnt[l * E + e];
      EXPECT_GE(cnt, 1) << "layer " << l << " expert " << e;
      EXPECT_EQ(cnt, count[e]) << "layer " << l << " expert " << e;
      total += cnt;
      for (std::size_t r = 0; r < M; ++r) {
        const auto phy = p.log2phy[(l * E + e) * M + r];
        if (static_cast<std::int64_t>(r) < cnt) {
          ASSERT_GE(phy, 0);
          ASSERT_LT(u(phy), R);
          EXPECT_EQ(p.phy2log[l * R + u(phy)], static_cast<std::int64_t>(e));
          EXPECT_TRUE(seen.insert(phy).second) << "slot " << phy << " listed twice";
        } else {
          EXPECT_EQ(phy, -1);
        }
      }
    }
    EXPECT_EQ(total, p.num_replicas);
    EXPECT_EQ(seen.size(), R);
  }
}

template <typename Fn>
void expect_invalid(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const epx::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "expected '" << needle << "' in: " << e.what();
  }
}

TEST(Eplb, PublishedVector) {
  const EplbPlan p = rebalance_experts(kPublishedWeight, 2, 12, 16, 4, 2, 8);
  EXPECT_TRUE(p.hierarchical);
  EXPECT_EQ(p.layers, 2);
  EXPECT_EQ(p.logical_experts, 12);
  EXPECT_EQ(p.num_replicas, 16);
  EXPECT_EQ(p.phy2log, kPublishedPhy2log);
  EXPECT_EQ(p.max_replicas, 2);
  EXPECT_EQ(p.logcnt, (I64{1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1, 1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1}));
  // log2phy lists replicas in replica-rank order (the original slot first), as eplb.py's scatter does.
  EXPECT_EQ(p.log2phy, (I64{12, -1, 15, 13, 11, -1, 6,  -1, 7, 5,  0,  2,  1, -1, 3, -1, 4, -1, 9, -1, 8, 10, 14, -1,
                            13, -1, 15, 11, 8,  -1, 14, -1, 9, -1, 10, 12, 2, 4,  0, -1, 6, 3,  7, -1, 1, -1, 5,  -1}));
  expect_consistent(p);
}

TEST(Eplb, HandComputedGlobalPolicy) {
  // replicate: 0 gets two extra slots (10 -> 5 -> 3.33); phy weights [3.33 1 4 3 3.33 3.33];
  // packing (desc, stable): 2->g0, 0->g1, 4->g1, 5->g0, 3->g1 (full), 1->g0.
  const EplbPlan p = rebalance_experts({10, 1, 4, 3}, 1, 4, 6, 1, 1, 2);
  EXPECT_TRUE(p.hierarchical);  // 1 group on 1 node is the global policy by another name
  EXPECT_EQ(p.phy2log, (I64{2, 0, 1, 0, 0, 3}));
  EXPECT_EQ(p.logcnt, (I64{3, 1, 1, 1}));
  EXPECT_EQ(p.max_replicas, 3);
  EXPECT_EQ(p.log2phy, (I64{3, 4, 1, 2, -1, -1, 0, -1, -1, 5, -1, -1}));
  const auto after = epx::eplb_gpu_load(p, {10, 1, 4, 3}, 2);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_NEAR(after[0], 4 + 10.0 / 3 + 1, 1e-5);
  EXPECT_NEAR(after[1], 10.0 / 3 * 2 + 3, 1e-5);
  const auto before = epx::eplb_gpu_load_without_replicas({10, 1, 4, 3}, 1, 4, 2);
  EXPECT_EQ(before, (std::vector<double>{11, 7}));
  const auto ratio = epx::eplb_max_over_avg(before, 1, 2);
  EXPECT_DOUBLE_EQ(ratio[0], 11.0 / 9.0);
}

TEST(Eplb, TiesAreBrokenByIndex) {
  // All equal: replicas go to experts 0,1,2,3 in turn; stable packing pairs slot i with slot i+4.
  const EplbPlan p = rebalance_experts(std::vector<float>(4, 1.0f), 1, 4, 8, 1, 1, 4);
  EXPECT_EQ(p.phy2log, (I64{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(p.log2phy, (I64{0, 1, 2, 3, 4, 5, 6, 7}));
  // All zero weights are allowed too.
  const EplbPlan z = rebalance_experts(std::vector<float>(6, 0.0f), 1, 6, 8, 2, 2, 4);
  expect_consistent(z);
}

TEST(Eplb, GlobalPolicyWhenGroupsNotDivisibleByNodes) {
  // 4 groups on 3 nodes: global policy, identical to one group on one node.
  const EplbPlan g = rebalance_experts(kPublishedWeight, 2, 12, 18, 4, 3, 6);
  EXPECT_FALSE(g.hierarchical);
  const EplbPlan one = rebalance_experts(kPublishedWeight, 2, 12, 18, 1, 1, 6);
  EXPECT_EQ(g.phy2log, one.phy2log);
  EXPECT_EQ(g.log2phy, one.log2phy);
  EXPECT_EQ(g.logcnt, one.logcnt);
  expect_consistent(g);
  // In the global policy num_groups need not divide the experts.
  const EplbPlan h = rebalance_experts(kPublishedWeight, 2, 12, 16, 5, 2, 8);
  EXPECT_FALSE(h.hierarchical);
  expect_consistent(h);
  EXPECT_EQ(h.phy2log, rebalance_experts(kPublishedWeight, 2, 12, 16, 1, 1, 8).phy2log);
}

TEST(Eplb, HierarchicalKeepsGroupsOnOneNode) {
  std::mt19937 rng(1234);
  struct Cfg {
    int E, R, G, N, gpus;
  };
  const std::vector<Cfg> cfgs = {{12, 16, 4, 2, 8},   {16, 24, 8, 4, 8}, {8, 8, 2, 2, 4}, {6, 12, 3, 1, 3},
                                 {20, 30, 10, 5, 10}, {24, 48, 6, 3, 6}, {4, 4, 4, 4, 4}};
  for (const auto& c : cfgs) {
    for (int trial = 0; trial < 5; ++trial) {
      const int layers = 3;
      std::vector<float> w(static_cast<std::size_t>(layers * c.E));
      std::uniform_int_distribution<int> d(0, 200);
      for (auto& x : w) x = static_cast<float>(d(rng));
      const EplbPlan p = rebalance_experts(w, layers, c.E, c.R, c.G, c.N, c.gpus);
      ASSERT_TRUE(p.hierarchical);
      expect_consistent(p);
      const int group_size = c.E / c.G, slots_per_node = c.R / c.N;
      for (int l = 0; l < layers; ++l) {
        std::map<int, std::set<int>> nodes_of_group;
        std::map<int, std::set<int>> groups_of_node;
        for (int s = 0; s < c.R; ++s) {
          const int e = static_cast<int>(p.phy2log[u(l * c.R + s)]);
          nodes_of_group[e / group_size].insert(s / slots_per_node);
          groups_of_node[s / slots_per_node].insert(e / group_size);
        }
        for (const auto& [g, nodes] : nodes_of_group) EXPECT_EQ(nodes.size(), 1u) << "group " << g;
        for (const auto& [n, groups] : groups_of_node) EXPECT_EQ(groups.size(), u(c.G / c.N)) << "node " << n;
      }
      // Loads conserve the total weight.
      const auto after = epx::eplb_gpu_load(p, w, c.gpus);
      const auto before = epx::eplb_gpu_load_without_replicas(w, layers, c.E, c.gpus);
      for (int l = 0; l < layers; ++l) {
        double total = 0, sa = 0, sb = 0;
        for (int e = 0; e < c.E; ++e) total += w[u(l * c.E + e)];
        for (int g = 0; g < c.gpus; ++g) {
          sa += after[u(l * c.gpus + g)];
          sb += before[u(l * c.gpus + g)];
        }
        EXPECT_NEAR(sa, total, 1e-6 * (1 + total));
        EXPECT_DOUBLE_EQ(sb, total);
      }
    }
  }
}

TEST(Eplb, LoadWithoutReplicasSplitsInOrder) {
  std::vector<float> w(12);
  for (int i = 0; i < 12; ++i) w[u(i)] = static_cast<float>(1 << i);
  // 12 experts on 8 GPUs: boundaries floor(g*12/8) = 0 1 3 4 6 7 9 10 12.
  const auto load = epx::eplb_gpu_load_without_replicas(w, 1, 12, 8);
  EXPECT_EQ(load, (std::vector<double>{1, 2 + 4, 8, 16 + 32, 64, 128 + 256, 512, 1024 + 2048}));
  // More GPUs than experts: some GPUs are empty.
  const auto sparse = epx::eplb_gpu_load_without_replicas({5, 7}, 1, 2, 4);
  EXPECT_EQ(sparse, (std::vector<double>{0, 5, 0, 7}));
  EXPECT_DOUBLE_EQ(epx::eplb_max_over_avg(sparse, 1, 4)[0], 7.0 / 3.0);
  EXPECT_DOUBLE_EQ(epx::eplb_max_over_avg({0, 0}, 1, 2)[0], 1.0);
}

TEST(Eplb, InvalidParameters) {
  const auto& w = kPublishedWeight;
  expect_invalid([&] { rebalance_experts(w, 0, 12, 16, 4, 2, 8); }, "layers must be positive");
  expect_invalid([&] { rebalance_experts(w, 2, 0, 16, 4, 2, 8); }, "logical_experts must be positive");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 0, 4, 2, 8); }, "num_replicas must be positive");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 16, 0, 2, 8); }, "num_groups must be positive");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 16, 4, -1, 8); }, "num_nodes must be positive");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 16, 4, 2, 0); }, "num_gpus must be positive");
  expect_invalid([&] { rebalance_experts(w, 3, 12, 16, 4, 2, 8); }, "weight has 24 values");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 20, 4, 2, 8); }, "not a multiple of num_gpus");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 12, 4, 4, 6); }, "num_gpus = 6 is not a multiple of num_nodes = 4");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 8, 4, 2, 8); }, "less than logical_experts");
  expect_invalid([&] { rebalance_experts(w, 2, 12, 16, 8, 2, 8); }, "not divisible by num_groups");
  auto bad = w;
  bad[13] = -1.0f;
  expect_invalid([&] { rebalance_experts(bad, 2, 12, 16, 4, 2, 8); }, "weight[1][1]");
  bad[13] = std::numeric_limits<float>::quiet_NaN();
  expect_invalid([&] { rebalance_experts(bad, 2, 12, 16, 4, 2, 8); }, "NaN");
  bad[13] = std::numeric_limits<float>::infinity();
  expect_invalid([&] { rebalance_experts(bad, 2, 12, 16, 4, 2, 8); }, "finite and non-negative");
  expect_invalid([&] { epx::eplb_gpu_load(rebalance_experts(w, 2, 12, 16, 4, 2, 8), w, 3); }, "not a multiple");
}

// Independent naive re-statement of balanced packing: repeatedly take the heaviest unassigned item
// (lowest index on ties) and give it to the lightest pack with room (lowest index on ties).
void naive_packing(const std::vector<float>& w, int packs, std::vector<std::int64_t>& pack,
                   std::vector<std::int64_t>& rank) {
  const int n = static_cast<int>(w.size()), per = n / packs;
  pack.assign(u(n), -1);
  rank.assign(u(n), -1);
  if (per == 1) {
    for (int i = 0; i < n; ++i) pack[u(i)] = i, rank[u(i)] = 0;
    return;
  }
  std::vector<float> load(u(packs), 0.0f);
  std::vector<int> items(u(packs), 0);
  std::vector<bool> done(u(n), false);
  for (int step = 0; step < n; ++step) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (!done[u(i)] && (best < 0 || w[u(i)] > w[u(best)])) best = i;
    }
    int target = -1;
    for (int p = 0; p < packs; ++p) {
      if (items[u(p)] < per && (target < 0 || load[u(p)] < load[u(target)])) target = p;
    }
    done[u(best)] = true;
    pack[u(best)] = target;
    rank[u(best)] = items[u(target)]++;
    load[u(target)] += w[u(best)];
  }
}

TEST(Eplb, BalancedPackingBruteForce) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    const int packs = std::uniform_int_distribution<int>(1, 5)(rng);
    const int per = std::uniform_int_distribution<int>(1, 5)(rng);
    const int n = packs * per, rows = 2;
    std::vector<float> w(u(rows * n));
    // Small integer weights make ties common.
    std::uniform_int_distribution<int> d(0, trial % 2 ? 4 : 1000);
    for (auto& x : w) x = static_cast<float>(d(rng)) * (trial % 3 ? 1.0f : 0.37f);
    std::vector<std::int64_t> pack, rank;
    epx::eplb_detail::balanced_packing(w, rows, n, packs, pack, rank);
    for (int r = 0; r < rows; ++r) {
      std::vector<std::set<std::int64_t>> ranks(u(packs));
      for (int i = 0; i < n; ++i) {
        const auto pk = pack[u(r * n + i)];
        ASSERT_GE(pk, 0);
        ASSERT_LT(pk, packs);
        EXPECT_TRUE(ranks[u(pk)].insert(rank[u(r * n + i)]).second);
      }
      for (int p = 0; p < packs; ++p) {
        EXPECT_EQ(ranks[u(p)].size(), u(per)) << "pack " << p << " of trial " << trial;  // exactly n/m items
        if (!ranks[u(p)].empty()) {
          EXPECT_EQ(*ranks[u(p)].begin(), 0);
          EXPECT_EQ(*ranks[u(p)].rbegin(), per - 1);
        }
      }
      std::vector<float> row(w.begin() + r * n, w.begin() + (r + 1) * n);
      std::vector<std::int64_t> npack, nrank;
      naive_packing(row, packs, npack, nrank);
      EXPECT_EQ(std::vector<std::int64_t>(pack.begin() + r * n, pack.begin() + (r + 1) * n), npack)
          << "trial " << trial;
      EXPECT_EQ(std::vector<std::int64_t>(rank.begin() + r * n, rank.begin() + (r + 1) * n), nrank)
          << "trial " << trial;
    }
  }
}

TEST(Eplb, ReplicationIsOptimalBruteForce) {
  // Greedy "extra slot to the highest weight/count" minimises max weight/count: compare with all count vectors.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 4)(rng);
    const int phy = n + std::uniform_int_distribution<int>(0, 5)(rng);
    std::vector<float> w(u(n));
    for (auto& x : w) x = static_cast<float>(std::uniform_int_distribution<int>(0, 50)(rng));
    std::vector<std::int64_t> phy2log, rank, cnt;
    epx::eplb_detail::replicate_experts(w, 1, n, phy, phy2log, rank, cnt);
    std::int64_t total = 0;
    float greedy_max = 0;
    for (int j = 0; j < n; ++j) {
      ASSERT_GE(cnt[u(j)], 1);
      total += cnt[u(j)];
      greedy_max = std::max(greedy_max, w[u(j)] / static_cast<float>(cnt[u(j)]));
    }
    EXPECT_EQ(total, phy);
    for (int s = 0; s < n; ++s) EXPECT_EQ(phy2log[u(s)], s);
    std::vector<int> seen(u(n), 0);
    for (int s = 0; s < phy; ++s) EXPECT_EQ(rank[u(s)], seen[u(phy2log[u(s)])]++);
    float best = std::numeric_limits<float>::infinity();
    std::vector<int> c(u(n), 1);
    std::function<void(int, int)> rec = [&](int j, int left) {
      if (j == n - 1) {
        c[u(j)] = 1 + left;
        float m = 0;
        for (int k = 0; k < n; ++k) m = std::max(m, w[u(k)] / static_cast<float>(c[u(k)]));
        best = std::min(best, m);
        return;
      }
      for (int extra = 0; extra <= left; ++extra) {
        c[u(j)] = 1 + extra;
        rec(j + 1, left - extra);
      }
    };
    rec(0, phy - n);
    EXPECT_EQ(greedy_max, best) << "trial " << trial;
  }
}

// ---- the `epx eplb` subcommand ----

class EplbCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ =
        fs::temp_directory_path() / ("epx_eplb_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Runs `epx <args...>` through CLI11 with the eplb subcommand registered; returns stdout.
  std::string run(std::vector<std::string> args) {
    CLI::App app{"epx"};
    app.require_subcommand(1);
    epx::tools::add_eplb_command(app);
    args.insert(args.begin(), "epx");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    std::ostringstream captured;
    auto* old = std::cout.rdbuf(captured.rdbuf());
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (...) {
      std::cout.rdbuf(old);
      throw;
    }
    std::cout.rdbuf(old);
    return captured.str();
  }
  fs::path dir_;
};

TEST_F(EplbCommand, PublishedVectorJson) {
  const fs::path weights = dir_ / "w.npy", json = dir_ / "plan.json";
  epx::tools::write_npy(weights, "<f4", {2, 12}, kPublishedWeight.data(), kPublishedWeight.size() * 4);
  // --replicas omitted: the default, smallest multiple of 8 GPUs above 12 experts, is 16.
  const std::string out = run(
      {"eplb", "--weights", weights.string(), "--groups", "4", "--nodes", "2", "--gpus", "8", "--json", json.string()});
  EXPECT_NE(out.find("phy2log: 5 6 5 7 8 4 3 4 10 9 10 2 0 1 11 1"), std::string::npos) << out;
  EXPECT_NE(out.find("max/avg"), std::string::npos) << out;
  std::ifstream f(json);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["num_replicas"], 16);
  EXPECT_EQ(j["num_groups"], 4);
  EXPECT_EQ(j["num_nodes"], 2);
  EXPECT_EQ(j["num_gpus"], 8);
  EXPECT_EQ(j["num_layers"], 2);
  EXPECT_EQ(j["num_logical_experts"], 12);
  EXPECT_EQ(j["policy"], "hierarchical");
  I64 phy2log;
  for (const auto& row : j["phy2log"]) {
    ASSERT_EQ(row.size(), 16u);
    for (const auto& v : row) phy2log.push_back(v.get<std::int64_t>());
  }
  EXPECT_EQ(phy2log, kPublishedPhy2log);
  const EplbPlan p = rebalance_experts(kPublishedWeight, 2, 12, 16, 4, 2, 8);
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t e = 0; e < 12; ++e) {
      EXPECT_EQ(j["logcnt"][l][e].get<std::int64_t>(), p.logcnt[l * 12 + e]);
      for (std::size_t r = 0; r < 2; ++r)
        EXPECT_EQ(j["log2phy"][l][e][r].get<std::int64_t>(), p.log2phy[(l * 12 + e) * 2 + r]);
    }
    ASSERT_EQ(j["load_before"][l].size(), 8u);
    ASSERT_EQ(j["load_after"][l].size(), 8u);
    double sb = 0, sa = 0, total = 0;
    for (std::size_t g = 0; g < 8; ++g) {
      sb += j["load_before"][l][g].get<double>();
      sa += j["load_after"][l][g].get<double>();
    }
    for (std::size_t e = 0; e < 12; ++e) total += kPublishedWeight[l * 12 + e];
    EXPECT_NEAR(sb, total, 1e-6);
    EXPECT_NEAR(sa, total, 1e-3);
    EXPECT_LT(j["max_over_avg_after"][l].get<double>(), j["max_over_avg_before"][l].get<double>());
  }
}

TEST_F(EplbCommand, OneDimensionalF8AndExplicitReplicas) {
  const fs::path weights = dir_ / "w.npy", json = dir_ / "plan.json";
  const std::vector<double> w = {10, 1, 4, 3};
  epx::tools::write_npy(weights, "<f8", {4}, w.data(), w.size() * 8);
  run({"eplb", "--weights", weights.string(), "--replicas", "6", "--gpus", "2", "--json", json.string()});
  std::ifstream f(json);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["num_layers"], 1);
  EXPECT_EQ(j["phy2log"], nlohmann::json::parse("[[2, 0, 1, 0, 0, 3]]"));
  EXPECT_EQ(j["logcnt"], nlohmann::json::parse("[[3, 1, 1, 1]]"));
  EXPECT_EQ(j["load_before"], nlohmann::json::parse("[[11.0, 7.0]]"));
}

TEST_F(EplbCommand, Errors) {
  const fs::path weights = dir_ / "w.npy";
  auto expect_code = [&](std::vector<std::string> args, ErrorCode code) {
    try {
      run(std::move(args));
      ADD_FAILURE() << "no exception";
    } catch (const epx::Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  expect_code({"eplb", "--weights", (dir_ / "missing.npy").string()}, ErrorCode::kIo);
  const std::vector<std::int32_t> ints(12, 1);
  epx::tools::write_npy(weights, "<i4", {12}, ints.data(), 48);
  expect_code({"eplb", "--weights", weights.string()}, ErrorCode::kDtypeMismatch);
  const std::vector<float> cube(8, 1.0f);
  epx::tools::write_npy(weights, "<f4", {2, 2, 2}, cube.data(), 32);
  expect_code({"eplb", "--weights", weights.string()}, ErrorCode::kShapeMismatch);
  epx::tools::write_npy(weights, "<f4", {2, 12}, kPublishedWeight.data(), kPublishedWeight.size() * 4);
  expect_code({"eplb", "--weights", weights.string(), "--replicas", "12", "--gpus", "8"}, ErrorCode::kInvalidArgument);
  expect_code({"eplb", "--weights", weights.string(), "--gpus", "0"}, ErrorCode::kInvalidArgument);
  expect_code({"eplb", "--weights", weights.string(), "--json", (dir_ / "no" / "such" / "x.json").string()},
              ErrorCode::kIo);
  // --weights is required: a CLI11 parse error.
  EXPECT_THROW(run({"eplb"}), CLI::ParseError);
}

}  // namespace
