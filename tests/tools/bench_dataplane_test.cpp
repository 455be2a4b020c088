// The data-plane flags of `epx bench` and `epx replay`: each lands in the options that
// become BufferConfig::dataplane, a bad value is a parse error naming its flag, and the
// values are checked against each other (and the ranks) before anything runs; the report
// and the JSON record the data plane and the per-queue counters.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/options.hpp"
#include "bench/bench_cli.hpp"
#include "bench/run_bench.hpp"
#include "bench_test_support.hpp"
#include "commands.hpp"
#include "epx/error.hpp"

using namespace epx;
using namespace epx::tools;

namespace {

BenchOptions parse_bench(const std::string& args) {
  BenchOptions o;
  CLI::App app;
  add_bench_options(&app, o);
  app.parse(args, false);
  return o;
}

// The message of the error `fn` throws (CLI or epx), "" if none.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(BenchDataPlaneOptions, DefaultsAreTheLibraryDefaults) {
  const BenchOptions o = parse_bench("");
  const DataPlaneOptions d{};
  EXPECT_EQ(o.dataplane.topology, "builtin:flat");
  EXPECT_EQ(o.dataplane.schedule.kind, ScheduleKind::kRotated);
  EXPECT_EQ(o.dataplane.queues, 1);
  EXPECT_EQ(o.dataplane.queue_split.kind, QueueSplitKind::kRoundRobin);
  EXPECT_EQ(o.dataplane.aggregate_bytes, std::size_t{1} << 20);
  EXPECT_EQ(o.dataplane.aggregate_bytes, d.aggregate_bytes);
  EXPECT_EQ(o.dataplane.protocol, Protocol::kExplicit);
  EXPECT_EQ(o.dataplane.send_policy.kind, SendPolicyKind::kAuto);
  EXPECT_EQ(describe_dataplane(o.dataplane),
            "topology builtin:flat, schedule rotated, 1 queue (split rr), aggregate 1M, protocol explicit, send policy auto");
}

TEST(BenchDataPlaneOptions, EveryFlagLandsInTheDataPlane) {
  const BenchOptions o = parse_bench(
      "--topology builtin:servers:2 --schedule grouped:2 --queues 2 --queue-split 3:1 --aggregate 64K --protocol tail");
  EXPECT_EQ(o.dataplane.topology, "builtin:servers:2");
  EXPECT_EQ(o.dataplane.schedule.kind, ScheduleKind::kGrouped);
  EXPECT_EQ(o.dataplane.schedule.group_width, 2);
  EXPECT_EQ(o.dataplane.queues, 2);
  EXPECT_EQ(o.dataplane.queue_split.kind, QueueSplitKind::kRatio);
  EXPECT_EQ(o.dataplane.queue_split.ratio, (std::vector<int>{3, 1}));
  EXPECT_EQ(o.dataplane.aggregate_bytes, 64u * 1024);
  EXPECT_EQ(o.dataplane.protocol, Protocol::kTail);
  EXPECT_NO_THROW(validate_options(o));

  const BenchOptions p = parse_bench("--schedule hierarchical --queues 4 --queue-split bytes --aggregate 0 --protocol flag");
  EXPECT_EQ(p.dataplane.schedule.kind, ScheduleKind::kHierarchical);
  EXPECT_EQ(p.dataplane.queues, 4);
  EXPECT_EQ(p.dataplane.queue_split.kind, QueueSplitKind::kBytes);
  EXPECT_EQ(p.dataplane.aggregate_bytes, 0u);
  EXPECT_EQ(p.dataplane.protocol, Protocol::kFlag);
  EXPECT_EQ(parse_bench("--schedule flat --aggregate 4096").dataplane.schedule.kind, ScheduleKind::kFlat);
  EXPECT_EQ(parse_bench("--aggregate 4096").dataplane.aggregate_bytes, 4096u);
  EXPECT_EQ(parse_bench("--aggregate 2m").dataplane.aggregate_bytes, 2u << 20);
  EXPECT_EQ(parse_bench("--send-policy whole").dataplane.send_policy.kind, SendPolicyKind::kWhole);
  const SendPolicy block = parse_bench("--send-policy block:256K").dataplane.send_policy;
  EXPECT_EQ(block.kind, SendPolicyKind::kBlock);
  EXPECT_EQ(block.block_bytes, 256u << 10);
  EXPECT_EQ(dataplane_option_value(parse_bench("--send-policy block:262144").dataplane, "send-policy"), "block:256K");
  // --sweep takes one KEY=V1,V2 per occurrence.
  EXPECT_EQ(parse_bench("--sweep queues=1,2 --sweep schedule=flat --queues 2").sweep,
            (std::vector<std::string>{"queues=1,2", "schedule=flat"}));
}

TEST(BenchDataPlaneOptions, BadValuesAreParseErrorsNamingTheFlag) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--schedule", "diagonal"},
           {"--schedule", "grouped:0"},
           {"--queues", "3"},
           {"--queues", "two"},
           {"--queue-split", "3:x"},
           {"--queue-split", "4"},
           {"--aggregate", "12Q"},
           {"--aggregate", "-1"},
           {"--protocol", "pull"},
           {"--send-policy", "block:0"},
           {"--send-policy", "blocks"}}) {
    SCOPED_TRACE(flag + " " + value);
    const std::string what = error_of([&] { parse_bench(flag + " " + value); });
    EXPECT_NE(what.find(flag + ":"), std::string::npos) << what;
    EXPECT_NE(what.find(value), std::string::npos) << what;
  }
  // The parse_* message itself is kept: it lists what is accepted.
  EXPECT_NE(error_of([] { parse_bench("--schedule diagonal"); }).find("flat, rotated, grouped:W"), std::string::npos);
}

TEST(BenchDataPlaneOptions, RatioSplitNeedsOnePartPerQueue) {
  BenchOptions o = parse_bench("--queue-split 3:1");  // parses: --queues may come later, or from a sweep
  const std::string what = error_of([&] { validate_options(o); });
  EXPECT_NE(what.find("--queue-split 3:1"), std::string::npos) << what;
  EXPECT_NE(what.find("--queues is 1"), std::string::npos) << what;
  o = parse_bench("--queues 4 --queue-split 1:1");
  EXPECT_NE(error_of([&] { validate_options(o); }).find("has 2 parts but --queues is 4"), std::string::npos);
  EXPECT_NO_THROW(validate_options(parse_bench("--queues 4 --queue-split 1:2:3:4")));
  EXPECT_NO_THROW(validate_options(parse_bench("--queues 4 --queue-split rr")));
}

TEST(BenchDataPlaneOptions, CombinationsThatCannotWorkAreRefusedUpFront) {
  auto refused = [](const std::string& args, const std::string& expect) {
    SCOPED_TRACE(args);
    const std::string what = error_of([&] { validate_options(parse_bench(args)); });
    EXPECT_NE(what.find(expect), std::string::npos) << what;
  };
  // The table and the schedule are the engine's own (load_topology, peer_rounds).
  refused("--ranks 8 --schedule grouped:3", "--schedule grouped:3: schedule grouped:3 does not fit topology 'builtin:flat': W must divide the 8 ranks");
  refused("--ranks 8 --schedule hierarchical", "single server");
  refused("--ranks 8 --schedule hierarchical --topology builtin:servers:3", "servers of 3 ranks do not divide the job's 8 ranks");
  refused("--ranks 8 --topology builtin:supernode128", "describes 128 ranks");
  refused("--ranks 8 --topology builtin:ring", "--topology: topology 'builtin:ring': unknown builtin topology");
  refused("--ranks 8 --topology /no/such/topology.json", "cannot read the file");
  refused("--zero-copy --protocol flag", "--protocol flag");
  refused("--sweep queues=1,2 --trace t.json", "--trace");
  EXPECT_NO_THROW(validate_options(parse_bench("--ranks 8 --schedule hierarchical --topology builtin:servers:4")));
  EXPECT_NO_THROW(validate_options(parse_bench("--ranks 8 --schedule grouped:4")));
  // A path is named by a registered base path's key; the refusal names what can be named.
  refused("--path whole", "--path: data-plane path 'whole' is not a registered base path; the registered ones: 'direct', 'relay', 'ring'");
  refused("--path pull", "'rows_first', 'pull': per-call variants");
  EXPECT_NO_THROW(validate_options(parse_bench("--path direct")));
  EXPECT_NO_THROW(validate_options(parse_bench("--path auto")));
}

TEST(BenchDataPlaneOptions, ByteSizesRoundTrip) {
  EXPECT_EQ(parse_byte_size("0"), 0u);
  EXPECT_EQ(parse_byte_size("1000"), 1000u);
  EXPECT_EQ(parse_byte_size("64K"), 65536u);
  EXPECT_EQ(parse_byte_size("1M"), 1u << 20);
  EXPECT_EQ(parse_byte_size("1g"), 1u << 30);
  for (const char* bad : {"", "K", "1.5M", "1MB", "-4", " 4", "99999999999999999999"}) EXPECT_THROW(parse_byte_size(bad), Error) << bad;
  EXPECT_EQ(byte_size_text(0), "0");
  EXPECT_EQ(byte_size_text(1000), "1000");
  EXPECT_EQ(byte_size_text(65536), "64K");
  EXPECT_EQ(byte_size_text(1u << 20), "1M");
  EXPECT_EQ(byte_size_text(3u << 30), "3G");
  for (const std::string& name : dataplane_option_names()) {
    DataPlaneOptions d;
    set_dataplane_option(d, name, dataplane_option_value(d, name));  // the canonical text parses back
  }
}

TEST(BenchDataPlaneOptions, ReplayHasTheSameFlags) {
  CLI::App app;
  add_replay_command(app);
  // A bad value fails while parsing, before the replay (which would need --in) runs.
  const std::string what = error_of([&] { app.parse("replay --in /nonexistent --out /nonexistent --queues 3", false); });
  EXPECT_NE(what.find("--queues:"), std::string::npos) << what;
  const std::string protocol = error_of([&] {
    CLI::App again;
    add_replay_command(again);
    again.parse("replay --in /nonexistent --out /nonexistent --protocol pull", false);
  });
  EXPECT_NE(protocol.find("--protocol:"), std::string::npos) << protocol;
}

namespace {
class BenchDataPlaneRun : public epx::testing::BenchTest {};
}  // namespace

TEST_F(BenchDataPlaneRun, ReportAndJsonRecordTheDataPlaneAndEveryQueue) {
  BenchOptions o = parse_bench("--ranks 2 --hidden 256 --topk 2 --experts 4 --tokens 16 --iters 2 --warmup 1 "
                               "--counters-overhead 0 --transport threads --no-progress "
                               "--queues 2 --queue-split 1:3 --aggregate 64K --protocol tail --schedule flat");
  o.json = (dir_ / "bench.json").string();
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ASSERT_EQ(run_bench(o, f), 0);
  std::fclose(f);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_NE(text.find("data plane: topology builtin:flat, schedule flat, 2 queues (split 1:3), aggregate 64K, protocol tail"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("queue 1 (all ranks)"), std::string::npos);
  EXPECT_EQ(text.find("queue 2 (all ranks)"), std::string::npos);  // only queues < --queues
  EXPECT_NE(text.find("payload check: epx's byte counters = the independent count"), std::string::npos);

  std::ifstream in(o.json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["dataplane"]["topology"], "builtin:flat");
  EXPECT_EQ(j["dataplane"]["schedule"], "flat");
  EXPECT_EQ(j["dataplane"]["queues"], 2);
  EXPECT_EQ(j["dataplane"]["queue_split"], "1:3");
  EXPECT_EQ(j["dataplane"]["aggregate_bytes"], 65536);
  EXPECT_EQ(j["dataplane"]["protocol"], "tail");
  for (const char* op : {"dispatch", "combine"}) {
    SCOPED_TRACE(op);
    const auto& q = j[op]["queues"];
    for (const char* k : {"puts", "bytes", "wait_us"}) EXPECT_EQ(q[k].size(), 2u) << k;
    for (const char* k : {"puts_per_rank", "bytes_per_rank", "wait_us_per_rank"}) {
      ASSERT_EQ(q[k].size(), 2u) << k;  // ranks
      EXPECT_EQ(q[k][0].size(), 2u) << k;  // queues
    }
    // Every put is on one of the queues: the per-queue bytes add up to the engine's bytes.
    double queued = 0, engine = 0;
    for (const auto& b : q["bytes"]) queued += b.get<double>();
    for (const auto& b : j[op]["engine_bytes_per_rank"]) engine += b.get<double>();
    EXPECT_DOUBLE_EQ(queued, engine);
  }
}
