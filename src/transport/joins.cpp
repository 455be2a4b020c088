// Elastic groups (epx/elastic.hpp), joining ranks: request_ranks, admit (the members' side)
// and join_at_door (the joiner's), and the door of a connect()-ed group (open_door,
// join_door, close_door). The door and a seat's life: door.hpp. Who is dead among the
// joiners: the launcher's record in a launched group, else the identity each joiner wrote in
// its seat.
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
#include "elastic_ops.hpp"
#include "elastic_shm.hpp"
#include "epx/elastic.hpp"
#include "epx/launch.hpp"
#include "process_identity.hpp"
#include "shm/shm_transport.hpp"

namespace epx {
namespace detail {
namespace {

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

void request_ranks(Transport& transport, int count) {
  using namespace detail;
  if (auto* ops = dynamic_cast<ElasticOps*>(&transport)) return ops->request_ranks(count);  // shmem: its spare PEs
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
  if (auto* ops = dynamic_cast<ElasticOps*>(&transport)) return ops->admit(options, admission);  // shmem: its spare PEs
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

const Admission* joined_admission() noexcept {
  if (detail::g_joined) return &*detail::g_joined;
  return detail::g_transport_joined ? &*detail::g_transport_joined : nullptr;
}

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
