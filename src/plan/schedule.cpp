// Peer schedules (which destination a rank visits when) and the channel -> queue split.
// Pure functions of the topology table; see include/epx/schedule.hpp for the contract.
#include "epx/schedule.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "epx/error.hpp"

namespace epx {

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, what);
}

const RankPlace& place(const Topology& t, int rank) {
  return t.ranks[static_cast<std::size_t>(rank)];
}

void check_rank(const Topology& t, int rank, const char* what) {
  if (rank < 0 || rank >= t.num_ranks())
    fail(std::string(what) + " " + std::to_string(rank) + " is out of range; topology '" + t.name + "' has " +
         std::to_string(t.num_ranks()) + " ranks");
}

// The P/W groups of grouped:W, each a list of W ranks. Every rank computes the same list, so
// "group g" and "index i in the group" mean the same thing on all ranks.
std::vector<std::vector<int>> make_groups(const Topology& t, int w) {
  const int p = t.num_ranks();
  // The table's own groups when they all have exactly W members: groups ordered by id,
  // members by rank.
  std::map<int, std::vector<int>> by_id;
  for (int r = 0; r < p; ++r) by_id[place(t, r).group].push_back(r);
  const bool table_fits =
      std::all_of(by_id.begin(), by_id.end(), [w](const auto& g) { return static_cast<int>(g.second.size()) == w; });
  std::vector<std::vector<int>> groups;
  if (table_fits) {
    for (auto& [id, members] : by_id) groups.push_back(std::move(members));
    return groups;
  }
  // Otherwise runs of W ranks in physical order, so a group is as compact as the table allows.
  std::vector<int> order(static_cast<std::size_t>(p));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const RankPlace &x = place(t, a), &y = place(t, b);
    return std::tie(x.frame, x.row, x.column, a) < std::tie(y.frame, y.row, y.column, b);
  });
  for (int start = 0; start < p; start += w)
    groups.emplace_back(order.begin() + start, order.begin() + start + w);
  return groups;
}

std::vector<std::vector<int>> grouped(const Topology& t, int rank, int w) {
  const int p = t.num_ranks();
  if (w < 1 || p % w != 0)
    fail("schedule grouped:" + std::to_string(w) + " does not fit topology '" + t.name + "': W must divide the " +
         std::to_string(p) + " ranks");
  const auto groups = make_groups(t, w);
  const int g_count = p / w;
  int my_group = 0, my_index = 0;
  for (int g = 0; g < g_count; ++g)
    for (int i = 0; i < w; ++i)
      if (groups[static_cast<std::size_t>(g)][static_cast<std::size_t>(i)] == rank) {
        my_group = g;
        my_index = i;
      }

  std::vector<std::vector<int>> rounds(static_cast<std::size_t>(g_count));
  for (int r = 0; r < g_count; ++r) {
    // Round r: group g -> group g + r is a shift, so each target group has one source group;
    // rotating by my index spreads the W sources of my group over W distinct targets per step.
    const auto& target = groups[static_cast<std::size_t>((my_group + r) % g_count)];
    for (int k = 0; k < w; ++k) rounds[static_cast<std::size_t>(r)].push_back(target[static_cast<std::size_t>((my_index + k) % w)]);
  }
  return rounds;
}

// Servers ordered by id, each a list of ranks indexed by lane; checks what relays need.
std::vector<std::vector<int>> servers_by_lane(const Topology& t) {
  const std::string where = "schedule hierarchical does not fit topology '" + t.name + "': ";
  std::map<int, std::vector<int>> by_id;
  for (int r = 0; r < t.num_ranks(); ++r) by_id[place(t, r).server].push_back(r);
  if (by_id.size() < 2)
    fail(where + "it has a single server; expected several servers of equal size (e.g. builtin:servers:N)");
  std::vector<std::vector<int>> servers;
  const std::size_t size = by_id.begin()->second.size();
  for (const auto& [id, members] : by_id) {
    if (members.size() != size)
      fail(where + "server " + std::to_string(id) + " has " + std::to_string(members.size()) + " ranks, server " +
           std::to_string(by_id.begin()->first) + " has " + std::to_string(size) + "; expected servers of equal size");
    std::vector<int> by_lane(size, -1);
    for (int r : members) {
      const int lane = place(t, r).lane;
      if (lane < 0 || static_cast<std::size_t>(lane) >= size || by_lane[static_cast<std::size_t>(lane)] != -1)
        fail(where + "server " + std::to_string(id) + " has lanes that are not 0.." + std::to_string(size - 1) +
             " once each (rank " + std::to_string(r) + " has lane " + std::to_string(lane) + ")");
      by_lane[static_cast<std::size_t>(lane)] = r;
    }
    servers.push_back(std::move(by_lane));
  }
  return servers;
}

// Two rounds: my server's ranks (rotated from me), then one relay per other server.
std::vector<std::vector<int>> hierarchical(const Topology& t, int rank) {
  const auto servers = servers_by_lane(t);
  const int s_count = static_cast<int>(servers.size());
  const int n = static_cast<int>(servers.front().size());
  const int my_lane = place(t, rank).lane;
  int my_server = 0;
  for (int s = 0; s < s_count; ++s)
    if (servers[static_cast<std::size_t>(s)][static_cast<std::size_t>(my_lane)] == rank) my_server = s;

  std::vector<std::vector<int>> rounds(2);
  const auto& mine = servers[static_cast<std::size_t>(my_server)];
  for (int k = 0; k < n; ++k) rounds[0].push_back(mine[static_cast<std::size_t>((my_lane + k) % n)]);
  for (int j = 1; j < s_count; ++j) {
    const auto& other = servers[static_cast<std::size_t>((my_server + j) % s_count)];
    rounds[1].push_back(relay_rank(t, rank, other.front()));
  }
  return rounds;
}

}  // namespace

std::vector<std::vector<int>> peer_rounds(const Schedule& schedule, const Topology& topology, int rank) {
  check_rank(topology, rank, "rank");
  const int p = topology.num_ranks();
  std::vector<int> one_round(static_cast<std::size_t>(p));
  switch (schedule.kind) {
    case ScheduleKind::kFlat:
      std::iota(one_round.begin(), one_round.end(), 0);
      return {one_round};
    case ScheduleKind::kRotated:
      for (int i = 0; i < p; ++i) one_round[static_cast<std::size_t>(i)] = (rank + i) % p;
      return {one_round};
    case ScheduleKind::kGrouped:
      return grouped(topology, rank, schedule.group_width);
    case ScheduleKind::kHierarchical:
      return hierarchical(topology, rank);
  }
  fail("unknown schedule kind");
}

int relay_rank(const Topology& topology, int src, int dst) {
  check_rank(topology, src, "source rank");
  check_rank(topology, dst, "destination rank");
  const RankPlace &s = place(topology, src), &d = place(topology, dst);
  if (s.server == d.server) return dst;
  for (int r = 0; r < topology.num_ranks(); ++r)
    if (place(topology, r).server == d.server && place(topology, r).lane == s.lane) return r;
  fail("topology '" + topology.name + "': server " + std::to_string(d.server) + " (of rank " + std::to_string(dst) +
       ") has no rank with lane " + std::to_string(s.lane) + " (the lane of rank " + std::to_string(src) +
       "), so it has no relay for it");
}

std::vector<int> assign_queues(const QueueSplit& split, int queues, const std::vector<std::uint64_t>& channel_bytes) {
  if (queues < 1) fail("queues is " + std::to_string(queues) + "; expected at least 1");
  const std::size_t n = channel_bytes.size();
  std::vector<int> out(n);
  switch (split.kind) {
    case QueueSplitKind::kRoundRobin:
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<int>(i % static_cast<std::size_t>(queues));
      return out;
    case QueueSplitKind::kRatio: {
      if (static_cast<int>(split.ratio.size()) != queues)
        fail("queue split " + to_string(split) + " has " + std::to_string(split.ratio.size()) + " weights, there are " +
             std::to_string(queues) + " queues; expected one weight per queue");
      if (std::any_of(split.ratio.begin(), split.ratio.end(), [](int w) { return w < 1; }))
        fail("queue split " + to_string(split) + " has a weight below 1; expected positive weights");
      // One period of sum(weights) channels: weight[0] to queue 0, then weight[1] to queue 1, ...
      std::vector<int> period;
      for (int q = 0; q < queues; ++q) period.insert(period.end(), static_cast<std::size_t>(split.ratio[static_cast<std::size_t>(q)]), q);
      for (std::size_t i = 0; i < n; ++i) out[i] = period[i % period.size()];
      return out;
    }
    case QueueSplitKind::kBytes: {
      std::vector<std::uint64_t> load(static_cast<std::size_t>(queues), 0);
      for (std::size_t i = 0; i < n; ++i) {
        // min_element returns the first minimum: ties go to the lowest queue.
        const auto q = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        load[q] += channel_bytes[i];
        out[i] = static_cast<int>(q);
      }
      return out;
    }
  }
  fail("unknown queue split kind");
}

}  // namespace epx
