#include "epx/bench/launched_job.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "epx/error.hpp"

namespace epx::tools {

std::vector<std::string> gather_blobs(Bootstrap& boot, const std::string& mine) {
  const auto P = static_cast<std::size_t>(boot.size());
  std::uint64_t len = mine.size();
  std::vector<std::uint64_t> lens(P);
  boot.allgather(&len, lens.data(), sizeof len);
  const std::size_t max = *std::max_element(lens.begin(), lens.end());
  std::string padded = mine;
  padded.resize(max);
  std::string all(max * P, '\0');
  boot.allgather(padded.data(), all.data(), max);
  std::vector<std::string> out(P);
  for (std::size_t r = 0; r < P; ++r) out[r] = all.substr(r * max, lens[r]);
  return out;
}

std::string describe_nodes(Bootstrap& boot, const NodeMap& nodes) {
  const std::string id = local_node_identity();
  const auto hosts = gather_blobs(boot, id.substr(id.rfind('/') + 1));
  std::string s;
  for (int n = 0; n < nodes.num_nodes; ++n) {
    const auto ranks = nodes.ranks_of(n);
    s += (n ? "; node " : "node ") + std::to_string(n) + " (" + hosts[static_cast<std::size_t>(ranks.front())] + "): ranks";
    for (int r : ranks) s += " " + std::to_string(r);
  }
  return s;
}

void default_topology_from_nodes(DataPlaneOptions& dp, Bootstrap& boot, const NodeMap& nodes, const std::string& who) {
  if (dp.schedule.kind != ScheduleKind::kHierarchical || dp.topology != DataPlaneOptions{}.topology || nodes.num_nodes < 2)
    return;
  const int per = nodes.uniform_ranks_per_node();
  bool consecutive = per > 0;
  for (int r = 0; consecutive && r < boot.size(); ++r) consecutive = nodes.node_of_rank[static_cast<std::size_t>(r)] == r / per;
  if (!consecutive)
    throw Error(ErrorCode::kInvalidArgument, who + ": --schedule hierarchical needs equal, consecutive ranks per node "
                                                   "(the launcher placed " + describe_nodes(boot, nodes) + "); pass --topology");
  dp.topology = "builtin:servers:" + std::to_string(per);
}

void agree(Bootstrap& boot, const std::function<void()>& step) {
  // "" = done; else <code>\n<origin rank>\n<message>.
  std::string mine;
  try {
    step();
  } catch (const Error& e) {
    // A peer that timed out or died may be gone: no agreement (it would wait for it without a deadline).
    if (e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerFailed) throw;
    mine = std::to_string(static_cast<int>(e.code())) + "\n" + std::to_string(e.origin_rank()) + "\n" + e.what();
  } catch (const std::exception& e) {
    mine = std::to_string(static_cast<int>(ErrorCode::kInternal)) + "\n" + std::to_string(boot.rank()) + "\n" +
           "rank " + std::to_string(boot.rank()) + ": " + e.what();
  }
  const auto all = gather_blobs(boot, mine);
  for (const std::string& s : all) {
    if (s.empty()) continue;
    const auto a = s.find('\n'), b = s.find('\n', a + 1);
    throw Error(static_cast<ErrorCode>(std::stoi(s.substr(0, a))), s.substr(b + 1), std::stoi(s.substr(a + 1, b - a - 1)));
  }
}

}  // namespace epx::tools
