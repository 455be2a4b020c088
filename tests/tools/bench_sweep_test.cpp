// `epx bench --sweep`: the axes parse (every value checked up front), the cross product in
// order with the combinations that cannot run skipped with a reason, the table's cells from
// fixed numbers, and a real 2x2 sweep on the threads transport.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/sweep_print.hpp"
#include "bench_test_support.hpp"
#include "epx/error.hpp"

using namespace epx;
using namespace epx::tools;
using nlohmann::json;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class BenchSweep : public epx::testing::BenchTest {
 protected:
  static BenchOptions tiny() {  // the sweep's combinations skip the counters comparison
    BenchOptions o = BenchTest::tiny();
    o.overhead_iters = 0;
    return o;
  }
};

}  // namespace

TEST(BenchSweepAxes, ParseToCanonicalValues) {
  const auto axes = parse_sweep_axes({"schedule=flat,grouped:4", "aggregate=0,65536,1M", "queues=1,2", "tokens=8,16"});
  ASSERT_EQ(axes.size(), 4u);
  EXPECT_EQ(axes[0].key, "schedule");
  EXPECT_EQ(axes[0].values, (std::vector<std::string>{"flat", "grouped:4"}));
  EXPECT_EQ(axes[1].values, (std::vector<std::string>{"0", "64K", "1M"}));
  EXPECT_EQ(axes[2].values, (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(axes[3].values, (std::vector<std::string>{"8", "16"}));
}

TEST(BenchSweepAxes, UnparsableValuesAndKeysAreErrors) {
  auto expect = [](std::vector<std::string> specs, const std::string& part) {
    const std::string what = error_of([&] { parse_sweep_axes(specs); });
    EXPECT_NE(what.find(part), std::string::npos) << "got: " << what;
  };
  expect({"schedule=flat,diagonal"}, "--sweep schedule: --schedule: schedule 'diagonal'");
  expect({"queues=1,3"}, "--queues: '3'");
  expect({"queue-split=rr,3:x"}, "--queue-split");
  expect({"protocol=explicit,"}, "empty value");
  expect({"colour=red"}, "KEY one of topology, schedule");
  expect({"queues"}, "expected KEY=V1,V2");
  expect({"queues=1", "queues=2"}, "given twice");
  expect({"workers=-1"}, "--workers: '-1'");
  expect({"tokens=many"}, "--tokens: 'many'");
}

TEST(BenchSweepAxes, CrossProductInOrderWithInvalidCombinationsSkipped) {
  BenchOptions base;
  base.ranks = 4;
  const auto axes = parse_sweep_axes({"queues=1,2", "queue-split=rr,3:1", "schedule=grouped:2,grouped:3"});
  const auto combos = expand_sweep(base, axes, 4);
  ASSERT_EQ(combos.size(), 8u);
  const std::vector<std::vector<std::string>> order = {
      {"1", "rr", "grouped:2"},  {"1", "rr", "grouped:3"},  {"1", "3:1", "grouped:2"}, {"1", "3:1", "grouped:3"},
      {"2", "rr", "grouped:2"},  {"2", "rr", "grouped:3"},  {"2", "3:1", "grouped:2"}, {"2", "3:1", "grouped:3"}};
  for (std::size_t i = 0; i < combos.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(combos[i].values, order[i]);
    EXPECT_TRUE(combos[i].options.sweep.empty());
    EXPECT_EQ(combos[i].options.dataplane.queues, std::stoi(order[i][0]));
    EXPECT_EQ(combos[i].options.dataplane.schedule.group_width, order[i][2] == "grouped:2" ? 2 : 3);
  }
  EXPECT_EQ(combos[0].skip_reason, "");
  EXPECT_NE(combos[1].skip_reason.find("W must divide the 4 ranks"), std::string::npos);
  EXPECT_NE(combos[2].skip_reason.find("--queue-split 3:1 has 2 parts but --queues is 1"), std::string::npos);
  EXPECT_EQ(combos[4].skip_reason, "");
  EXPECT_EQ(combos[6].skip_reason, "");
  EXPECT_EQ(combos[6].options.dataplane.queue_split.ratio, (std::vector<int>{3, 1}));
  EXPECT_NE(combos[7].skip_reason, "");
}

TEST(BenchSweepAxes, ABaseOnlyValidWithSweptValuesIsFine) {
  BenchOptions base;
  base.ranks = 4;
  set_sweep_value(base, "queue-split", "1:1");  // alone (queues 1) invalid; every swept value fixes it
  const auto combos = expand_sweep(base, parse_sweep_axes({"queues=2"}), 4);
  ASSERT_EQ(combos.size(), 1u);
  EXPECT_EQ(combos[0].skip_reason, "");
}

TEST(BenchSweepTable, CellsFromFixedNumbers) {
  const auto axes = parse_sweep_axes({"schedule=flat,rotated", "queues=2"});
  auto op = [](double us, double gbps, double ratio, double puts, double bpp, std::vector<double> qbytes, std::vector<double> qwait) {
    OpReport r;
    r.max_rank.avg = us;
    r.algbw_gbps = gbps;
    r.ratio_vs_memcpy = ratio;
    r.counters = true;
    r.puts = puts;
    r.bytes_per_put = bpp;
    r.queue_bytes = std::move(qbytes);
    r.queue_wait_us = std::move(qwait);
    return r;
  };
  std::vector<SweepRow> rows(3);
  rows[0].values = {"flat", "2"};
  rows[0].report.dispatch = op(1033.64, 0.374, 0.0049, 232, 1877.9, {300000, 100000}, {10.0, 2.5});
  rows[0].report.combine = op(12345.6, 2.456, 0.0512, 16, 23872, {50000, 50000}, {1.25, 0.0});
  rows[1].values = {"rotated", "2"};
  rows[1].skipped = "--schedule rotated: because";
  rows[2].values = {"rotated", "2"};
  rows[2].report.dispatch = op(5, 1, 1, 0, 0, {}, {});
  rows[2].report.dispatch.counters = false;
  rows[2].report.combine = rows[2].report.dispatch;
  rows[2].report.warnings = {"something"};

  const auto cells = sweep_table_cells(axes, rows);
  ASSERT_EQ(cells.size(), 4u);
  EXPECT_EQ(cells[0], (std::vector<std::string>{"#", "sched", "q", "d_us", "d_GB/s", "d_xmc", "d_puts", "d_B/put", "c_us",
                                                "c_GB/s", "c_xmc", "c_puts", "c_B/put", "q_bytes%", "wait_us", "chk"}));
  EXPECT_EQ(cells[1], (std::vector<std::string>{"1", "flat", "2", "1033.6", "0.37", "0.00", "232", "1878", "12346", "2.46", "0.05",
                                                "16", "23872", "70/30", "13.8", "ok"}));
  EXPECT_EQ(cells[2], (std::vector<std::string>{"2", "rotated", "2", "skipped"}));
  EXPECT_EQ(cells[3], (std::vector<std::string>{"3", "rotated", "2", "5.0", "1.00", "1.00", "-", "-", "5.0", "1.00", "1.00", "-",
                                                "-", "-", "-", "WARN"}));

  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  print_sweep_table(f, axes, rows);
  std::fclose(f);
  const std::string text(buf, len);
  std::free(buf);
  std::istringstream lines(text);
  std::string line;
  std::vector<std::string> all;
  while (std::getline(lines, line)) {
    EXPECT_LE(line.size(), 120u) << line;
    all.push_back(line);
  }
  ASSERT_EQ(all.size(), 6u) << text;
  EXPECT_EQ(all[0], "  # sched   q   d_us d_GB/s d_xmc d_puts d_B/put  c_us c_GB/s c_xmc c_puts c_B/put q_bytes% wait_us  chk");
  EXPECT_EQ(all[1], "  1 flat    2 1033.6   0.37  0.00    232    1878 12346   2.46  0.05     16   23872    70/30    13.8   ok");
  EXPECT_EQ(all[2], "  2 rotated 2 skipped");
  EXPECT_EQ(all[4], "  #2 skipped: --schedule rotated: because");
  EXPECT_EQ(all[5], "  #3 WARNING: something");
}

TEST_F(BenchSweep, TwoByTwoOnThreadsMeasuresEveryCombination) {
  BenchOptions o = tiny();
  o.sweep = {"schedule=flat,rotated", "queues=1,2"};
  o.json = (dir_ / "sweep.json").string();
  std::vector<SweepRow> rows;
  ASSERT_EQ(run_bench_sweep(o, sink_, &rows), 0);
  ASSERT_EQ(rows.size(), 4u);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(i);
    const SweepRow& r = rows[i];
    ASSERT_EQ(r.skipped, "");
    EXPECT_EQ(r.options.dataplane.schedule.kind, i < 2 ? ScheduleKind::kFlat : ScheduleKind::kRotated);
    EXPECT_EQ(r.options.dataplane.queues, i % 2 == 0 ? 1 : 2);
    // The run measured what it says: the report carries the combination's data plane.
    EXPECT_EQ(r.report.options.dataplane.queues, r.options.dataplane.queues);
    EXPECT_GT(r.report.dispatch.total_payload, 0);
    EXPECT_GT(r.report.combine.total_payload, 0);
    EXPECT_GT(r.report.dispatch.max_rank.avg, 0);
    ASSERT_TRUE(r.report.dispatch.counters);
    EXPECT_EQ(r.report.dispatch.queue_bytes.size(), static_cast<std::size_t>(r.options.dataplane.queues));
    double bytes = 0;
    for (double b : r.report.dispatch.queue_bytes) bytes += b;
    EXPECT_GT(bytes, 0);
    // The bench's payload cross-check ran and found the engine's bytes = the routing's.
    EXPECT_TRUE(r.report.warnings.empty()) << r.report.warnings.front();
  }
  std::ifstream f(o.json);
  const json j = json::parse(f);
  EXPECT_EQ(j["tool"], "epx bench --sweep");
  EXPECT_EQ(j["num_ranks"], 2);
  EXPECT_EQ(j["ranks"].size(), 2u);
  ASSERT_EQ(j["sweep"].size(), 4u);
  EXPECT_EQ(j["sweep"][3]["values"]["schedule"], "rotated");
  EXPECT_EQ(j["sweep"][3]["values"]["queues"], "2");
  EXPECT_EQ(j["sweep"][3]["config"]["dataplane"]["queues"], 2);
  EXPECT_EQ(j["sweep"][3]["verified"], true);
  EXPECT_EQ(j["sweep"][3]["dispatch"]["queue_bytes"].size(), 2u);
  EXPECT_GT(j["sweep"][3]["dispatch"]["payload_bytes_total"].get<double>(), 0);
}

TEST_F(BenchSweep, SkipsInvalidCombinationsAndRefusesBadValuesBeforeRunning) {
  BenchOptions o = tiny();
  o.sweep = {"queues=1,2", "queue-split=1:1"};
  std::vector<SweepRow> rows;
  ASSERT_EQ(run_bench_sweep(o, sink_, &rows), 0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NE(rows[0].skipped.find("has 2 parts but --queues is 1"), std::string::npos);
  EXPECT_EQ(rows[1].skipped, "");
  EXPECT_TRUE(rows[1].report.warnings.empty());

  o.sweep = {"queues=1,2", "protocol=explicit,pull"};
  EXPECT_THROW(run_bench_sweep(o, sink_), Error);
  o.sweep = {"queues=1,2"};
  o.iters = 0;  // not swept: an error, not a skip
  EXPECT_THROW(run_bench_sweep(o, sink_), Error);
}
