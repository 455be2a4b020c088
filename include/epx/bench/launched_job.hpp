// Pieces of the tools' `--transport shmem` runs (epx bench, epx replay): one rank per
// process, ranks from the launcher (oshrun / mpirun), joined through a Bootstrap.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/dataplane.hpp"

namespace epx::tools {

/// Every rank's `mine` (any length) at index r on every rank; collective.
std::vector<std::string> gather_blobs(Bootstrap& boot, const std::string& mine);

/// "node 0 (host): ranks 0 1; node 1 (host): ranks 2 3" from the bootstrap's node map; collective.
std::string describe_nodes(Bootstrap& boot, const NodeMap& nodes);

/// --schedule hierarchical without --topology on a job over several nodes: the real node
/// layout (builtin:servers:<ranks per node>). Throws kInvalidArgument (on every rank: the
/// node map is the same everywhere) when the launcher placed unequal or non-consecutive
/// ranks per node. `who` names the command. Collective.
void default_topology_from_nodes(DataPlaneOptions& dp, Bootstrap& boot, const NodeMap& nodes, const std::string& who);

/// Runs `step` on this rank, then agrees with every rank: if it threw on any rank (an
/// epx::Error or another std::exception), every rank throws the error of the lowest such
/// rank (its code, message and origin rank), so a bad input on one machine fails the whole
/// job with the same message. A kTimeout or kPeerFailed error is rethrown at once, without
/// the agreement: the peer it names may be gone, and the agreement has no deadline. Collective;
/// `step` may be collective itself only if it fails on every rank or by a timeout (the
/// engine's calls do).
void agree(Bootstrap& boot, const std::function<void()>& step);

}  // namespace epx::tools
