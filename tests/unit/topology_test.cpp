// Unit tests of the topology tables (epx/topology.hpp): builtins, JSON format, errors.
#include "epx/topology.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "epx/error.hpp"

namespace fs = std::filesystem;
using epx::ErrorCode;
using epx::load_topology;
using epx::parse_topology_json;
using epx::RankPlace;
using epx::Topology;

namespace {

// Runs `f`, expects an epx::Error(kInvalidArgument) whose message contains every word.
template <class F>
void expect_invalid(F&& f, std::initializer_list<const char*> words) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const epx::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (const char* w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << w << " not in: " << e.what();
  }
}

std::string one_rank(int rank, const std::string& extra = "") {
  return "{\"rank\": " + std::to_string(rank) +
         ", \"server\": 0, \"frame\": 0, \"row\": 0, \"column\": 0, \"lane\": 0" + extra + "}";
}

class TopologyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("epx_topology_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  fs::path dir_;
};

}  // namespace

TEST(Topology, FlatPutsEveryRankInOneServer) {
  const Topology t = load_topology("builtin:flat", 5);
  EXPECT_EQ(t.name, "builtin:flat");
  ASSERT_EQ(t.num_ranks(), 5);
  for (int r = 0; r < 5; ++r) {
    const RankPlace& x = t.ranks[static_cast<std::size_t>(r)];
    EXPECT_EQ(x.server, 0);
    EXPECT_EQ(x.frame, 0);
    EXPECT_EQ(x.row, 0);
    EXPECT_EQ(x.column, r);
    EXPECT_EQ(x.lane, r);
    EXPECT_EQ(x.group, 0);
  }
}

TEST(Topology, ServersOfN) {
  const Topology t = load_topology("builtin:servers:4", 12);
  EXPECT_EQ(t.name, "builtin:servers:4");
  ASSERT_EQ(t.num_ranks(), 12);
  for (int r = 0; r < 12; ++r) {
    const RankPlace& x = t.ranks[static_cast<std::size_t>(r)];
    EXPECT_EQ(x.server, r / 4);
    EXPECT_EQ(x.lane, r % 4);
    EXPECT_EQ(x.row, r / 4);
    EXPECT_EQ(x.column, r % 4);
    EXPECT_EQ(x.group, r / 4);
    EXPECT_EQ(x.frame, 0);
  }
  // N = P and N = 1 are valid extremes.
  EXPECT_EQ(load_topology("builtin:servers:12", 12).ranks[11].lane, 11);
  EXPECT_EQ(load_topology("builtin:servers:1", 12).ranks[11].server, 11);
}

TEST(Topology, Supernode128) {
  const Topology t = load_topology("builtin:supernode128", 128);
  ASSERT_EQ(t.num_ranks(), 128);
  // Spot values: rank 77 = frame 1, row 1, column 5 -> group 4 + 0 + 1 = 5.
  const RankPlace& x = t.ranks[77];
  EXPECT_EQ(x.frame, 1);
  EXPECT_EQ(x.row, 1);
  EXPECT_EQ(x.column, 5);
  EXPECT_EQ(x.server, 9);
  EXPECT_EQ(x.lane, 5);
  EXPECT_EQ(x.group, 5);
  // Rank 38 = frame 0, row 4, column 6 -> group 0 + 2 + 1 = 3.
  EXPECT_EQ(t.ranks[38].group, 3);
  std::vector<int> group_size(8, 0), server_size(16, 0);
  for (int r = 0; r < 128; ++r) {
    const RankPlace& p = t.ranks[static_cast<std::size_t>(r)];
    EXPECT_EQ(p.frame, r / 64);
    EXPECT_EQ(p.row, (r % 64) / 8);
    EXPECT_EQ(p.column, r % 8);
    EXPECT_EQ(p.server, r / 8);
    EXPECT_EQ(p.lane, r % 8);
    EXPECT_EQ(p.group, p.frame * 4 + (p.row / 4) * 2 + p.column / 4);
    ++group_size[static_cast<std::size_t>(p.group)];
    ++server_size[static_cast<std::size_t>(p.server)];
  }
  for (int n : group_size) EXPECT_EQ(n, 16);
  for (int n : server_size) EXPECT_EQ(n, 8);
}

TEST(Topology, JsonRoundTrip) {
  for (const auto& [spec, p] : {std::pair{"builtin:flat", 3}, {"builtin:servers:2", 6}, {"builtin:supernode128", 128}}) {
    const Topology t = load_topology(spec, p);
    const Topology back = parse_topology_json(epx::to_json(t), "round trip");
    EXPECT_EQ(back.name, t.name);
    ASSERT_EQ(back.num_ranks(), p);
    for (int r = 0; r < p; ++r) {
      const RankPlace &a = t.ranks[static_cast<std::size_t>(r)], &b = back.ranks[static_cast<std::size_t>(r)];
      EXPECT_EQ(std::tie(a.server, a.frame, a.row, a.column, a.lane, a.group),
                std::tie(b.server, b.frame, b.row, b.column, b.lane, b.group))
          << spec << " rank " << r;
    }
  }
}

TEST(Topology, JsonRanksInAnyOrderGroupDefaultsToServer) {
  const Topology t = parse_topology_json(
      R"({"ranks": [{"rank": 1, "server": 3, "frame": 2, "row": 4, "column": 5, "lane": 6},
                    {"rank": 0, "server": 7, "frame": 0, "row": 0, "column": 0, "lane": 0, "group": 9}]})",
      "inline");
  EXPECT_EQ(t.name, "inline");  // no "name": the source
  ASSERT_EQ(t.num_ranks(), 2);
  EXPECT_EQ(t.ranks[1].server, 3);
  EXPECT_EQ(t.ranks[1].frame, 2);
  EXPECT_EQ(t.ranks[1].row, 4);
  EXPECT_EQ(t.ranks[1].column, 5);
  EXPECT_EQ(t.ranks[1].lane, 6);
  EXPECT_EQ(t.ranks[1].group, 3);  // default: server
  EXPECT_EQ(t.ranks[0].server, 7);
  EXPECT_EQ(t.ranks[0].group, 9);
}

TEST(Topology, BuiltinErrors) {
  expect_invalid([] { load_topology("builtin:ring", 8); }, {"builtin:ring", "unknown", "builtin:servers:N"});
  expect_invalid([] { load_topology("builtin:servers:3", 8); }, {"builtin:servers:3", "divide", "8"});
  expect_invalid([] { load_topology("builtin:servers:0", 8); }, {"builtin:servers:0", "positive"});
  expect_invalid([] { load_topology("builtin:servers:-2", 8); }, {"builtin:servers:-2", "positive"});
  expect_invalid([] { load_topology("builtin:servers:x", 8); }, {"builtin:servers:x", "positive"});
  expect_invalid([] { load_topology("builtin:supernode128", 64); },
                 {"builtin:supernode128 describes 128 ranks, the job has 64"});
  expect_invalid([] { load_topology("builtin:flat", 0); }, {"builtin:flat", "at least 1"});
}

TEST_F(TopologyFile, LoadsAFileNamedByItsPath) {
  const std::string path = write("t.json", epx::to_json(load_topology("builtin:servers:2", 4)));
  const Topology t = load_topology(path, 4);
  EXPECT_EQ(t.name, path);  // the path, not the "name" inside the file
  ASSERT_EQ(t.num_ranks(), 4);
  EXPECT_EQ(t.ranks[3].server, 1);
  EXPECT_EQ(t.ranks[3].lane, 1);
  EXPECT_EQ(t.ranks[2].group, 1);
}

TEST_F(TopologyFile, FileErrors) {
  const std::string missing = (dir_ / "nope.json").string();
  expect_invalid([&] { load_topology(missing, 4); }, {"nope.json", "cannot read"});

  const std::string bad = write("bad.json", "{\"ranks\": [");
  expect_invalid([&] { load_topology(bad, 4); }, {"bad.json", "malformed JSON", "parse error"});
  // A number no double holds is nlohmann's out_of_range, not a parse_error (found by fuzz_topology).
  const std::string huge = write("huge.json", "4407E44407");
  expect_invalid([&] { load_topology(huge, 4); }, {"huge.json", "malformed JSON", "number overflow"});

  const std::string four = write("four.json", epx::to_json(load_topology("builtin:flat", 4)));
  expect_invalid([&] { load_topology(four, 8); }, {"four.json", "describes 4 ranks, the job has 8"});
}

TEST(Topology, JsonContentErrors) {
  const auto table = [](const std::string& ranks) { return "{\"ranks\": [" + ranks + "]}"; };
  expect_invalid([&] { parse_topology_json(table(one_rank(0) + "," + one_rank(0)), "dup.json"); },
                 {"dup.json", "rank 0 is duplicated"});
  expect_invalid([&] { parse_topology_json(table(one_rank(0) + "," + one_rank(2)), "range.json"); },
                 {"range.json", "rank 2 is out of range", "rank 1 is missing"});
  expect_invalid([&] { parse_topology_json(table(one_rank(-1)), "neg.json"); }, {"neg.json", "rank", "negative"});
  expect_invalid(
      [&] {
        parse_topology_json(table(R"({"rank": 0, "server": 0, "frame": 0, "row": -3, "column": 0, "lane": 0})"),
                            "negrow.json");
      },
      {"negrow.json", "ranks[0].row", "negative"});
  expect_invalid(
      [&] { parse_topology_json(table(R"({"rank": 0, "server": 0, "frame": 0, "row": 0, "column": 0})"), "m.json"); },
      {"m.json", "ranks[0]", "no \"lane\""});
  expect_invalid([&] { parse_topology_json(table(R"({"server": 0})"), "norank.json"); }, {"norank.json", "no \"rank\""});
  expect_invalid([&] { parse_topology_json(table(one_rank(0, ", \"colum\": 1")), "typo.json"); },
                 {"typo.json", "unknown key \"colum\""});
  expect_invalid([&] { parse_topology_json(table(one_rank(0, ", \"group\": 1.5")), "f.json"); },
                 {"f.json", "group", "integer"});
  expect_invalid([&] { parse_topology_json("{\"ranks\": []}", "empty.json"); }, {"empty.json", "non-empty"});
  expect_invalid([&] { parse_topology_json("[1, 2]", "arr.json"); }, {"arr.json", "object"});
  expect_invalid([&] { parse_topology_json("{\"name\": 3, \"ranks\": [" + one_rank(0) + "]}", "n.json"); },
                 {"n.json", "\"name\"", "string"});
}
