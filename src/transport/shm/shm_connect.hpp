// shm/ over a foreign bootstrap: the shm transport for ranks that another launcher started
// (torchrun, mpirun, a test's fork), all on one node.
//
// The control block (barrier, per-rank state) is a named POSIX shared-memory segment
// "/epx-<job>-ctl" that the bootstrap's rank 0 creates (mode 0600; <job> is rank 0's random
// nonce, agreed through Bootstrap::allgather) and every rank unlinks once all have mapped
// it; every setup step ends with an all-gather of each rank's status, so a failure on one
// rank fails connect() on every rank with that rank's message. No launcher watches these
// ranks, so a waiting rank checks its peers' liveness itself: the pid, start time and pid
// namespace each rank announced, which rank 0 records in every rank's control-block slot
// (ProcessIdentity, shm/shm_transport.hpp; /proc/<pid>/stat: a zombie or a reused pid counts
// as dead), every 20 ms of a yielding wait. Peers in another pid namespace are not checked
// (only the timeout catches them). A rank whose transport is destroyed is marked done: a peer
// still waiting for it fails at once ("finished without answering"). The same records tell
// the survivors of a lost rank who is dead (epx/elastic.hpp: agree_survivors, rebuild_group
// work on these groups too; a rebuilt group copies its members' records into its own block).
#pragma once

#include <memory>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

/// Collective over `bootstrap`: the shm transport of this rank. Throws kInvalidArgument if
/// the ranks are on more than one node (discover_nodes), kIo / kPeerFailed as setup fails.
std::unique_ptr<Transport> connect_shm(Bootstrap& bootstrap, const ConnectOptions& options);

}  // namespace epx::detail
