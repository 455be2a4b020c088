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
// and the groups rebuilt from either (rebuild again after a second loss) — and the OpenSHMEM
// transport (ranks that oshrun started, on one machine or several; below). Other transports
// (threads, sim, and any other: the message names it) throw kUnsupported.
//
// On the OpenSHMEM transport (epx/shmem.hpp) agree_survivors, rebuild_group and
// sum_over_group do as above through a few words of their own in the symmetric heap, with no
// call over every PE (shmem_malloc, shmem_barrier_all and shmem_finalize would wait for the
// dead PE). Open MPI ends every PE at the first death unless the launcher lets the survivors
// live: `oshrun --mca orte_abort_on_non_zero_status 0`. A survivor on the dead PE's machine
// sees its process gone and tells every member, so their calls fail at once naming it and
// the agreement takes milliseconds (a machine gone whole costs the timeout). A survivor with
// puts in flight to the dead PE waits in shmem_quiet until UCX declares that endpoint dead
// (UCX_KEEPALIVE_INTERVAL): keep the transport's timeout above that (in this mode the
// watchdog allows shmem_quiet twice the timeout). The rebuilt group is over the same heap:
// its windows reuse the blocks the old group gave back, and the block kept at the first
// connect by EPX_SHMEM_ELASTIC_RESERVE=SIZE (the same on every PE), so destroy the old
// Buffers first and build none bigger (else kCapacityExceeded names the blocks there are).
// After a loss a bootstrap's barrier / allgather and connect (calls over every PE) throw
// kUnsupported. At exit the survivors meet and the group's rank 0 ends the job
// (shmem_global_exit; a non-zero exit status ends it at once): end with exit() or a return
// from main, since a process that _exit()s leaves oshrun waiting for the dead PE. Joins come
// from the job's spare PEs: with EPX_SHMEM_SPARES=S (and a reserve) the last S PEs of the
// job wait inside connect() until admit takes them (connect then returns the grown group,
// joined_admission() says how) or the job ends (they end, status 0, without returning);
// the doors throw kUnsupported, and original_ranks gives 0..P-1.
//
// Memory and order: rebuild_group unmaps the old group's own windows and retires the old
// group: from then on every call of it and of every endpoint opened from it (so every old
// Buffer) throws kBadHandle naming the rebuild, never a wait on ranks that moved on; an old
// Buffer's memory stays mapped until it is destroyed. Destroy the old Buffers (their
// destroy() throws kBadHandle at once, swallowed by their destructors) and never use them
// again. The old Transport object stays valid for agree_survivors and rebuild_group until a
// rebuild succeeded (a failed rebuild is retried from it), and must outlive the new group.
//
// Growing back, or growing: ranks join a running launch.
//
//   epx::launch({.num_ranks = 8, .elastic = true, .spare_ranks = 2}, [&](epx::Transport& t) {
//     const epx::Admission* joined = epx::joined_admission();  // non-null in a joiner
//     ...
//     if (now->rank() == 0) epx::request_ranks(*now, 1);      // a replacement, or one more
//     auto bigger = epx::admit(*now, {.joiners = 1, .tag = iteration});  // every member, same point
//     if (bigger) { keep the old group alive; now = bigger.get(); rebuild Buffers for the new P }
//   });
//
// request_ranks asks the launcher for new rank processes; each runs the launch's function
// too, but only after it was admitted, on the group the admission made (joined_admission()
// says so, with the members' tag: e.g. the iteration to start at). admit is collective over
// the members of a group, at a point they agree on (the same iteration): the group's rank 0
// waits (at most AdmitOptions::wait) for the joiners asked for to knock at the launch's door,
// invites them, and every member and joiner maps the new group (old ranks keep their
// numbers, joiners are numbered after them, in the order they were started). The members
// then decide together, over the old group, whether every one of them saw the new group
// stand: if a joiner died or never arrived, the new group is abandoned and admit returns
// null, with the old group exactly as it was (its windows and Buffers untouched); else the
// old group is retired as after rebuild_group and admit returns the new one. A member that
// dies during admit makes the others throw is_peer_loss as in any call: agree_survivors on
// the old group then. A joiner not admitted ends without running the function (not a
// failure of the launch); one that died is in LaunchOptions::lost by its root number
// (launch's num_ranks + the order it was started in).
//
// Support for admission: groups of an elastic launch with spare_ranks, connect()-ed shm
// groups with an open door (below), shmem groups of a job with spare PEs (above), and the
// groups rebuilt or admitted from any of them.
//
// A connect()-ed group (torch.distributed, Python's epx.launch, any foreign launcher) has
// no launcher to start joiners: its members open a door, a named segment that a process
// started later finds through the group's own rendezvous (e.g. torch's store), and that
// process joins with join_door.
//
//   // members (every rank of the group):
//   std::string door = epx::open_door(*now);            // collective; publish `door` (rank 0)
//   ...
//   epx::request_ranks(*now, 1);                         // optional: admit waits for them
//   auto bigger = epx::admit(*now, {.joiners = 1, .tag = iteration});
//   ...
//   epx::close_door(*now);                                // every member, at the end
//   // the joiner (a process started meanwhile, with `door` from the rendezvous):
//   epx::Admission how;
//   std::unique_ptr<epx::Transport> group = epx::join_door(door, {}, &how);  // null: not admitted
//
// The door lives as long as a member keeps it open: a member killed with it open leaves
// the name to the others' close_door (every member unlinks it; the first one finds it). A
// joiner killed while joining is seen dead by its process identity (as the members see each
// other): the admission is abandoned and the group goes on as it was.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
/// second timeout (the deciding rank died while deciding; on shmem: twice the timeout),
/// kUnsupported on a transport other than shm and shmem (see above), kBadHandle on a group a
/// rebuild retired.
Membership agree_survivors(Transport& transport);

/// Collective over membership.survivors: a transport over them (this rank is
/// membership.new_rank of membership.survivors.size()), with `old_group`'s timeout (and, for
/// a connect()-ed group, its wait hook). Unmaps `old_group`'s windows; once the new group
/// stands, retires `old_group` and its endpoints (kBadHandle on every later call). Throws
/// kPeerFailed / kTimeout if a survivor dies or never arrives meanwhile (then
/// agree_survivors(old_group) again and retry), kIo if a segment cannot be made (shm). The
/// returned transport must not outlive `old_group` (it reads the launcher's record of how
/// ranks ended, or the first group's control block, through it).
std::unique_ptr<Transport> rebuild_group(Transport& old_group, const Membership& membership);

/// The most values one sum_over_group carries.
inline constexpr std::size_t kMaxSumValues = 4;

/// Collective over the group of `transport` (an shm group: launched, connected or rebuilt; a
/// shmem group, first or rebuilt): the element-wise sum over all ranks of `values` (the same
/// count on every rank, at most kMaxSumValues), e.g. the dropped (token, k) pairs and tokens
/// of map_to_live_replicas.
/// Throws kInvalidArgument on a bad count, kPeerFailed / kTimeout as any collective call.
std::vector<std::int64_t> sum_over_group(Transport& transport, const std::vector<std::int64_t>& values);

/// How a group admission went (the same on every member and joiner).
struct Admission {
  int round = 0;          ///< the admission's number in the group it ran in: 1, 2, ...
  int old_num_ranks = 0;  ///< P of the admitting group
  int joined = 0;         ///< joiners admitted: they are ranks old_num_ranks .. old_num_ranks + joined - 1
  int new_rank = -1;      ///< this rank in the new group
  std::uint64_t tag = 0;  ///< AdmitOptions::tag of the admitting group's rank 0
};

struct AdmitOptions {
  int joiners = 1;                     ///< how many to admit (>= 1): admit waits for that many
  std::chrono::milliseconds wait{0};   ///< how long rank 0 waits for them; 0: the group's timeout
  std::uint64_t tag = 0;               ///< passed to the joiners (joined_admission()->tag)
};

/// Asks the launcher for `count` new rank processes (an elastic launch with spare_ranks, at
/// most spare_ranks over the whole launch): local, returns at once. In a connect()-ed group
/// with an open door: says that `count` more joiners are coming (started by the caller), so
/// that admit waits for them. Throws kInvalidArgument past the spare ranks (the door's
/// seats), kUnsupported outside such a launch and without a door.
void request_ranks(Transport& transport, int count);

/// Collective over the group's members (see above): the joiners knocking at the door (up to
/// options.joiners, waiting for them at most options.wait) become ranks P.. of a new group.
/// Returns the new group (`admission` filled), or null if none was admitted or the admission
/// was abandoned (the old group as it was; admission->joined == 0). Throws is_peer_loss
/// errors if a member is lost, kUnsupported outside an elastic launch with spare ranks.
/// The returned transport must not outlive `group`.
std::unique_ptr<Transport> admit(Transport& group, const AdmitOptions& options = {}, Admission* admission = nullptr);

/// In a rank process started by request_ranks and admitted, one admitted by join_door, or
/// a spare PE of a shmem job once admitted: how (tag included); null in the ranks the
/// launch started.
const Admission* joined_admission() noexcept;

/// Local: the first group's number of each rank of `group` (a rebuilt or admitted group's
/// ranks keep theirs; a joiner's is the first group's size + the door seat it took, e.g. 4,
/// 5, ... after a first group of 4). 0..P-1 for a first group and transports other than shm.
std::vector<int> original_ranks(const Transport& group);

/// Collective over the members of a connect()-ed shm group (or one rebuilt or admitted from
/// one): opens the job's door, a segment "/<job prefix>door" (mode 0600) with `seats` seats
/// (the joins it can take over its life), mapped by every member. Returns its name, the same
/// on every member, for the group's rendezvous to publish. On a group whose job's door this
/// process has open already: that name, at once (the door outlives rebuilds and admissions).
/// Throws kUnsupported on a launched group (its door is the launcher's: spare_ranks) and
/// other transports, kIo if the segment cannot be made or mapped (on every member alike),
/// kInvalidArgument on seats outside [1, 64].
std::string open_door(Transport& group, int seats = 8);

/// Local, on every member when the job ends (or no more joins are wanted): closes the job's
/// door (joiners waiting there leave), unlinks its name and unmaps it. Nothing if it is not
/// open in this process.
void close_door(Transport& group) noexcept;

struct JoinOptions {
  /// How long to wait to be invited, then for each step of the admission; the new group's timeout.
  std::chrono::milliseconds timeout{30000};
  /// Run while the new group's waits yield (as ConnectOptions::wait_hook); empty: none.
  std::function<void()> wait_hook;
};

/// A process outside the group: takes a free seat of the door `name` (open_door's), knocks,
/// and waits at most options.timeout for an admission. Returns the new group (`admission`
/// filled, and joined_admission()), or null if it was not admitted (the door closed, nobody
/// invited it in time, or the admission was abandoned). Throws kInvalidArgument if there is
/// no door of that name or it has no free seat.
std::unique_ptr<Transport> join_door(const std::string& name, const JoinOptions& options = {},
                                     Admission* admission = nullptr);

}  // namespace epx
