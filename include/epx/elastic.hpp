// epx/elastic.hpp — after a rank dies, the survivors rebuild the group without it and go on.
//
//   epx::launch({.num_ranks = 8, .elastic = true}, [&](epx::Transport& t) {
//     std::unique_ptr<epx::Transport> group;          // the rebuilt group, once there is one
//     epx::Transport* now = &t;
//     for (;;) {
//       try {
//         epx::Buffer buffer(*now, config_for(now->num_ranks()));
//         ... dispatch / combine pairs ...
//         break;
//       } catch (const epx::Error& e) {
//         if (!epx::is_peer_loss(e)) throw;            // a bad input is not a lost rank
//         epx::Membership m = epx::agree_survivors(*now);  // collective over the survivors
//         group = epx::rebuild_group(*now, m);           // new windows over the survivors
//         now = group.get();                             // ranks renumbered 0..P'-1
//         ... mask the routing: epx::map_to_live_replicas (epx/eplb.hpp) ...
//       }
//     }
//   });
//
// What happens: a rank that dies makes every other rank's collective call throw within the
// transport's timeout (kPeerFailed naming it; kTimeout naming a rank that stopped answering).
// Each survivor then calls agree_survivors on the transport of the failed call. It returns
// the same Membership on every survivor: the ranks that arrived at the agreement and are not
// dead. A rank that is dead is never waited for; a rank that is neither dead nor arrives
// within the transport's timeout (stopped, hung) is left out. A rank that arrives after the
// others decided without it gets kPeerFailed ("left out"). Which call each survivor was in
// when it threw may differ (a rank can finish call n that a peer failed in): the interrupted
// pair is to be redone or dropped by the application, from the survivors' agreement on.
//
// Who is dead: in a group of epx::launch the launcher records how each rank ended (in the
// launch's control block); in a connect()-ed group (ranks started by another launcher:
// torchrun, mpirun, Python's epx.launch, a test's fork; epx/connect.hpp) each rank's process
// identity — pid, start time, pid namespace — is in the group's control block, and the
// survivors look at /proc themselves: a process gone, a zombie or a pid reused by a later
// process is dead; one that still runs but never arrives (stopped, hung) is left out after the
// timeout like in a launched group. A rank in another pid namespace cannot be looked at:
// only the timeout leaves it out.
//
// rebuild_group then makes a new transport over the survivors: new shared-memory segments
// (mode 0600, named under the old group's prefix, "<prefix>e<round>-", unlinked as soon as
// every member mapped them: a launched job's janitor removes them if the job is killed
// meanwhile), ranks renumbered densely in ascending old rank (Membership::survivors[i] is new
// rank i). A Buffer over it (epx/buffer.hpp) is made as usual, with the new P; with EPLB
// replicas the physical slots of the lost ranks are gone and map_to_live_replicas
// (epx/eplb.hpp) maps each (token, k) to a live replica, dropping (-1) and counting the pairs
// whose logical expert has none. sum_over_group gives the group's total of such counts.
//
// Support: the shm transport — a launched group (a process per rank, LaunchOptions::elastic:
// else the launcher ends the job at the first death), a connect()-ed shm group (one machine),
// and the groups rebuilt from either (rebuild again after a second loss). Other transports
// (threads, sim, OpenSHMEM, and any other: the message names it) throw kUnsupported.
// Memory and order: rebuild_group unmaps the old group's own windows and retires the old
// group: from then on every call of it and of every endpoint opened from it (so every old
// Buffer) throws kBadHandle naming the rebuild, never a wait on ranks that moved on; an old
// Buffer's memory stays mapped until it is destroyed. Destroy the old Buffers (their
// destroy() throws kBadHandle at once, swallowed by their destructors) and never use them
// again. The old Transport object stays valid for agree_survivors and rebuild_group until a
// rebuild succeeded (a failed rebuild is retried from it), and must outlive the new group.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "epx/error.hpp"
#include "epx/transport.hpp"

namespace epx {

/// True for the errors a lost peer causes (kPeerFailed, kTimeout): the ones after which
/// agree_survivors makes sense. A bad input (kInvalidArgument, ...) is not one.
bool is_peer_loss(const Error& error) noexcept;

/// The survivors of a group, as agree_survivors decided them (the same on every survivor).
struct Membership {
  int round = 0;                ///< the agreement's number in this group: 1, 2, ...
  int old_num_ranks = 0;        ///< P of the group the agreement ran in
  std::vector<int> survivors;   ///< old ranks, ascending; survivors[i] becomes rank i
  std::vector<int> lost;        ///< old ranks not in survivors, ascending
  int new_rank = -1;            ///< this rank's index in survivors
  /// The new rank of old rank `old_rank`, -1 if it was lost.
  int new_rank_of(int old_rank) const noexcept;
};

/// Collective over the live ranks of `transport`'s group (call it after a collective call
/// threw is_peer_loss). Waits until every rank of the group has arrived or is dead, at most
/// the transport's timeout (then decides without the ranks still missing). Throws
/// kPeerFailed on a rank left out of the decision, kTimeout if no decision appears within a
/// second timeout (the deciding rank died while deciding), kUnsupported on a transport
/// other than shm (see above), kBadHandle on a group a rebuild retired.
Membership agree_survivors(Transport& transport);

/// Collective over membership.survivors: a transport over them (this rank is
/// membership.new_rank of membership.survivors.size()), with `old_group`'s timeout (and, for
/// a connect()-ed group, its wait hook). Unmaps `old_group`'s windows; once the new group
/// stands, retires `old_group` and its endpoints (kBadHandle on every later call). Throws
/// kPeerFailed / kTimeout if a survivor dies or never arrives meanwhile (then
/// agree_survivors(old_group) again and retry), kIo if a segment cannot be made. The
/// returned transport must not outlive `old_group` (it reads the launcher's record of how
/// ranks ended, or the first group's control block, through it).
std::unique_ptr<Transport> rebuild_group(Transport& old_group, const Membership& membership);

/// The most values one sum_over_group carries.
inline constexpr std::size_t kMaxSumValues = 4;

/// Collective over the group of `transport` (an shm group: launched, connected or rebuilt): the
/// element-wise sum over all ranks of `values` (the same count on every rank, at most
/// kMaxSumValues), e.g. the dropped (token, k) pairs and tokens of map_to_live_replicas.
/// Throws kInvalidArgument on a bad count, kPeerFailed / kTimeout as any collective call.
std::vector<std::int64_t> sum_over_group(Transport& transport, const std::vector<std::int64_t>& values);

}  // namespace epx
