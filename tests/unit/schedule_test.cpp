// Unit tests of the peer schedules and the queue split (epx/schedule.hpp).
#include "epx/schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "epx/error.hpp"

using epx::assign_queues;
using epx::ErrorCode;
using epx::load_topology;
using epx::parse_queue_split;
using epx::parse_schedule;
using epx::peer_rounds;
using epx::relay_rank;
using epx::Topology;
using Rounds = std::vector<std::vector<int>>;
using Bytes = std::vector<std::uint64_t>;

namespace {

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

std::vector<int> flatten(const Rounds& rounds) {
  std::vector<int> all;
  for (const auto& r : rounds) all.insert(all.end(), r.begin(), r.end());
  return all;
}

std::vector<int> iota(int n, int from = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Every rank 0..P-1 exactly once over all rounds, for every source rank.
void expect_each_destination_once(const std::string& schedule, const Topology& t) {
  for (int rank = 0; rank < t.num_ranks(); ++rank) {
    std::vector<int> all = flatten(peer_rounds(parse_schedule(schedule), t, rank));
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all, iota(t.num_ranks())) << schedule << " on " << t.name << " from rank " << rank;
  }
}

// The grouped:W guarantees, checked over all source ranks: P/W rounds of W; in each round
// the source-group -> target-group map is a bijection; at each step of a round the W
// sources of a group reach W distinct ranks. `group_of` is recovered from round 0, whose
// targets are the source's own group.
void expect_grouped_properties(const Topology& t, int w) {
  const int p = t.num_ranks(), g_count = p / w;
  std::vector<Rounds> all(static_cast<std::size_t>(p));
  std::map<int, int> group_of;  // rank -> index of its group (its smallest member)
  for (int s = 0; s < p; ++s) {
    all[static_cast<std::size_t>(s)] = peer_rounds(parse_schedule("grouped:" + std::to_string(w)), t, s);
    const Rounds& rounds = all[static_cast<std::size_t>(s)];
    ASSERT_EQ(static_cast<int>(rounds.size()), g_count);
    for (const auto& round : rounds) ASSERT_EQ(static_cast<int>(round.size()), w);
    EXPECT_EQ(rounds[0][0], s) << "round 0 starts with the rank itself";
    group_of[s] = *std::min_element(rounds[0].begin(), rounds[0].end());
  }
  for (int r = 0; r < g_count; ++r) {
    std::map<int, std::set<int>> sources_of_target;  // target group -> source groups
    for (int s = 0; s < p; ++s)
      for (int dst : all[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)])
        sources_of_target[group_of[dst]].insert(group_of[s]);
    EXPECT_EQ(static_cast<int>(sources_of_target.size()), g_count) << "round " << r;
    for (const auto& [target, sources] : sources_of_target)
      EXPECT_EQ(sources.size(), 1u) << "round " << r << " target group " << target;
    for (int step = 0; step < w; ++step) {
      std::map<int, std::set<int>> hit;  // source group -> targets at this step
      for (int s = 0; s < p; ++s)
        hit[group_of[s]].insert(all[static_cast<std::size_t>(s)][static_cast<std::size_t>(r)][static_cast<std::size_t>(step)]);
      for (const auto& [g, targets] : hit) EXPECT_EQ(static_cast<int>(targets.size()), w) << "round " << r << " step " << step;
    }
  }
}

Topology custom(const std::vector<std::pair<int, int>>& server_lane) {
  Topology t;
  t.name = "custom";
  for (const auto& [server, lane] : server_lane) {
    epx::RankPlace x;
    x.server = server;
    x.lane = lane;
    x.group = server;
    t.ranks.push_back(x);
  }
  return t;
}

}  // namespace

TEST(Schedule, EveryDestinationOnceForEveryScheduleAndSize) {
  for (int p : {1, 2, 3, 4, 8, 16, 128}) {
    const Topology flat = load_topology("builtin:flat", p);
    expect_each_destination_once("flat", flat);
    expect_each_destination_once("rotated", flat);
    for (int w = 1; w <= p; ++w)
      if (p % w == 0) expect_each_destination_once("grouped:" + std::to_string(w), flat);
  }
  const Topology sn = load_topology("builtin:supernode128", 128);
  for (int w : {8, 16, 32, 128}) expect_each_destination_once("grouped:" + std::to_string(w), sn);
}

TEST(Schedule, FlatIsOneRoundInRankOrder) {
  const Topology t = load_topology("builtin:flat", 8);
  EXPECT_EQ(peer_rounds(parse_schedule("flat"), t, 5), Rounds{iota(8)});
}

TEST(Schedule, RotatedStartsWithTheRankItself) {
  const Topology t = load_topology("builtin:flat", 8);
  EXPECT_EQ(peer_rounds(parse_schedule("rotated"), t, 5), (Rounds{{5, 6, 7, 0, 1, 2, 3, 4}}));
  for (int p : {1, 3, 16})
    for (int rank = 0; rank < p; ++rank)
      EXPECT_EQ(peer_rounds(parse_schedule("rotated"), load_topology("builtin:flat", p), rank)[0][0], rank);
}

TEST(Schedule, RejectsARankOutsideTheTable) {
  const Topology t = load_topology("builtin:flat", 4);
  expect_invalid([&] { peer_rounds(parse_schedule("flat"), t, 4); }, {"rank 4", "out of range", "4 ranks"});
}

TEST(Schedule, GroupedSupernodeUsesTheTableGroups) {
  const Topology t = load_topology("builtin:supernode128", 128);
  const Rounds r = peer_rounds(parse_schedule("grouped:16"), t, 0);
  ASSERT_EQ(r.size(), 8u);
  // Group 0 = frame 0, rows 0-3, columns 0-3; rank 0 is its index 0.
  EXPECT_EQ(r[0], (std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}));
  // Round 1 -> group 1 = columns 4-7 of the same rows.
  EXPECT_EQ(r[1], (std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}));
  // Rank 9 = group 0 index 5: round 4 goes to group 4 (frame 1, first block), rotated by 5.
  const Rounds r9 = peer_rounds(parse_schedule("grouped:16"), t, 9);
  EXPECT_EQ(r9[4], (std::vector<int>{73, 74, 75, 80, 81, 82, 83, 88, 89, 90, 91, 64, 65, 66, 67, 72}));
  for (const auto& round : r)
    for (int dst : round) EXPECT_EQ(t.ranks[static_cast<std::size_t>(dst)].group, t.ranks[static_cast<std::size_t>(round[0])].group);
  expect_grouped_properties(t, 16);
}

TEST(Schedule, GroupedOtherWidthsOnSupernode) {
  const Topology t = load_topology("builtin:supernode128", 128);
  for (int w : {8, 32, 128}) expect_grouped_properties(t, w);
  // W=8 falls back to runs of 8 in (frame, row, column) order: the rows (= servers).
  const Rounds r = peer_rounds(parse_schedule("grouped:8"), t, 10);
  ASSERT_EQ(r.size(), 16u);
  EXPECT_EQ(r[0], (std::vector<int>{10, 11, 12, 13, 14, 15, 8, 9}));
  EXPECT_EQ(r[15], (std::vector<int>{2, 3, 4, 5, 6, 7, 0, 1}));
  // W=32: half frames (rows 0-3, rows 4-7), 4 rounds.
  EXPECT_EQ(peer_rounds(parse_schedule("grouped:32"), t, 0)[1], iota(32, 32));
  // W=P: one round, the same as rotated.
  EXPECT_EQ(peer_rounds(parse_schedule("grouped:128"), t, 77), peer_rounds(parse_schedule("rotated"), t, 77));
}

TEST(Schedule, GroupedSmallWidthsOnEightRanks) {
  const Topology t = load_topology("builtin:flat", 8);
  expect_grouped_properties(t, 2);
  expect_grouped_properties(t, 4);
  // Rank 3 = group {2,3} index 1.
  EXPECT_EQ(peer_rounds(parse_schedule("grouped:2"), t, 3), (Rounds{{3, 2}, {5, 4}, {7, 6}, {1, 0}}));
  EXPECT_EQ(peer_rounds(parse_schedule("grouped:4"), t, 6), (Rounds{{6, 7, 4, 5}, {2, 3, 0, 1}}));
  // servers:4 has groups of 4 in its table: the same groups here.
  EXPECT_EQ(peer_rounds(parse_schedule("grouped:4"), load_topology("builtin:servers:4", 8), 6),
            (Rounds{{6, 7, 4, 5}, {2, 3, 0, 1}}));
}

TEST(Schedule, GroupedOrdersFallbackRunsByPosition) {
  // Ranks listed out of physical order: the fallback groups follow (frame, row, column).
  Topology t = load_topology("builtin:flat", 4);
  for (int r = 0; r < 4; ++r) t.ranks[static_cast<std::size_t>(r)].column = 3 - r;
  EXPECT_EQ(peer_rounds(parse_schedule("grouped:2"), t, 3), (Rounds{{3, 2}, {1, 0}}));
  EXPECT_EQ(peer_rounds(parse_schedule("grouped:2"), t, 0), (Rounds{{0, 1}, {2, 3}}));
}

TEST(Schedule, GroupedWidthMustDivideP) {
  const Topology t = load_topology("builtin:flat", 8);
  expect_invalid([&] { peer_rounds(parse_schedule("grouped:3"), t, 0); }, {"grouped:3", "builtin:flat", "divide", "8"});
  expect_invalid([&] { peer_rounds(parse_schedule("grouped:16"), t, 0); }, {"grouped:16", "divide"});
}

TEST(Schedule, HierarchicalOnFourRankServers) {
  const Topology t = load_topology("builtin:servers:4", 8);
  EXPECT_EQ(peer_rounds(parse_schedule("hierarchical"), t, 5), (Rounds{{5, 6, 7, 4}, {1}}));
  EXPECT_EQ(peer_rounds(parse_schedule("hierarchical"), t, 2), (Rounds{{2, 3, 0, 1}, {6}}));
}

TEST(Schedule, HierarchicalOnSupernode) {
  const Topology t = load_topology("builtin:supernode128", 128);
  for (int rank : {0, 77, 127}) {
    const Rounds r = peer_rounds(parse_schedule("hierarchical"), t, rank);
    ASSERT_EQ(r.size(), 2u);
    const int server = rank / 8, lane = rank % 8;
    std::vector<int> own;
    for (int k = 0; k < 8; ++k) own.push_back(server * 8 + (lane + k) % 8);
    EXPECT_EQ(r[0], own) << rank;
    std::vector<int> relays;
    for (int j = 1; j < 16; ++j) relays.push_back(((server + j) % 16) * 8 + lane);
    EXPECT_EQ(r[1], relays) << rank;
  }
}

TEST(Schedule, HierarchicalVisitsOwnServerAndOneRelayPerServer) {
  for (const auto& [spec, p] : {std::pair{"builtin:servers:4", 8}, {"builtin:servers:2", 16}, {"builtin:servers:1", 3},
                                {"builtin:supernode128", 128}}) {
    const Topology t = load_topology(spec, p);
    for (int rank = 0; rank < p; ++rank) {
      const auto rounds = peer_rounds(parse_schedule("hierarchical"), t, rank);
      std::set<int> servers_seen;
      for (int dst : flatten(rounds)) {
        const auto& d = t.ranks[static_cast<std::size_t>(dst)];
        const auto& me = t.ranks[static_cast<std::size_t>(rank)];
        if (d.server != me.server) {
          EXPECT_EQ(d.lane, me.lane) << spec << " " << rank << " -> " << dst;
        }
        EXPECT_TRUE(servers_seen.insert(d.server).second || d.server == me.server) << "two relays in one server";
      }
      std::vector<int> all = flatten(rounds);
      std::sort(all.begin(), all.end());
      EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a destination twice";
      int servers = 0, size = 0;
      for (const auto& x : t.ranks) {
        servers = std::max(servers, x.server + 1);
        size += x.server == 0 ? 1 : 0;
      }
      EXPECT_EQ(static_cast<int>(all.size()), size + servers - 1) << spec;
    }
  }
}

TEST(Schedule, HierarchicalRefusesTablesWithoutEqualServers) {
  expect_invalid([] { peer_rounds(parse_schedule("hierarchical"), load_topology("builtin:flat", 8), 0); },
                 {"hierarchical", "builtin:flat", "single server"});
  expect_invalid([] { peer_rounds(parse_schedule("hierarchical"), custom({{0, 0}, {0, 1}, {1, 0}}), 0); },
                 {"hierarchical", "custom", "equal size"});
  expect_invalid([] { peer_rounds(parse_schedule("hierarchical"), custom({{0, 0}, {0, 1}, {1, 0}, {1, 2}}), 0); },
                 {"hierarchical", "custom", "lanes", "0..1"});
  expect_invalid([] { peer_rounds(parse_schedule("hierarchical"), custom({{0, 0}, {0, 1}, {1, 1}, {1, 1}}), 0); },
                 {"custom", "lanes"});
}

TEST(Schedule, RelayRank) {
  const Topology t = load_topology("builtin:supernode128", 128);
  EXPECT_EQ(relay_rank(t, 77, 78), 78);   // same server: dst itself
  EXPECT_EQ(relay_rank(t, 77, 0), 5);     // server 0, lane 5
  EXPECT_EQ(relay_rank(t, 77, 127), 125); // server 15, lane 5
  EXPECT_EQ(relay_rank(t, 3, 64), 67);
  // A server without the source's lane has no relay.
  expect_invalid([] { relay_rank(custom({{0, 0}, {0, 1}, {1, 0}}), 1, 2); }, {"custom", "lane 1", "no relay"});
  expect_invalid([&] { relay_rank(t, 0, 128); }, {"destination rank 128", "out of range"});
}

TEST(QueueSplit, RoundRobin) {
  const Bytes b(7, 100);
  EXPECT_EQ(assign_queues(parse_queue_split("rr"), 3, b), (std::vector<int>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(assign_queues(parse_queue_split("rr"), 1, b), std::vector<int>(7, 0));
  EXPECT_TRUE(assign_queues(parse_queue_split("rr"), 2, {}).empty());
}

TEST(QueueSplit, Ratios) {
  const Bytes b(9, 1);
  EXPECT_EQ(assign_queues(parse_queue_split("1:1"), 2, b), (std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(assign_queues(parse_queue_split("3:1"), 2, b), (std::vector<int>{0, 0, 0, 1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(assign_queues(parse_queue_split("1:3"), 2, b), (std::vector<int>{0, 1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(assign_queues(parse_queue_split("2:1:1:1"), 4, b), (std::vector<int>{0, 0, 1, 2, 3, 0, 0, 1, 2}));
}

TEST(QueueSplit, BytesGoToTheLeastLoadedQueue) {
  // loads after each channel: q0=100 | q1=50 | q1=80 | q1=90 | q1=95 | q1=96 (95 < 100)
  EXPECT_EQ(assign_queues(parse_queue_split("bytes"), 2, {100, 50, 30, 10, 5, 1}), (std::vector<int>{0, 1, 1, 1, 1, 1}));
  // Ties go to the lowest queue: all equal -> 0, 1, 2, 0, ...
  EXPECT_EQ(assign_queues(parse_queue_split("bytes"), 3, Bytes(5, 8)), (std::vector<int>{0, 1, 2, 0, 1}));
  // Zero-byte channels keep loads tied: the lowest queue again.
  EXPECT_EQ(assign_queues(parse_queue_split("bytes"), 2, {0, 0, 7, 0}), (std::vector<int>{0, 0, 0, 1}));
}

TEST(QueueSplit, Errors) {
  expect_invalid([] { assign_queues(parse_queue_split("3:1"), 4, Bytes(4, 1)); },
                 {"3:1", "2 weights", "4 queues"});
  expect_invalid([] { assign_queues(parse_queue_split("rr"), 0, Bytes(4, 1)); }, {"queues", "0", "at least 1"});
  epx::QueueSplit zero{epx::QueueSplitKind::kRatio, {1, 0}};
  expect_invalid([&] { assign_queues(zero, 2, Bytes(4, 1)); }, {"1:0", "positive"});
  for (const char* bad : {"", "3", "3:", "3:0", "a:b", "1:-1", "round-robin"})
    expect_invalid([&] { parse_queue_split(bad); }, {"queue split", "rr, bytes"});
  for (const char* bad : {"grouped", "grouped:0", "grouped:x", "tree"})
    expect_invalid([&] { parse_schedule(bad); }, {"schedule", "grouped:W"});
}

TEST(QueueSplit, ParsePrintRoundTrip) {
  for (const char* text : {"rr", "bytes", "1:1", "3:1", "1:3", "2:1:1:1"})
    EXPECT_EQ(epx::to_string(parse_queue_split(text)), text);
  for (const char* text : {"flat", "rotated", "grouped:16", "hierarchical"})
    EXPECT_EQ(epx::to_string(parse_schedule(text)), text);
}
