// `epx bench --eplb` in-process (threads as ranks, a tiny skewed shape): the JSON's "eplb"
// object has every field, its per-rank received rows equal an independent count of the
// logical routing and of the physical routing (planned and mapped again here), the timed
// run used the physical routing, and the replicas lower the max/avg imbalance. Bad --eplb-*
// combinations are clear errors.
#include <gtest/gtest.h>

#include "bench_test_support.hpp"
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"
#include "epx/bench/routing.hpp"
#include "bench/run_bench.hpp"
#include "epx/eplb.hpp"
#include "epx/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace epx;
using namespace epx::tools;

namespace {

class BenchEplb : public epx::testing::BenchTest {
 protected:
  // P=4, E=16, K=4, H=128, 64 tokens per rank, Zipf-like skew 1.2.
  static BenchOptions skewed() {
    BenchOptions o;
    o.ranks = 4, o.experts = 16, o.topk = 4, o.hidden = 128, o.tokens = 64;
    o.skew = 1.2;
    o.iters = 2, o.warmup = 1, o.overhead_iters = 0;
    o.transport = "threads";
    o.progress = false;
    o.eplb = true;
    return o;
  }
  json run(BenchOptions o) {
    o.json = (dir_ / "bench.json").string();
    EXPECT_EQ(run_bench(o, sink_), 0);
    std::ifstream f(o.json);
    return json::parse(f);
  }
};

// Compact rows received per rank: (token, destination rank) pairs, destination = e / (experts / P).
std::vector<std::int64_t> recv_rows(const std::vector<std::vector<std::int64_t>>& idx, int P, int experts, int K) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(P), 0);
  const int L = experts / P;
  for (const auto& rank : idx)
    for (std::size_t t = 0; t * static_cast<std::size_t>(K) < rank.size(); ++t) {
      std::vector<bool> seen(static_cast<std::size_t>(P), false);
      for (int k = 0; k < K; ++k) {
        const std::int64_t e = rank[t * static_cast<std::size_t>(K) + static_cast<std::size_t>(k)];
        if (e < 0) continue;
        const auto d = static_cast<std::size_t>(e / L);
        if (!seen[d]) rows[d] += 1;
        seen[d] = true;
      }
    }
  return rows;
}

double imbalance(const std::vector<std::int64_t>& v) {
  const double sum = static_cast<double>(std::accumulate(v.begin(), v.end(), std::int64_t{0}));
  return static_cast<double>(*std::max_element(v.begin(), v.end())) / (sum / static_cast<double>(v.size()));
}

std::int64_t sum(const json& list) {
  std::int64_t s = 0;
  for (const auto& v : list) s += v.get<std::int64_t>();
  return s;
}

}  // namespace

TEST_F(BenchEplb, ReplicasLowerTheImbalanceAndTheRowsMatchAnIndependentCount) {
  const BenchOptions o = skewed();
  const json j = run(o);
  ASSERT_TRUE(j.contains("eplb"));
  const json& e = j["eplb"];
  for (const char* k : {"logical_experts", "replicas", "replicas_per_rank", "choice", "ranks_per_server", "load_source",
                        "expert_load", "logcnt", "phy2log", "mapping_verified", "mapped_slots", "without", "with"})
    ASSERT_TRUE(e.contains(k)) << k;
  for (const char* s : {"without", "with"})
    for (const char* k : {"recv_rows_per_rank", "recv_slots_per_rank", "sent_rows_per_rank", "total_rows", "total_slots",
                          "rows_imbalance", "slots_imbalance", "max_rows_rank", "max_rows", "planned_gpu_load",
                          "planned_imbalance"})
      ASSERT_TRUE(e[s].contains(k)) << s << "." << k;
  ASSERT_TRUE(e["with"].contains("measured_slowest_rank"));

  // Default R = E + E/4 = 20 (a multiple of P = 4), choice spread; the timed run is physical.
  EXPECT_EQ(e["logical_experts"], 16);
  EXPECT_EQ(e["replicas"], 20);
  EXPECT_EQ(e["replicas_per_rank"], 5);
  EXPECT_EQ(e["choice"], "spread");
  EXPECT_EQ(j["experts"], 20);
  EXPECT_TRUE(e["mapping_verified"].get<bool>());
  EXPECT_EQ(e["mapped_slots"], 4 * 64 * 4);
  EXPECT_TRUE(j["warnings"].empty()) << j["warnings"].dump();

  // The independent count: the same routing, planned and mapped here.
  const BenchProblem p = make_problem(o);  // the logical routing (make_problem does not apply EPLB)
  std::vector<std::vector<std::int64_t>> logical;
  std::vector<float> load(16, 0.0f);
  for (const BenchRankInput& r : p.rank) {
    logical.push_back(r.topk_idx);
    for (const std::int64_t x : r.topk_idx)
      if (x >= 0) load[static_cast<std::size_t>(x)] += 1;
  }
  EXPECT_EQ(e["expert_load"].get<std::vector<float>>(), load);
  const EplbPlan plan = rebalance_experts(load, 1, 16, 20, 1, 1, 4);
  EXPECT_EQ(e["phy2log"].get<std::vector<std::int64_t>>(), plan.phy2log);
  std::vector<std::vector<std::int64_t>> physical;
  for (int r = 0; r < 4; ++r) {
    ReplicaRouting how;
    how.rank = r;
    how.num_ranks = 4;
    physical.push_back(map_to_replicas(logical[static_cast<std::size_t>(r)], 4, plan, how));
  }
  const std::vector<std::int64_t> before = recv_rows(logical, 4, 16, 4);
  const std::vector<std::int64_t> after = recv_rows(physical, 4, 20, 4);

  const json& wo = e["without"];
  const json& wi = e["with"];
  EXPECT_EQ(wo["recv_rows_per_rank"].get<std::vector<std::int64_t>>(), before);
  EXPECT_EQ(wi["recv_rows_per_rank"].get<std::vector<std::int64_t>>(), after);
  EXPECT_EQ(sum(wo["recv_rows_per_rank"]), std::accumulate(before.begin(), before.end(), std::int64_t{0}));
  EXPECT_EQ(sum(wi["recv_rows_per_rank"]), std::accumulate(after.begin(), after.end(), std::int64_t{0}));
  EXPECT_EQ(wo["total_rows"].get<std::int64_t>(), sum(wo["recv_rows_per_rank"]));
  EXPECT_EQ(wi["total_rows"].get<std::int64_t>(), sum(wi["recv_rows_per_rank"]));
  // Every slot goes somewhere in both routings; rows sent = rows received.
  EXPECT_EQ(sum(wo["recv_slots_per_rank"]), 4 * 64 * 4);
  EXPECT_EQ(sum(wi["recv_slots_per_rank"]), 4 * 64 * 4);
  EXPECT_EQ(sum(wo["sent_rows_per_rank"]), sum(wo["recv_rows_per_rank"]));
  EXPECT_EQ(sum(wi["sent_rows_per_rank"]), sum(wi["recv_rows_per_rank"]));
  // The timed run moved the physical rows: combine sends back what each rank received.
  EXPECT_EQ(j["combine"]["rows_per_rank"], wi["recv_rows_per_rank"]);
  EXPECT_EQ(j["dispatch"]["rows_per_rank"], wi["sent_rows_per_rank"]);

  // The imbalance, as reported and recomputed; the replicas must strictly lower it here.
  EXPECT_DOUBLE_EQ(wo["rows_imbalance"].get<double>(), imbalance(before));
  EXPECT_DOUBLE_EQ(wi["rows_imbalance"].get<double>(), imbalance(after));
  EXPECT_LT(wi["rows_imbalance"].get<double>(), wo["rows_imbalance"].get<double>());
  EXPECT_LT(wi["slots_imbalance"].get<double>(), wo["slots_imbalance"].get<double>());
  EXPECT_LT(wi["planned_imbalance"].get<double>(), wo["planned_imbalance"].get<double>());
  EXPECT_GT(wo["rows_imbalance"].get<double>(), 1.2) << "the fixture is meant to be skewed";
  EXPECT_EQ(wo["max_rows"].get<std::int64_t>(), *std::max_element(before.begin(), before.end()));
  EXPECT_EQ(wi["max_rows"].get<std::int64_t>(), *std::max_element(after.begin(), after.end()));
  const int slowest = wi["measured_slowest_rank"].get<int>();
  EXPECT_GE(slowest, 0);
  EXPECT_LT(slowest, 4);
}

TEST_F(BenchEplb, PreferRankAndServerChoicesRunAndVerify) {
  std::int64_t spread_local = -1;
  for (const char* choice : {"spread", "rank", "server"}) {
    SCOPED_TRACE(choice);
    BenchOptions o = skewed();
    o.eplb_choice = choice;
    if (std::string(choice) == "server") o.eplb_servers_of = 2;
    o.eplb_replicas = 24;
    const json j = run(o);
    const json& e = j["eplb"];
    EXPECT_EQ(e["choice"], choice);
    EXPECT_EQ(e["replicas"], 24);
    EXPECT_EQ(e["ranks_per_server"], std::string(choice) == "server" ? 2 : 1);
    EXPECT_TRUE(e["mapping_verified"].get<bool>());
    EXPECT_TRUE(j["warnings"].empty()) << j["warnings"].dump();
    EXPECT_EQ(sum(e["with"]["recv_slots_per_rank"]), 4 * 64 * 4);
    // Same plan: preferring the token's own rank reaches it at least as often as spreading.
    const auto local = e["with"]["local_rows"].get<std::int64_t>();
    if (std::string(choice) == "spread") spread_local = local;
    if (std::string(choice) == "rank") {
      EXPECT_GE(local, spread_local);
    }
  }
}

// --eplb-choice dynamic: replicas from this batch's per-rank counts (plan_dynamic_replicas),
// the timed run's received slots per rank equal the plan's (checked by apply_eplb too), the
// imbalance falls, and the JSON names the slots filled and the mapping.
TEST_F(BenchEplb, DynamicReplicasFromTheBatchBalanceTheSlots) {
  BenchOptions o = skewed();
  o.eplb_choice = "dynamic";
  o.eplb_replicas = 24;  // B = 2 slots per rank
  const json j = run(o);
  const json& e = j["eplb"];
  EXPECT_EQ(e["choice"], "dynamic");
  EXPECT_TRUE(e["mapping_verified"].get<bool>());
  EXPECT_TRUE(j["warnings"].empty()) << j["warnings"].dump();
  ASSERT_TRUE(e.contains("dynamic"));
  EXPECT_EQ(e["dynamic"]["slots_per_rank"], 2);
  const auto used = e["dynamic"]["replicas_used"].get<int>();
  EXPECT_GT(used, 0);
  EXPECT_LE(used, 8);
  int filled = 0;
  for (const auto& m : e["dynamic"]["mapping"]) filled += m.get<std::int64_t>() >= 0;
  EXPECT_EQ(filled, used);
  EXPECT_EQ(sum(e["with"]["recv_slots_per_rank"]), sum(e["without"]["recv_slots_per_rank"]));
  EXPECT_LT(e["with"]["slots_imbalance"].get<double>(), e["without"]["slots_imbalance"].get<double>());
  EXPECT_EQ(e["with"]["recv_slots_per_rank"], e["with"]["planned_gpu_load"]);
  // The weights the plan moves were moved (and checked on every rank) and timed.
  EXPECT_EQ(e["dynamic"]["expert_bytes"], 1u << 20);
  EXPECT_EQ(e["dynamic"]["weight_bytes_moved"], static_cast<std::uint64_t>(used) << 20);
  ASSERT_EQ(e["dynamic"]["prefetch_us"].size(), e["dynamic"]["reduce_us"].size());
  ASSERT_FALSE(e["dynamic"]["prefetch_us"].empty());
  for (const auto& v : e["dynamic"]["prefetch_us"]) EXPECT_GT(v.get<double>(), 0.0);
  for (const auto& v : e["dynamic"]["reduce_us"]) EXPECT_GT(v.get<double>(), 0.0);
}

TEST_F(BenchEplb, WithoutEplbThereIsNoEplbObject) {
  BenchOptions o = skewed();
  o.eplb = false;
  const json j = run(o);
  EXPECT_FALSE(j.contains("eplb"));
  EXPECT_EQ(j["experts"], 16);
}

TEST(BenchEplbOptions, BadCombinationsAreClearErrors) {
  auto fails = [](BenchOptions o, const std::string& needle) {
    try {
      validate_options(o);
      ADD_FAILURE() << "accepted; expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  BenchOptions base;
  base.ranks = 4, base.experts = 16, base.topk = 4, base.hidden = 128;
  BenchOptions o = base;
  o.eplb_replicas = 20;
  fails(o, "--eplb-replicas needs --eplb");
  o = base;
  o.eplb_choice = "rank";
  fails(o, "--eplb-choice needs --eplb");
  o = base;
  o.eplb_servers_of = 2;
  fails(o, "--eplb-servers-of needs --eplb");
  base.eplb = true;
  EXPECT_NO_THROW(validate_options(base));
  o = base;
  o.eplb_choice = "nearest";
  fails(o, "--eplb-choice must be");
  o = base;
  o.eplb_replicas = 12;  // < E
  fails(o, "must be >= the logical experts E = 16");
  o = base;
  o.eplb_replicas = 18;  // not a multiple of P
  fails(o, "a multiple of the ranks P = 4");
  o = base;
  o.eplb_servers_of = 2;  // choice spread
  fails(o, "--eplb-servers-of only applies to --eplb-choice server");
  o = base;
  o.eplb_choice = "server";
  o.eplb_servers_of = 3;
  fails(o, "must divide the ranks P = 4");
  o.eplb_servers_of = 2;
  EXPECT_NO_THROW(validate_options(o));
}

TEST(BenchEplbOptions, DefaultReplicasAreAMultipleOfPAboveE) {
  EXPECT_EQ(default_eplb_replicas(256, 8), 320);
  EXPECT_EQ(default_eplb_replicas(16, 4), 20);
  EXPECT_EQ(default_eplb_replicas(8, 8), 16);
  EXPECT_EQ(default_eplb_replicas(4, 1), 5);
  for (int P : {1, 2, 4, 8, 16})
    for (int E = P; E <= 512; E += P) {
      const int R = default_eplb_replicas(E, P);
      EXPECT_EQ(R % P, 0);
      EXPECT_GT(R, E);
    }
}
