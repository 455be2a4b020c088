// `epx bench` end to end on a tiny shape with threads as ranks: the JSON has every
// required field with the right sizes and the independent payload count, the trace is
// valid Chrome trace JSON with slices for every rank; the rank record file round-trips;
// --diagnose's matrices and verdict.
#include <gtest/gtest.h>
#include <unistd.h>

#include "bench_test_support.hpp"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "epx/bench/mpi.hpp"
#include "epx/bench/routing.hpp"
#include "bench/run_bench.hpp"
#include "epx/bench/runner.hpp"
#include "epx/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace epx::tools;

namespace {

class BenchRun : public epx::testing::BenchTest {
 protected:
  static json read_json(const fs::path& p) {
    std::ifstream f(p);
    return json::parse(f);  // throws on invalid JSON
  }
};

void expect_summary(const json& j, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(j.is_object());
  for (const char* k : {"avg", "p50", "p95", "max"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_TRUE(j[k].is_number()) << k;
    EXPECT_GE(j[k].get<double>(), 0) << k;
  }
  EXPECT_LE(j["p50"].get<double>(), j["max"].get<double>());
  EXPECT_LE(j["p95"].get<double>(), j["max"].get<double>());
}

}  // namespace

// --diagnose: the timed loop's matrices and verdict under "diagnose" (the shape
// `epx bench --html` draws), and the text report's DIAGNOSE section.
TEST_F(BenchRun, DiagnoseGoesIntoTheJsonAndTheReport) {
  BenchOptions o = tiny();
  o.ranks = 4, o.experts = 8, o.iters = 6;
  o.diagnose = true;
  o.json = (dir_ / "bench.json").string();
  const std::filesystem::path text = dir_ / "report.txt";
  std::FILE* out = std::fopen(text.c_str(), "w");
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(run_bench(o, out), 0);
  std::fclose(out);
  const json j = read_json(o.json);
  ASSERT_TRUE(j.contains("diagnose"));
  for (const char* op : {"dispatch", "combine"}) {
    const json& d = j["diagnose"][op];
    ASSERT_EQ(d["matrix_us"].size(), 4u) << op;
    for (const json& row : d["matrix_us"]) {
      ASSERT_EQ(row.size(), 4u) << op;
      for (const json& x : row) EXPECT_GE(x.get<double>(), 0) << op;
    }
    EXPECT_TRUE(d["abnormal_rows"].is_array() && d["abnormal_cols"].is_array() && d["abnormal_points"].is_array()) << op;
    EXPECT_EQ(d["thresholds"]["row"], 3.0);
    EXPECT_EQ(d["thresholds"]["col"], 3.0);
    EXPECT_EQ(d["thresholds"]["point"], 5.0);
    EXPECT_EQ(d["calls_per_rank"], json(std::vector<int>(4, 6))) << op;  // the timed calls only
    // --diagnose-intervals 5 (the default) over 6 iterations: interval k ends after
    // ceil(k * 6 / 5) iterations (2, 3, 4, 5, 6): 2, 1, 1, 1, 1 calls; the whole loop's matrix
    // is their waits summed over its calls.
    const json& intervals = j["diagnose"]["intervals"];
    ASSERT_EQ(intervals.size(), 5u);
    for (std::size_t k = 0; k < 5; ++k)
      EXPECT_EQ(intervals[k][op]["calls_per_rank"], json(std::vector<int>(4, k == 0 ? 2 : 1))) << op << " interval " << k;
    for (std::size_t s = 0; s < 4; ++s)
      for (std::size_t dst = 0; dst < 4; ++dst) {
        double waited = 0;
        for (const json& i : intervals)
          waited += i[op]["matrix_us"][s][dst].get<double>() * i[op]["calls_per_rank"][dst].get<double>();
        EXPECT_NEAR(d["matrix_us"][s][dst].get<double>(), waited / 6, 1e-9 + 1e-9 * waited) << op << " " << s << " " << dst;
      }
    const json& p = j["diagnose"]["persistent"][op];
    EXPECT_TRUE(p["abnormal_rows"].is_array() && p["abnormal_cols"].is_array() && p["abnormal_points"].is_array()) << op;
  }
  EXPECT_EQ(j["diagnose"]["persist"]["of"], 5);
  EXPECT_EQ(j["diagnose"]["persist"]["need"], 3);
  std::ifstream in(text);
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("DIAGNOSE (the timed loop in 5 intervals"), std::string::npos) << report;
  EXPECT_NE(report.find("persistently (named in 3 of the last 5 intervals, 5 so far)"), std::string::npos) << report;
  EXPECT_NE(report.find("wait per call, us: matrix[src][dst] (calls per dst: 6 6 6 6)"), std::string::npos) << report;
}

TEST_F(BenchRun, JsonHasEveryRequiredFieldAndTheIndependentPayload) {
  BenchOptions o = tiny();
  o.json = (dir_ / "bench.json").string();
  o.trace = (dir_ / "trace.json").string();
  ASSERT_EQ(run_bench(o, sink_), 0);
  const json j = read_json(o.json);
  EXPECT_EQ(j["num_ranks"], 2);
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(j["ranks"][r]["rank"], r);
    EXPECT_EQ(j["ranks"][r]["pid"], static_cast<std::int64_t>(getpid()));  // threads: this process
    EXPECT_FALSE(j["ranks"][r]["node"].get<std::string>().empty());
  }
  EXPECT_FALSE(j.contains("diagnose"));  // only with --diagnose
  EXPECT_EQ(j["tokens"], 16);
  EXPECT_EQ(j["hidden"], 256);
  EXPECT_EQ(j["topk"], 2);
  EXPECT_EQ(j["experts"], 4);
  EXPECT_EQ(j["fp8"], false);
  EXPECT_EQ(j["layout"], "compact");
  ASSERT_TRUE(j["memcpy_gbps"].is_number());
  EXPECT_GT(j["memcpy_gbps"].get<double>(), 0);

  // The same routing, counted here by brute force.
  const BenchProblem p = make_problem(o);
  const int L = 2;
  std::vector<std::int64_t> sent(2, 0), local(2, 0), recv(2, 0), recv_local(2, 0);
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < 16; ++t)
      for (int d = 0; d < 2; ++d) {
        bool there = false;
        for (int k = 0; k < 2; ++k) there |= p.rank[s].topk_idx[t * 2 + k] / L == d;
        if (!there) continue;
        ++sent[s], ++recv[d];
        if (s == d) ++local[s], ++recv_local[d];
      }

  for (const char* op : {"dispatch", "combine"}) {
    SCOPED_TRACE(op);
    const json& d = j[op];
    ASSERT_TRUE(d.is_object());
    expect_summary(d["max_rank_us"], "max_rank_us");
    ASSERT_EQ(d["rank_us"].size(), 2u);
    ASSERT_EQ(d["payload_bytes_per_rank"].size(), 2u);
    ASSERT_EQ(d["local_bytes_per_rank"].size(), 2u);
    const bool is_dispatch = std::string(op) == "dispatch";
    for (int r = 0; r < 2; ++r) {
      EXPECT_GT(d["rank_us"][r].get<double>(), 0);
      EXPECT_EQ(d["payload_bytes_per_rank"][r].get<std::int64_t>(), (is_dispatch ? sent[r] : recv[r]) * 512);
      EXPECT_EQ(d["local_bytes_per_rank"][r].get<std::int64_t>(), (is_dispatch ? local[r] : recv_local[r]) * 512);
    }
    EXPECT_GT(d["algbw_gbps"].get<double>(), 0);
    EXPECT_GT(d["ratio_vs_memcpy"].get<double>(), 0);
    ASSERT_TRUE(d["puts"].is_number());
    // A combine this small right after its dispatch pushes its replies first (one
    // synchronisation; DataPlaneOptions::replies_first_max_bytes), not the pull's two.
    const bool pulled = !is_dispatch && d["pulled"].get<bool>();
    EXPECT_FALSE(pulled) << "a 16-token combine right after its dispatch goes replies first";
    if (!is_dispatch) {
      EXPECT_TRUE(d["data_first"].get<bool>());
    }
    EXPECT_GT(d["puts"].get<double>(), 0);
    ASSERT_TRUE(d["limit_gbps"].is_number());
    EXPECT_GT(d["limit_gbps"].get<double>(), 0);
    EXPECT_TRUE(d["limit"] == "memcpy" || d["limit"] == "streaming copy") << d["limit"];
    EXPECT_GT(d["ratio_vs_limit"].get<double>(), 0);
    ASSERT_TRUE(d["phases_us"].is_object());
    for (const char* ph : {"plan", "notify", "put_issue", "wait_data", "barrier", "epilogue", "other"}) {
      ASSERT_TRUE(d["phases_us"].contains(ph)) << ph;
      EXPECT_EQ(d["phases_us"][ph].size(), 2u) << ph;
    }
    EXPECT_EQ(d["iterations"]["max_rank_us"].size(), 2u);
    EXPECT_TRUE(d.contains("counters_overhead"));
  }
  EXPECT_TRUE(j["warnings"].empty()) << j["warnings"].dump();
  // Every timed dispatch of every rank: a one-copy recv_x (the default output pool).
  EXPECT_EQ(j["output"]["one_copy"].get<int>(), 2 * o.iters) << j["output"].dump();
  EXPECT_EQ(j["output"]["copy"].get<int>(), 0) << j["output"].dump();
  EXPECT_EQ(j["peak_rss_bytes"].size(), 2u);
  const json& wc = j["worker_counters"];
  ASSERT_EQ(wc["dispatch"].size(), 2u);  // [rank][worker][metric]
  EXPECT_EQ(wc["dispatch"][0][0].size(), wc["metrics"].size());
  EXPECT_EQ(j["route"]["recv_rows_per_rank"], json(recv));

  // The trace: valid JSON, complete events on every rank, phases included.
  const json t = read_json(o.trace);
  ASSERT_TRUE(t["traceEvents"].is_array());
  std::set<int> pids;
  std::set<std::string> names;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    pids.insert(e["pid"].get<int>());
    names.insert(e["name"].get<std::string>());
    EXPECT_GE(e["ts"].get<double>(), 0);
    EXPECT_GE(e["dur"].get<double>(), 0);
    EXPECT_TRUE(e.contains("tid"));
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  // (Every timed call goes rows first here, so its header exchange is timed as wait_data.)
  for (const char* n : {"dispatch #0", "combine #1", "put_issue", "wait_data", "epilogue"}) EXPECT_TRUE(names.count(n)) << n;
}

TEST_F(BenchRun, CountersOffExpandedFp8FromADirectory) {
  // A docs/spec.md §7 directory with uneven (and zero) token counts; fp8, expanded, cached.
  BenchOptions gen = tiny();
  gen.tokens = 9;
  BenchProblem p = make_problem(gen);
  p.rank[1].tokens = 0;
  p.rank[1].topk_idx.clear();
  p.rank[1].topk_weights.clear();
  p.rank[1].x = epx::Tensor(epx::DType::kBF16, {0, 256});
  write_routing_dir(p, dir_ / "in");
  fs::remove(dir_ / "in" / "rank0" / "x.npy");  // random x when absent

  BenchOptions o = tiny();
  o.routing = (dir_ / "in").string();
  o.fp8 = true;
  o.layout = "expanded";
  o.alignment = 4;
  o.cached = true;
  o.counters = false;
  o.overhead_iters = 0;
  o.json = (dir_ / "b.json").string();
  BenchReport rep;
  ASSERT_EQ(run_bench(o, sink_, &rep), 0);
  const json j = read_json(o.json);
  EXPECT_EQ(j["tokens_per_rank"], json({9, 0}));
  EXPECT_EQ(j["fp8"], true);
  EXPECT_EQ(j["layout"], "expanded");
  EXPECT_EQ(j["dispatch"]["row_bytes"], 256 + 2 * 4);
  EXPECT_TRUE(j["dispatch"]["puts"].is_null());
  EXPECT_TRUE(j["dispatch"]["phases_us"].empty());
  EXPECT_EQ(j["dispatch"]["payload_bytes_per_rank"][1], 0);
  EXPECT_TRUE(rep.warnings.empty());
}

TEST_F(BenchRun, MissingMpiIsReportedAndTheRunGoesOn) {
  BenchOptions o = tiny();
  o.baseline = "mpi";
  o.mpirun = (dir_ / "no-such-mpirun").string();
  o.json = (dir_ / "b.json").string();
  BenchReport rep;
  ASSERT_EQ(run_bench(o, sink_, &rep), 0);
  EXPECT_FALSE(rep.baseline.ran);
  EXPECT_NE(rep.baseline.why_not.find("no-such-mpirun"), std::string::npos);
  const json j = read_json(o.json);
  EXPECT_EQ(j["baseline"]["available"], false);
  // The hashes the baseline would be compared with were still computed.
  EXPECT_TRUE(j["dispatch"]["max_rank_us"].is_object());
}

TEST_F(BenchRun, BadOptionsAreErrors) {
  BenchOptions o = tiny();
  o.experts = 5;
  EXPECT_THROW(run_bench(o, sink_), epx::Error);
  o = tiny();
  o.layout = "wide";
  EXPECT_THROW(run_bench(o, sink_), epx::Error);
  o = tiny();
  o.fp8 = true;  // H = 256 is fine, H = 200 is not
  o.hidden = 200;
  EXPECT_THROW(run_bench(o, sink_), epx::Error);
}

TEST(BenchRecord, RoundTrips) {
  BenchRankRecord r;
  r.rank = 3;
  r.workers = 2;
  BenchCall c;
  c.start_us = 12.5;
  c.lat_us = 7.25;
  c.workers.resize(2);
  c.workers[1].phase_us[2] = 4.5;
  c.workers[1].puts = 9;
  c.workers[0].queue_bytes[0] = 77;
  r.dispatch = {c, c};
  r.combine = {c};
  r.memcpy_dispatch_us = {1, 2};
  r.on_combine_us = {3};
  r.out_rows = 42;
  r.hashed = true;
  r.dispatch_hash = 0xdeadbeefULL;
  r.pid = 4321;
  r.node = "node-b";
  r.diagnosed = true;
  r.diagnose_seconds = {1.5, 2.5};
  r.diagnose_us.resize(2);
  r.diagnose_calls.resize(2);
  r.diagnose_us[0][1] = {0.5, 7, 8, 0.25};
  r.diagnose_calls[0][1] = {6, 6};
  r.diagnose_us[1][0] = {1, 2, 3, 4};
  r.diagnose_calls[1][0] = {5, 7};
  const fs::path p = fs::temp_directory_path() / ("epx_bench_record_" + std::to_string(::getpid()));
  write_bench_record(p, r);
  const BenchRankRecord q = read_bench_record(p);
  fs::remove(p);
  EXPECT_EQ(q.rank, 3);
  EXPECT_EQ(q.workers, 2);
  ASSERT_EQ(q.dispatch.size(), 2u);
  EXPECT_EQ(q.dispatch[1].lat_us, 7.25);
  ASSERT_EQ(q.dispatch[1].workers.size(), 2u);
  EXPECT_EQ(q.dispatch[1].workers[1].phase_us[2], 4.5);
  EXPECT_EQ(q.dispatch[1].workers[1].puts, 9u);
  EXPECT_EQ(q.dispatch[0].workers[0].queue_bytes[0], 77u);
  EXPECT_EQ(q.memcpy_dispatch_us, (std::vector<double>{1, 2}));
  EXPECT_EQ(q.on_combine_us, (std::vector<double>{3}));
  EXPECT_EQ(q.out_rows, 42);
  EXPECT_TRUE(q.hashed);
  EXPECT_EQ(q.dispatch_hash, 0xdeadbeefULL);
  EXPECT_EQ(q.pid, 4321);
  EXPECT_EQ(q.node, "node-b");
  EXPECT_TRUE(q.diagnosed);
  EXPECT_EQ(q.diagnose_seconds, (std::vector<double>{1.5, 2.5}));
  ASSERT_EQ(q.diagnose_us.size(), 2u);
  ASSERT_EQ(q.diagnose_calls.size(), 2u);
  EXPECT_TRUE(q.diagnose_us[0][0].empty());
  EXPECT_EQ(q.diagnose_us[0][1], (std::vector<double>{0.5, 7, 8, 0.25}));
  EXPECT_EQ(q.diagnose_calls[0][1], (std::vector<std::uint64_t>{6, 6}));
  EXPECT_EQ(q.diagnose_us[1][0], (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(q.diagnose_calls[1][0], (std::vector<std::uint64_t>{5, 7}));
  EXPECT_TRUE(q.diagnose_calls[1][1].empty());
  EXPECT_THROW(read_bench_record(p), epx::Error);
}
