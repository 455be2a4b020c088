// Pieces of the tools' `--transport shmem` runs (epx bench, epx replay): one rank per
// process, ranks from the launcher (oshrun / mpirun), joined through a Bootstrap (whose
// allgather_strings and agree_on_step, epx/bootstrap.hpp, are their setup agreement).
#pragma once

#include <string>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/dataplane.hpp"

namespace epx::tools {

/// "node 0 (host): ranks 0 1; node 1 (host): ranks 2 3" from the bootstrap's node map; collective.
std::string describe_nodes(Bootstrap& boot, const NodeMap& nodes);

/// --schedule hierarchical without --topology on a job over several nodes: the real node
/// layout (builtin:servers:<ranks per node>). Throws kInvalidArgument (on every rank: the
/// node map is the same everywhere) when the launcher placed unequal or non-consecutive
/// ranks per node. `who` names the command. Collective.
void default_topology_from_nodes(DataPlaneOptions& dp, Bootstrap& boot, const NodeMap& nodes, const std::string& who);

/// The schedule for a job whose user chose none (BenchOptions::schedule_auto): over several
/// nodes with equal, consecutive ranks per node (at least 2 of them), the hierarchical schedule with the
/// node-first combine (each token crosses once per node pair, both ways); otherwise `dp`
/// stays as it is. True if it changed `dp`. Local (the node map is the same everywhere).
bool default_schedule_across_nodes(DataPlaneOptions& dp, const NodeMap& nodes);

}  // namespace epx::tools
