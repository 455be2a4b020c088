#include "epx/bench/launched_job.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "epx/error.hpp"

namespace epx::tools {

std::string describe_nodes(Bootstrap& boot, const NodeMap& nodes) {
  const std::string id = local_node_identity();
  const auto hosts = allgather_strings(boot, id.substr(id.rfind('/') + 1));
  std::string s;
  for (int n = 0; n < nodes.num_nodes; ++n) {
    const auto ranks = nodes.ranks_of(n);
    s += (n ? "; node " : "node ") + std::to_string(n) + " (" + hosts[static_cast<std::size_t>(ranks.front())] + "): ranks";
    for (int r : ranks) s += " " + std::to_string(r);
  }
  return s;
}

bool default_schedule_across_nodes(DataPlaneOptions& dp, const NodeMap& nodes) {
  // One rank per node: nothing to forward inside a node (hierarchical would be the direct
  // schedule with relays in the way), so the flat default stays.
  if (nodes.num_nodes < 2 || nodes.uniform_ranks_per_node() < 2 || nodes.servers_topology().empty()) return false;
  dp.schedule = parse_schedule("hierarchical");
  dp.combine_order = CombineOrder::kNodeFirst;
  return true;
}

void default_topology_from_nodes(DataPlaneOptions& dp, Bootstrap& boot, const NodeMap& nodes, const std::string& who) {
  if (dp.schedule.kind != ScheduleKind::kHierarchical || dp.topology != DataPlaneOptions{}.topology || nodes.num_nodes < 2)
    return;
  const std::string topo = nodes.servers_topology();
  if (topo.empty())
    throw Error(ErrorCode::kInvalidArgument, who + ": --schedule hierarchical needs equal, consecutive ranks per node "
                                                   "(the launcher placed " + describe_nodes(boot, nodes) + "); pass --topology");
  dp.topology = topo;
}

}  // namespace epx::tools
