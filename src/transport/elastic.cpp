// Elastic groups (epx/elastic.hpp): the survivors' agreement and the group's small sums
// through the control block, and the rebuilt group: a shm transport over a new control
// block. Who is dead: in a launched group the launcher records deaths in the launch's
// control block (by the ranks' original numbers), and a rebuilt group reads them there; in
// a connect()-ed group (and a group rebuilt from one) every slot holds its rank's process
// identity (ProcessIdentity), which the survivors check themselves, and the rebuilt group's
// block gets copies of its members' identities.
#include "epx/elastic.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "control_block.hpp"
#include "door.hpp"
#include "epx/launch.hpp"
#include "process_identity.hpp"
#include "shm/shm_transport.hpp"

namespace epx {

static_assert(detail::kMemberWords * 64 >= static_cast<std::size_t>(kMaxRanks));
static_assert(detail::kSumWords == kMaxSumValues);

bool is_peer_loss(const Error& error) noexcept {
  return error.code() == ErrorCode::kPeerFailed || error.code() == ErrorCode::kTimeout;
}

int Membership::new_rank_of(int old_rank) const noexcept {
  const auto it = std::lower_bound(survivors.begin(), survivors.end(), old_rank);
  return it != survivors.end() && *it == old_rank ? static_cast<int>(it - survivors.begin()) : -1;
}

namespace detail {
namespace {

constexpr auto kRunning = static_cast<std::int32_t>(RankState::kRunning);
constexpr auto kFailed = static_cast<std::int32_t>(RankState::kFailed);

ShmTransport& elastic_shm(Transport& t, const char* what) {
  auto* shm = dynamic_cast<ShmTransport*>(&t);
  if (shm == nullptr)
    throw Error(ErrorCode::kUnsupported,
                "rank " + std::to_string(t.rank()) + ": " + what +
                    ": elastic groups need the shm transport (processes on one machine: epx::launch with "
                    "LaunchOptions::elastic, or a connect()-ed group); this transport is '" +
                    t.caps().name + "'");
  if (shm->retired_round() != 0)
    throw Error(ErrorCode::kBadHandle,
                "rank " + std::to_string(t.rank()) + ": " + what + ": this group was rebuilt already (round " +
                    std::to_string(shm->retired_round()) + "): call it on the group the rebuild returned",
                t.rank());
  return *shm;
}

/// Which ranks of `t`'s group have ended for good, for a wait loop: a death recorded (by the
/// launcher, or by a peer that saw the process end) or the rank left the group (its
/// transport was destroyed: done) on every look; without a launcher, the processes
/// themselves (/proc) at most every 10 ms per rank.
class LossWatch {
 public:
  explicit LossWatch(const ShmTransport& t)
      : t_(t), lost_(static_cast<std::size_t>(t.num_ranks()), false), next_(lost_.size()) {}
  bool operator()(int p) {
    const auto u = static_cast<std::size_t>(p);
    if (lost_[u]) return true;
    if (t_.control_block()->ranks()[p].state.load(std::memory_order_acquire) != kRunning) return lost_[u] = true;
    if (t_.launcher_watched()) return lost_[u] = t_.peer_ended(p);  // a load of the launcher's record
    const auto now = std::chrono::steady_clock::now();
    if (now < next_[u]) return false;
    next_[u] = now + std::chrono::milliseconds(10);
    return lost_[u] = t_.peer_ended(p);
  }

 private:
  const ShmTransport& t_;
  std::vector<bool> lost_;
  std::vector<std::chrono::steady_clock::time_point> next_;
};

std::string rank_str(int r) { return "rank " + std::to_string(r); }

/// A group rebuilt over the survivors: the shm transport over a new control block (mapped
/// from "/<prefix>ctl"), which checks its members against the launch's control block.
class ElasticShmTransport final : public ShmTransport {
 public:
  ElasticShmTransport(ControlBlock* control, std::size_t control_bytes, int rank, const ShmTransport& parent,
                      std::string prefix, std::vector<int> root_ranks)
      : ElasticShmTransport(control, control_bytes, rank, parent.timeout(), std::move(prefix), parent.root_control(),
                            std::move(root_ranks), parent.launcher_watched(), parent.wait_hook()) {}

  /// A group without a parent transport in this process (a joiner's first group).
  ElasticShmTransport(ControlBlock* control, std::size_t control_bytes, int rank, std::chrono::milliseconds timeout,
                      std::string prefix, ControlBlock* root, std::vector<int> root_ranks, bool launched,
                      std::function<void()> wait_hook)
      : ShmTransport(control, rank, timeout, std::move(prefix)),
        control_bytes_(control_bytes),
        root_(root),
        root_ranks_(std::move(root_ranks)),
        launched_(launched) {
    wait_hook_ = std::move(wait_hook);
    disarm_fault_hook();
    // A joiner of a connect()-ed group has no first group's block: its root is this block,
    // whose slots may be fewer than the root numbers.
    const int o = root_ranks_[static_cast<std::size_t>(rank)];
    if (o >= 0 && o < root_->num_ranks) mirror_phases_to(root_, o);
  }

  ~ElasticShmTransport() override {
    // A peer still waiting for this rank fails at once ("finished without answering").
    std::int32_t running = kRunning;
    control_->ranks()[rank()].state.compare_exchange_strong(running, static_cast<std::int32_t>(RankState::kDone),
                                                             std::memory_order_acq_rel);
    munmap(control_, control_bytes_);
  }

  ControlBlock* root_control() const noexcept override { return root_; }
  int root_rank(int p) const noexcept override { return root_ranks_[static_cast<std::size_t>(p)]; }
  bool launcher_watched() const noexcept override { return launched_; }

  /// Collective: every member has mapped the control block (then its name can go).
  void join(const char* phase) { bootstrap_barrier(phase); }

 protected:
  void check_alive(const char* phase) const override {
    if (!launched_) {
      // No launcher: this group's slots hold its members' process identities.
      return check_processes(phase, [this](int p) {
        return " (rank " + std::to_string(root_ranks_[static_cast<std::size_t>(p)]) + " of the first group)";
      });
    }
    for (int p = 0; p < num_ranks(); ++p) {
      const int o = root_ranks_[static_cast<std::size_t>(p)];
      if (p == rank() || root_->ranks()[o].state.load(std::memory_order_acquire) != kFailed) continue;
      const std::string msg = rank_str(rank()) + ": peer rank " + std::to_string(p) + " (rank " + std::to_string(o) +
                              " of the launched group) failed while this rank waited in phase '" + phase +
                              "': " + root_->ranks()[o].message;
      control_->record_failure(p, static_cast<int>(ErrorCode::kPeerFailed), p, msg.c_str());
      throw Error(ErrorCode::kPeerFailed, msg, p);
    }
  }

 private:
  std::size_t control_bytes_;
  ControlBlock* root_;
  std::vector<int> root_ranks_;
  bool launched_;
};

/// Spin-then-yield until done(); false once the timeout has passed.
template <class Done>
bool wait_for(std::chrono::milliseconds timeout, Done done) {
  spi::Backoff backoff(timeout);
  while (!done())
    if (!backoff.step()) return done();
  return true;
}

constexpr auto kSeatStarted = static_cast<std::uint32_t>(SeatState::kStarted);
constexpr auto kSeatKnocking = static_cast<std::uint32_t>(SeatState::kKnocking);
constexpr auto kSeatClaimed = static_cast<std::uint32_t>(SeatState::kClaimed);
constexpr auto kSeatInvited = static_cast<std::uint32_t>(SeatState::kInvited);
constexpr auto kSeatAdmitted = static_cast<std::uint32_t>(SeatState::kAdmitted);
constexpr auto kSeatLeft = static_cast<std::uint32_t>(SeatState::kLeft);
constexpr std::uint32_t kAdmitStands = 1, kAdmitAbandoned = 2;

std::optional<Admission> g_joined;

bool root_failed(ControlBlock* root, int r) {
  return root->ranks()[r].state.load(std::memory_order_acquire) == kFailed;
}

// The doors of connect()-ed groups this process has open (open_door), by job.
struct OpenDoor {
  pid_t owner = 0;  // the process that opened it (a forked child inherits the list, not the door)
  std::uint64_t job = 0;
  std::string name;
  Door* door = nullptr;
  std::size_t bytes = 0;
};

struct OpenDoors {
  std::vector<OpenDoor> doors;
  OpenDoor* find(std::uint64_t job) {
    for (auto& d : doors)
      if (d.job == job && d.owner == getpid()) return &d;
    return nullptr;
  }
  void close(std::uint64_t job) noexcept {
    for (auto it = doors.begin(); it != doors.end(); ++it)
      if (it->job == job && it->owner == getpid()) {
        it->door->closed.store(1, std::memory_order_release);
        shm_unlink(it->name.c_str());
        munmap(it->door, it->bytes);
        doors.erase(it);
        return;
      }
  }
  ~OpenDoors() {  // a process that ends with its door open: the name goes with it
    for (const auto& d : std::vector<OpenDoor>(doors)) close(d.job);
  }
};
OpenDoors g_doors;

Door& group_door(const ShmTransport& t, const char* what) {
  if (t.launcher_watched() && g_launch_door != nullptr && g_launch_door->num_seats > 0) return *g_launch_door;
  if (!t.launcher_watched())
    if (OpenDoor* d = g_doors.find(t.control_block()->job_id)) return *d->door;
  throw Error(ErrorCode::kUnsupported,
              rank_str(t.rank()) + ": " + what + ": ranks join only the groups of an elastic epx::launch with " +
                  "LaunchOptions::spare_ranks > 0, or connect()-ed groups with an open door; " +
                  (t.launcher_watched() ? "this launch has no spare ranks" : "this group's door is not open (epx::open_door)"),
              t.rank());
}

/// The process of seat `s` has ended: the launcher's record (a launched group's door, `root`
/// its control block), else the identity the joiner wrote in its seat.
bool seat_dead(Door& door, int s, ControlBlock* root) {
  if (root != nullptr) return root->ranks()[door.first_root + s].state.load(std::memory_order_acquire) == kFailed;
  const Seat& seat = door.seat(s);
  return ProcessIdentity{seat.pid, seat.start_time, seat.pid_ns}.ended();
}

std::size_t block_bytes(int P) { return (ControlBlock::bytes_for(P) + 4095) / 4096 * 4096; }

void* map_block(const std::string& name, std::size_t bytes) {
  void* memory = MAP_FAILED;
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd >= 0) {
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  return memory;
}

std::vector<int> root_ranks_of(ControlBlock* c) {
  std::vector<int> roots(static_cast<std::size_t>(c->num_ranks));
  for (int i = 0; i < c->num_ranks; ++i) roots[static_cast<std::size_t>(i)] = c->ranks()[i].root_rank;
  return roots;
}

}  // namespace

Door* g_launch_door = nullptr;
ControlBlock* g_launch_root = nullptr;

Door* Door::create(void* memory, int first_root, int seats) noexcept {
  auto* d = new (memory) Door();
  d->first_root = first_root;
  d->num_seats = seats;
  for (int i = 0; i < seats; ++i) new (&d->seat(i)) Seat();
  return d;
}

std::unique_ptr<Transport> join_at_door(ControlBlock* root, Door* door, int s, std::chrono::milliseconds timeout,
                                        std::function<void()> wait_hook) {
  Seat& seat = door->seat(s);
  const int me = door->first_root + s;
  auto leave = [&]() -> std::unique_ptr<Transport> {
    seat.state.store(kSeatLeft, std::memory_order_release);
    return nullptr;
  };
  if (root != nullptr) root->enter_phase(me, "elastic knock");
  seat.state.store(kSeatKnocking, std::memory_order_release);
  wait_for(timeout, [&] {
    return seat.state.load(std::memory_order_acquire) != kSeatKnocking || door->closed.load(std::memory_order_acquire) != 0;
  });
  std::uint32_t knocking = kSeatKnocking;
  if (seat.state.compare_exchange_strong(knocking, kSeatLeft, std::memory_order_acq_rel)) return nullptr;
  // Claimed by an admitting group's rank 0: its invitation follows.
  if (!wait_for(timeout, [&] { return seat.state.load(std::memory_order_acquire) == kSeatInvited; })) return leave();

  FaultPlan fault = FaultPlan::from_env();  // the tests' "a joiner dies while joining"
  fault.maybe_fire(me, "elastic admit");
  if (root != nullptr) root->enter_phase(me, "elastic admit");
  const std::string prefix = seat.prefix;
  void* memory = map_block("/" + prefix + "ctl", seat.control_bytes);
  if (memory == MAP_FAILED) return leave();  // abandoned and unlinked before this joiner came
  auto* c = static_cast<ControlBlock*>(memory);
  std::vector<int> roots = root_ranks_of(c);
  const int leader_root = roots[0];
  const bool launched = root != nullptr;
  // Without a launcher the rank-0 member's death is seen by its process (its identity in the block).
  auto leader_dead = [&] {
    return launched ? root_failed(root, leader_root) : identity_of(c->ranks()[0]).ended();
  };
  auto group = std::make_unique<ElasticShmTransport>(c, static_cast<std::size_t>(seat.control_bytes), seat.new_rank,
                                                     timeout, prefix, launched ? root : c, std::move(roots), launched,
                                                     std::move(wait_hook));
  try {
    group->join("elastic admit");
  } catch (const Error&) {
    // The members' verdict decides, not what this joiner saw.
  }
  wait_for(timeout, [&] {
    return c->admit_outcome.load(std::memory_order_acquire) != 0 || leader_dead();
  });
  if (c->admit_outcome.load(std::memory_order_acquire) != kAdmitStands) return leave();
  g_joined = Admission{static_cast<int>(seat.round), seat.old_num_ranks, seat.num_ranks - seat.old_num_ranks,
                       seat.new_rank, seat.tag};
  seat.state.store(kSeatAdmitted, std::memory_order_release);
  return group;
}

}  // namespace detail

Membership agree_survivors(Transport& transport) {
  using namespace detail;
  ShmTransport& t = elastic_shm(transport, "agree_survivors");
  ControlBlock* c = t.control_block();
  const int P = t.num_ranks(), me = t.rank();
  const std::string who = rank_str(me) + ": agree_survivors";
  t.enter_phase("elastic agree");
  const std::uint32_t g = c->ranks()[me].elastic_round.load(std::memory_order_relaxed) + 1;
  c->ranks()[me].elastic_round.store(g, std::memory_order_release);
  auto arrived = [&](int p) { return c->ranks()[p].elastic_round.load(std::memory_order_acquire) >= g; };
  LossWatch is_lost(t);

  // Everyone is here or gone (or the timeout passed): one rank decides, in a single CAS.
  wait_for(t.timeout(), [&] {
    if (c->elastic_decided.load(std::memory_order_acquire) >= g) return true;
    for (int p = 0; p < P; ++p)
      if (p != me && !arrived(p) && !is_lost(p)) return false;
    return true;
  });
  std::uint32_t expected = g - 1;
  if (c->elastic_claim.compare_exchange_strong(expected, g, std::memory_order_acq_rel)) {
    std::atomic<std::uint64_t>* words = c->elastic_members[g % 2];
    for (std::size_t w = 0; w < kMemberWords; ++w) words[w].store(0, std::memory_order_relaxed);
    for (int p = 0; p < P; ++p)
      if (p == me || (arrived(p) && !is_lost(p)))
        words[p / 64].fetch_or(std::uint64_t{1} << (p % 64), std::memory_order_relaxed);
    c->elastic_decided.store(g, std::memory_order_release);
  }
  if (!wait_for(t.timeout(), [&] { return c->elastic_decided.load(std::memory_order_acquire) >= g; }))
    throw Error(ErrorCode::kTimeout,
                who + ": no survivor published the decision of round " + std::to_string(g) + " within " +
                    std::to_string(t.timeout().count()) + " ms (the deciding rank died while deciding?)",
                -1);

  Membership m;
  m.round = static_cast<int>(g);
  m.old_num_ranks = P;
  const std::atomic<std::uint64_t>* words = c->elastic_members[g % 2];
  for (int p = 0; p < P; ++p) {
    const bool in = (words[p / 64].load(std::memory_order_relaxed) >> (p % 64)) & 1u;
    (in ? m.survivors : m.lost).push_back(p);
  }
  m.new_rank = m.new_rank_of(me);
  if (m.new_rank < 0)
    throw Error(ErrorCode::kPeerFailed,
                who + ": this rank was left out of the survivors' group of round " + std::to_string(g) +
                    " (it arrived after the others decided without it)",
                me);
  return m;
}

namespace detail {
namespace {

// One rebuild, as its steps share it.
struct RebuildCall {
  ShmTransport& t;
  const Membership& m;
  int me, P, leader;          // P: the new group's size; leader: its rank 0 (old rank)
  std::uint32_t g;            // the agreement's round
  std::string who, prefix;    // the new group's segment prefix
  std::string name;           // its control block
  std::size_t bytes;
};

// The new group's rank 0: creates its control block (the members' identities copied) and
// announces it; on failure announces that, for the others to fail at once too.
void* create_rebuilt_block(const RebuildCall& r) {
  ControlBlock* c = r.t.control_block();
  void* memory = MAP_FAILED;
  const int fd = shm_open(r.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd >= 0) {
    if (ftruncate(fd, static_cast<off_t>(r.bytes)) == 0)
      memory = mmap(nullptr, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (memory == MAP_FAILED) {
    const int err = errno;
    shm_unlink(r.name.c_str());
    c->elastic_ready_failed.store(r.g, std::memory_order_release);
    throw Error(ErrorCode::kIo, r.who + ": cannot create the group's control block " + r.name + ": " + std::strerror(err), r.me);
  }
  ControlBlock* fresh = ControlBlock::create(memory, r.P, c->job_id);
  // Who each member is (a group without a launcher checks its peers' processes by these).
  for (int i = 0; i < r.P; ++i)
    record_identity(identity_of(c->ranks()[r.m.survivors[static_cast<std::size_t>(i)]]), fresh->ranks()[i]);
  c->elastic_ready.store(r.g, std::memory_order_release);
  return memory;
}

// The other survivors: wait for rank 0's announcement (or its failure or death), then map it.
void* map_rebuilt_block(const RebuildCall& r) {
  ControlBlock* c = r.t.control_block();
  LossWatch is_lost(r.t);
  const bool ready = wait_for(r.t.timeout(), [&] {
    return c->elastic_ready.load(std::memory_order_acquire) >= r.g ||
           c->elastic_ready_failed.load(std::memory_order_acquire) >= r.g || is_lost(r.leader);
  });
  if (!ready || c->elastic_ready.load(std::memory_order_acquire) < r.g)
    throw Error(ready ? ErrorCode::kPeerFailed : ErrorCode::kTimeout,
                r.who + ": rank " + std::to_string(r.leader) + " (the new group's rank 0) " +
                    (!ready ? "did not create the group's control block within " + std::to_string(r.t.timeout().count()) + " ms"
                            : std::string("failed to create the group's control block or died")),
                r.leader);
  void* memory = map_block(r.name, r.bytes);
  if (memory == MAP_FAILED)
    throw Error(ErrorCode::kIo, r.who + ": cannot map the group's control block " + r.name + ": " + std::strerror(errno), r.leader);
  return memory;
}

}  // namespace
}  // namespace detail

std::unique_ptr<Transport> rebuild_group(Transport& old_group, const Membership& m) {
  using namespace detail;
  ShmTransport& t = elastic_shm(old_group, "rebuild_group");
  const int me = t.rank();
  const std::string who = rank_str(me) + ": rebuild_group";
  if (m.old_num_ranks != t.num_ranks() || m.new_rank < 0 || m.survivors.empty() ||
      m.survivors[static_cast<std::size_t>(m.new_rank)] != me)
    throw Error(ErrorCode::kInvalidArgument, who + ": the membership is not one agree_survivors gave this rank", me);
  t.enter_phase("elastic rebuild");
  t.release_windows();  // nobody touches the old windows any more

  const int P = static_cast<int>(m.survivors.size());
  const std::string prefix = t.prefix() + "e" + std::to_string(m.round) + "-";
  const RebuildCall r{t, m, me, P, m.survivors[0], static_cast<std::uint32_t>(m.round), who, prefix, "/" + prefix + "ctl",
                      block_bytes(P)};
  void* memory = me == r.leader ? create_rebuilt_block(r) : map_rebuilt_block(r);

  std::vector<int> root_ranks(static_cast<std::size_t>(P));
  for (int i = 0; i < P; ++i) root_ranks[static_cast<std::size_t>(i)] = t.root_rank(m.survivors[static_cast<std::size_t>(i)]);
  auto group = std::make_unique<ElasticShmTransport>(static_cast<ControlBlock*>(memory), r.bytes, m.new_rank, t, prefix,
                                                     std::move(root_ranks));
  try {
    group->join("elastic rebuild");
  } catch (...) {
    if (me == r.leader) shm_unlink(r.name.c_str());
    throw;
  }
  if (me == r.leader) shm_unlink(r.name.c_str());  // every member maps it: nothing left in /dev/shm
  t.retire(m.round);  // the old group's buffers now fail at once, naming the rebuild
  return group;
}

std::vector<std::int64_t> sum_over_group(Transport& transport, const std::vector<std::int64_t>& values) {
  using namespace detail;
  ShmTransport& t = elastic_shm(transport, "sum_over_group");
  if (values.empty() || values.size() > kSumWords)
    throw Error(ErrorCode::kInvalidArgument,
                rank_str(t.rank()) + ": sum_over_group takes 1 to " + std::to_string(kSumWords) + " values, got " +
                    std::to_string(values.size()),
                t.rank());
  ControlBlock* c = t.control_block();
  const int P = t.num_ranks(), me = t.rank();
  const char* phase = "elastic sum";
  t.enter_phase(phase);
  // Two parities: a rank can be at most one sum ahead of a peer still reading (it cannot
  // finish sum n+1 before that peer arrived at it, which the peer does after reading sum n).
  const std::uint32_t n = c->ranks()[me].sum_round.load(std::memory_order_relaxed) + 1;
  for (std::size_t i = 0; i < values.size(); ++i) c->ranks()[me].sum_words[n % 2][i].store(values[i], std::memory_order_relaxed);
  c->ranks()[me].sum_round.store(n, std::memory_order_release);
  std::vector<std::int64_t> total(values.size(), 0);
  for (int p = 0; p < P; ++p) {
    RankSlot& s = c->ranks()[p];
    spi::Backoff backoff(t.timeout());
    while (s.sum_round.load(std::memory_order_acquire) < n) {
      if (!backoff.step()) t.throw_timeout(phase, p);
      if (backoff.yielding() && s.sum_round.load(std::memory_order_acquire) < n) t.check_peers(phase, p);
    }
    for (std::size_t i = 0; i < values.size(); ++i) total[i] += s.sum_words[n % 2][i].load(std::memory_order_relaxed);
  }
  return total;
}

void request_ranks(Transport& transport, int count) {
  using namespace detail;
  ShmTransport& t = elastic_shm(transport, "request_ranks");
  Door& door = group_door(t, "request_ranks");
  if (count < 1)
    throw Error(ErrorCode::kInvalidArgument, rank_str(t.rank()) + ": request_ranks: count must be >= 1, got " + std::to_string(count),
                t.rank());
  std::uint32_t asked = door.requested.load(std::memory_order_acquire);
  do {
    if (static_cast<std::int64_t>(asked) + count > door.num_seats)
      throw Error(ErrorCode::kInvalidArgument,
                  rank_str(t.rank()) + ": request_ranks: " + std::to_string(count) + " more rank(s) asked for, but the launch has " +
                      "spare_ranks = " + std::to_string(door.num_seats) + " and " + std::to_string(asked) + " were asked for already",
                  t.rank());
  } while (!door.requested.compare_exchange_weak(asked, asked + static_cast<std::uint32_t>(count), std::memory_order_acq_rel));
}

namespace detail {
namespace {

// One admission, as its steps share it.
struct AdmitCall {
  ShmTransport& t;
  Door& door;
  const AdmitOptions& options;
  int P, me;
  std::uint32_t g;          // the admission's round in this group
  std::string who, prefix;  // the new group's segment prefix
  std::string name;         // its control block
  std::chrono::milliseconds wait;
};

// Rank 0: waits for the joiners (up to options.joiners, at most `wait`, or until no more can
// come) and claims the seats of those knocking.
std::vector<int> claim_joiners(const AdmitCall& a) {
  Door& door = a.door;
  ControlBlock* root = a.t.launcher_watched() ? a.t.root_control() : nullptr;
  // The joiners knocking now (alive), and how many more may still come: asked for but not
  // started, or started and not knocking yet.
  auto knocking = [&] {
    std::vector<int> seats;
    for (int s = 0; s < door.num_seats; ++s)
      if (door.seat(s).state.load(std::memory_order_acquire) == kSeatKnocking && !seat_dead(door, s, root))
        seats.push_back(s);
    return seats;
  };
  auto coming = [&] {
    // (A connect()-ed group's joiners may come unannounced: started can pass requested.)
    int n = std::max(0, static_cast<int>(door.requested.load(std::memory_order_acquire)) -
                            static_cast<int>(door.started.load(std::memory_order_acquire)));
    for (int s = 0; s < door.num_seats; ++s)
      n += door.seat(s).state.load(std::memory_order_acquire) == kSeatStarted && !seat_dead(door, s, root);
    return n;
  };
  wait_for(a.wait, [&] { return static_cast<int>(knocking().size()) >= a.options.joiners || coming() == 0; });
  std::vector<int> seats;
  for (int s : knocking()) {
    if (static_cast<int>(seats.size()) == a.options.joiners) break;
    std::uint32_t k = kSeatKnocking;
    if (door.seat(s).state.compare_exchange_strong(k, kSeatClaimed, std::memory_order_acq_rel)) seats.push_back(s);
  }
  return seats;
}

// Rank 0, with joiners claimed: creates the new group's control block (the members first,
// the joiners after them) and invites each joiner into it. Its mapping.
void* invite_joiners(const AdmitCall& a, ControlBlock* c, const std::vector<int>& seats) {
  const int J = static_cast<int>(seats.size()), Q = a.P + J;
  const std::size_t bytes = block_bytes(Q);
  void* memory = MAP_FAILED;
  const int fd = a.prefix.size() < sizeof(Seat::prefix) ? shm_open(a.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : -1;
  if (fd >= 0) {
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (memory == MAP_FAILED) {
    const std::string why = fd < 0 && a.prefix.size() >= sizeof(Seat::prefix) ? "the name is too long" : std::strerror(errno);
    shm_unlink(a.name.c_str());
    for (int s : seats) a.door.seat(s).state.store(kSeatKnocking, std::memory_order_release);  // for a later admission
    c->admit_failed.store(a.g, std::memory_order_release);
    throw Error(ErrorCode::kIo, a.who + ": cannot create the new group's control block " + a.name + ": " + why, a.me);
  }
  ControlBlock* fresh = ControlBlock::create(memory, Q, c->job_id);
  for (int i = 0; i < a.P; ++i) {
    fresh->ranks()[i].root_rank = a.t.root_rank(i);
    record_identity(identity_of(c->ranks()[i]), fresh->ranks()[i]);
  }
  for (int k = 0; k < J; ++k) {
    fresh->ranks()[a.P + k].root_rank = a.door.first_root + seats[static_cast<std::size_t>(k)];
    Seat& seat = a.door.seat(seats[static_cast<std::size_t>(k)]);
    if (!a.t.launcher_watched())  // the members watch the joiner's process as each other's
      record_identity(ProcessIdentity{seat.pid, seat.start_time, seat.pid_ns}, fresh->ranks()[a.P + k]);
    seat.round = a.g;
    seat.new_rank = a.P + k;
    seat.num_ranks = Q;
    seat.old_num_ranks = a.P;
    seat.tag = a.options.tag;
    seat.control_bytes = bytes;
    std::memcpy(seat.prefix, a.prefix.c_str(), a.prefix.size() + 1);
    seat.state.store(kSeatInvited, std::memory_order_release);
  }
  return memory;
}

// The other members: until rank 0 published its decision (or failed, or died).
void await_admission(const AdmitCall& a, ControlBlock* c) {
  LossWatch is_lost(a.t);
  const bool ready = wait_for(a.wait + a.t.timeout(), [&] {
    return c->admit_decided.load(std::memory_order_acquire) >= a.g || c->admit_failed.load(std::memory_order_acquire) >= a.g ||
           is_lost(0);
  });
  if (c->admit_failed.load(std::memory_order_acquire) >= a.g)
    throw Error(ErrorCode::kIo, a.who + ": rank 0 could not create the new group's control block", 0);
  if (c->admit_decided.load(std::memory_order_acquire) < a.g)
    throw Error(ready ? ErrorCode::kPeerFailed : ErrorCode::kTimeout,
                a.who + ": rank 0 " +
                    (ready ? std::string("died while admitting")
                           : "published no admission within " + std::to_string((a.wait + a.t.timeout()).count()) + " ms"),
                0);
}

// Every member with J joiners decided: maps the new group, meets the joiners in its first
// barrier, and the verdict over the old group (still whole): the new group stands only if
// it stood for every member; a barrier can pass on one member and fail on another when a
// joiner dies right after arriving. The new group, or null (the old one goes on as it was).
std::unique_ptr<Transport> join_admitted(const AdmitCall& a, void* memory, int J) {
  const int Q = a.P + J;
  const std::size_t bytes = block_bytes(Q);
  if (a.me != 0) memory = map_block(a.name, bytes);
  std::unique_ptr<ElasticShmTransport> group;
  bool stands = false;
  if (memory != MAP_FAILED) {
    auto* fresh = static_cast<ControlBlock*>(memory);
    group = std::make_unique<ElasticShmTransport>(fresh, bytes, a.me, a.t, a.prefix, root_ranks_of(fresh));
    try {
      group->join("elastic admit");
      stands = true;
    } catch (const Error&) {
      // A joiner died or never came: the members decide below, together.
    }
  }
  std::vector<std::int64_t> failed;
  try {
    failed = sum_over_group(a.t, {stands ? 0 : 1});
  } catch (...) {
    if (a.me == 0) {
      static_cast<ControlBlock*>(memory)->admit_outcome.store(kAdmitAbandoned, std::memory_order_release);
      shm_unlink(a.name.c_str());
    }
    throw;
  }
  const bool commit = failed[0] == 0;
  if (a.me == 0) {
    static_cast<ControlBlock*>(memory)->admit_outcome.store(commit ? kAdmitStands : kAdmitAbandoned, std::memory_order_release);
    shm_unlink(a.name.c_str());  // every joiner that could still use it has mapped it
  }
  if (!commit) return nullptr;  // `group` goes: the old group goes on as it was
  return group;
}

}  // namespace
}  // namespace detail

std::unique_ptr<Transport> admit(Transport& transport, const AdmitOptions& options, Admission* admission) {
  using namespace detail;
  ShmTransport& t = elastic_shm(transport, "admit");
  Door& door = group_door(t, "admit");
  const int P = t.num_ranks(), me = t.rank();
  const std::string who = rank_str(me) + ": admit";
  if (options.joiners < 1 || options.wait.count() < 0)
    throw Error(ErrorCode::kInvalidArgument,
                who + ": AdmitOptions::joiners must be >= 1 and wait >= 0, got " + std::to_string(options.joiners) + " and " +
                    std::to_string(options.wait.count()) + " ms",
                me);
  ControlBlock* c = t.control_block();
  t.enter_phase("elastic admit");
  const std::uint32_t g = c->ranks()[me].admit_round.load(std::memory_order_relaxed) + 1;
  c->ranks()[me].admit_round.store(g, std::memory_order_release);
  const std::string prefix = t.prefix() + "a" + std::to_string(g) + "-";
  const AdmitCall a{t, door, options, P, me, g, who, prefix, "/" + prefix + "ctl",
                    options.wait.count() > 0 ? options.wait : t.timeout()};
  Admission record;
  record.round = static_cast<int>(g);
  record.old_num_ranks = P;
  record.new_rank = me;
  record.tag = options.tag;
  if (admission != nullptr) *admission = record;
  void* memory = MAP_FAILED;
  if (me == 0) {
    const std::vector<int> seats = claim_joiners(a);
    if (!seats.empty()) memory = invite_joiners(a, c, seats);
    c->admit_joined.store(static_cast<int>(seats.size()), std::memory_order_relaxed);
    c->admit_decided.store(g, std::memory_order_release);
  } else {
    await_admission(a, c);
  }
  const int J = c->admit_joined.load(std::memory_order_relaxed);
  if (J == 0) return nullptr;  // nobody knocked: the group as it was
  std::unique_ptr<Transport> group = join_admitted(a, memory, J);
  if (group == nullptr) return nullptr;
  t.release_windows();
  t.retire(static_cast<int>(g));
  if (admission != nullptr) admission->joined = J;
  return group;
}

const Admission* joined_admission() noexcept { return detail::g_joined ? &*detail::g_joined : nullptr; }

namespace detail {
namespace {

constexpr int kMaxDoorSeats = 64;

// Rank 0 of the group: makes the door segment (its mapping, or MAP_FAILED and why).
void* create_door(const std::string& name, std::size_t bytes, std::string& why) {
  shm_unlink(name.c_str());  // a door of this job whose opener died before closing it
  void* memory = MAP_FAILED;
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd >= 0) {
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (memory == MAP_FAILED) {
    why = std::strerror(errno);
    shm_unlink(name.c_str());
  }
  return memory;
}

// Maps the door `name` as it is (its size from the segment); MAP_FAILED if there is none.
void* map_door(const std::string& name, std::size_t& bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return MAP_FAILED;
  struct stat st {};
  void* memory = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= sizeof(Door)) {
    bytes = static_cast<std::size_t>(st.st_size);
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  return memory;
}

// A joiner: the first free seat of `door` (kFree -> kStarted), its identity written; -1 if none.
int take_seat(Door& door) {
  const ProcessIdentity self = ProcessIdentity::self();
  for (int s = 0; s < door.num_seats; ++s) {
    Seat& seat = door.seat(s);
    std::uint32_t free_seat = static_cast<std::uint32_t>(SeatState::kFree);
    if (!seat.state.compare_exchange_strong(free_seat, kSeatStarted, std::memory_order_acq_rel)) continue;
    seat.pid = self.pid;
    seat.start_time = self.start_time;
    seat.pid_ns = self.pid_ns;
    door.started.fetch_add(1, std::memory_order_acq_rel);
    return s;
  }
  return -1;
}

}  // namespace
}  // namespace detail

std::vector<int> original_ranks(const Transport& group) {
  std::vector<int> roots(static_cast<std::size_t>(group.num_ranks()));
  const auto* shm = dynamic_cast<const detail::ShmTransport*>(&group);
  for (int p = 0; p < group.num_ranks(); ++p) roots[static_cast<std::size_t>(p)] = shm != nullptr ? shm->root_rank(p) : p;
  return roots;
}

std::string open_door(Transport& group, int seats) {
  using namespace detail;
  ShmTransport& t = elastic_shm(group, "open_door");
  const int me = t.rank();
  const std::string who = rank_str(me) + ": open_door";
  if (t.launcher_watched())
    throw Error(ErrorCode::kUnsupported,
                who + ": a launched group's joiners come through the launcher (LaunchOptions::spare_ranks, request_ranks)", me);
  if (seats < 1 || seats > kMaxDoorSeats)
    throw Error(ErrorCode::kInvalidArgument,
                who + ": seats must be in [1, " + std::to_string(kMaxDoorSeats) + "], got " + std::to_string(seats), me);
  const std::uint64_t job = t.control_block()->job_id;
  const std::string name = "/" + ShmTransport::segment_prefix(job) + "door";
  // Every member has it open or none (open_door is collective): the same answer everywhere.
  if (g_doors.find(job) != nullptr) return name;
  t.enter_phase("elastic open door");
  std::size_t bytes = (Door::bytes_for(seats) + 4095) / 4096 * 4096;
  std::string why;
  void* memory = MAP_FAILED;
  if (me == 0) {
    memory = create_door(name, bytes, why);
    if (memory != MAP_FAILED) Door::create(memory, t.root_control()->num_ranks, seats);
  }
  // Two sums: rank 0 made it (the others map it after), then every member mapped it.
  if (sum_over_group(t, {me == 0 && memory == MAP_FAILED ? 1 : 0})[0] != 0)
    throw Error(ErrorCode::kIo, who + ": rank 0 could not create the door " + name + (me == 0 ? ": " + why : std::string()), 0);
  if (me != 0) memory = map_door(name, bytes);
  if (sum_over_group(t, {memory == MAP_FAILED ? 1 : 0})[0] != 0) {
    if (memory != MAP_FAILED) munmap(memory, bytes);
    if (me == 0) shm_unlink(name.c_str());
    throw Error(ErrorCode::kIo, who + ": a member could not map the door " + name, me);
  }
  g_doors.doors.push_back(OpenDoor{getpid(), job, name, static_cast<Door*>(memory), bytes});
  return name;
}

void close_door(Transport& group) noexcept {
  auto* shm = dynamic_cast<detail::ShmTransport*>(&group);
  if (shm != nullptr) detail::g_doors.close(shm->control_block()->job_id);
}

std::unique_ptr<Transport> join_door(const std::string& name, const JoinOptions& options, Admission* admission) {
  using namespace detail;
  const std::string who = "joiner (pid " + std::to_string(getpid()) + "): join_door";
  std::size_t bytes = 0;
  void* memory = map_door(name, bytes);
  if (memory == MAP_FAILED)
    throw Error(ErrorCode::kInvalidArgument, who + ": no door " + name + " (not opened, or closed: epx::open_door)");
  auto* door = static_cast<Door*>(memory);
  if (bytes < Door::bytes_for(door->num_seats) || door->closed.load(std::memory_order_acquire) != 0) {
    munmap(memory, bytes);
    throw Error(ErrorCode::kInvalidArgument, who + ": the door " + name + " is closed");
  }
  const int s = take_seat(*door);
  if (s < 0) {
    munmap(memory, bytes);
    throw Error(ErrorCode::kInvalidArgument,
                who + ": the door " + name + " has no free seat (its " + std::to_string(door->num_seats) + " were taken)");
  }
  std::unique_ptr<Transport> group = join_at_door(nullptr, door, s, options.timeout, options.wait_hook);
  if (group == nullptr) {
    munmap(memory, bytes);
    return nullptr;
  }
  // A member now: it keeps the door open as the others do (request_ranks, admit, close_door).
  const std::uint64_t job = static_cast<ShmTransport&>(*group).control_block()->job_id;
  if (g_doors.find(job) == nullptr)
    g_doors.doors.push_back(OpenDoor{getpid(), job, name, door, bytes});
  else
    munmap(memory, bytes);
  if (admission != nullptr) *admission = *g_joined;
  return group;
}

}  // namespace epx
