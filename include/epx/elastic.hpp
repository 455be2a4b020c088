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
// dead. A rank that is dead (the launcher saw it end) is never waited for; a rank that is
// neither dead nor arrives within the transport's timeout (stopped, hung) is left out. A
// rank that arrives after the others decided without it gets kPeerFailed ("left out").
// Which call each survivor was in when it threw may differ (a rank can finish call n that a
// peer failed in): the interrupted pair is to be redone or dropped by the application, from
// the survivors' agreement on.
//
// rebuild_group then makes a new transport over the survivors: new shared-memory segments
// (mode 0600, named under the job's prefix, unlinked as soon as every member mapped them;
// the launcher's janitor removes them if the job is killed meanwhile), ranks renumbered
// densely in ascending old rank (Membership::survivors[i] is new rank i). A Buffer over it
// (epx/buffer.hpp) is made as usual, with the new P; with EPLB replicas the physical slots
// of the lost ranks are gone and map_to_live_replicas (epx/eplb.hpp) maps each (token, k)
// to a live replica, dropping (-1) and counting the pairs whose logical expert has none.
// sum_over_group gives the group's total of such counts.
//
// Support: the shm transport of epx::launch with LaunchOptions::elastic (a process per rank;
// the launcher records how each rank ended, which is how the survivors know who is dead),
// and groups rebuilt from it (rebuild again after a second loss). Other transports
// (threads, sim, connect()-ed groups, OpenSHMEM) throw kUnsupported. Memory: rebuild_group
// unmaps the old group's windows, so the old Buffer (and any zero-copy view of its window)
// must be destroyed before it and never used again; the old Transport object stays valid only
// for agree_survivors and rebuild_group (a rebuild that fails can be retried from it).
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
/// other than a launched shm group (see above).
Membership agree_survivors(Transport& transport);

/// Collective over membership.survivors: a transport over them (this rank is
/// membership.new_rank of membership.survivors.size()), with `old_group`'s timeout. Unmaps
/// `old_group`'s windows. Throws kPeerFailed / kTimeout if a survivor dies or never arrives
/// meanwhile (then agree_survivors(old_group) again and retry), kIo if a segment cannot be
/// made. The returned transport must not outlive `old_group` (it reads the launcher's
/// record of how ranks ended through it).
std::unique_ptr<Transport> rebuild_group(Transport& old_group, const Membership& membership);

/// The most values one sum_over_group carries.
inline constexpr std::size_t kMaxSumValues = 4;

/// Collective over the group of `transport` (a launched or rebuilt shm group): the
/// element-wise sum over all ranks of `values` (the same count on every rank, at most
/// kMaxSumValues), e.g. the dropped (token, k) pairs and tokens of map_to_live_replicas.
/// Throws kInvalidArgument on a bad count, kPeerFailed / kTimeout as any collective call.
std::vector<std::int64_t> sum_over_group(Transport& transport, const std::vector<std::int64_t>& values);

}  // namespace epx
