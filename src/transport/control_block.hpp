// The job-wide control block: bootstrap barrier and per-rank state, shared by all ranks
// of a launch (heap memory for threads, an anonymous shared mapping for forked processes).
// It exists before any window does, so allocate() can synchronise through it, and it is
// where a rank's failure becomes visible to the others and to the launcher.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace epx::detail {

enum class RankState : std::int32_t { kRunning = 0, kDone = 1, kFailed = 2 };

inline constexpr std::size_t kPhaseChars = 48;
/// Values one elastic sum carries (epx::sum_over_group).
inline constexpr std::size_t kSumWords = 4;
/// Words of a member bit set: one bit per rank, for up to epx::kMaxRanks (1024) ranks.
inline constexpr std::size_t kMemberWords = 1024 / 64;

struct alignas(8) RankSlot {  // 8-aligned: the window table follows the slots
  std::atomic<std::int32_t> state{0};
  std::atomic<std::int32_t> pid{0};
  // Who the rank's process is, for a group no launcher watches (connect()-ed, and groups
  // rebuilt from one): its start time (/proc/<pid>/stat field 22) and pid namespace (inode
  // of /proc/<pid>/ns/pid), written before any peer reads them (shm/shm_transport.hpp,
  // ProcessIdentity). 0 where unknown (a launched group: its launcher records deaths).
  std::uint64_t start_time = 0;
  std::uint64_t pid_ns = 0;
  std::int32_t error_code = 0;
  std::int32_t origin_rank = -1;
  char message[1024] = {};
  // The phase this rank last waited in ("startup" before its first wait): written by the
  // rank's transport at every wait whose phase differs from the last, read by the launcher
  // and the peers to say where a dead or stopped rank was. Bytes are relaxed atomics (the
  // rank's workers may write it concurrently; a reader may see a mix only in that race).
  char phase[kPhaseChars] = "startup";
  // Bootstrap barriers this rank has arrived at (names who is missing on a timeout).
  std::atomic<std::uint32_t> barriers_arrived{0};
  // Elastic (epx/elastic.hpp, src/transport/elastic.cpp): the last survivors' agreement round
  // this rank arrived at, and its contribution to the group's small sums (two parities).
  std::atomic<std::uint32_t> elastic_round{0};
  std::atomic<std::uint32_t> sum_round{0};
  std::atomic<std::int64_t> sum_words[2][kSumWords] = {};
  // Admission (epx::admit): the last admission this rank arrived at, and, in a group an
  // admission made, the rank's number in the launch's control block (its "root rank": the
  // launcher records its death there), written by the group's maker before anyone reads it.
  std::atomic<std::uint32_t> admit_round{0};
  std::int32_t root_rank = -1;

  void set_phase(const char* p) noexcept;
  /// A copy of `phase` (NUL-terminated).
  void get_phase(char (&out)[kPhaseChars]) const noexcept;
};

/// The fault tests' hook: EPX_FAULT_INJECT="RANK:PHASE:ACTION", read when a rank's transport
/// is made. The first time rank RANK enters PHASE (exact name, e.g. "dispatch notify") it does
/// ACTION: KILL or STOP (raises SIGKILL / SIGSTOP on itself), KILL_LAUNCHER, TERM_LAUNCHER or
/// INT_LAUNCHER (sends SIGKILL / SIGTERM / SIGINT to its parent, the launcher). Unset: nothing.
struct FaultPlan {
  enum Action { kNone, kKill, kStop, kKillLauncher, kTermLauncher, kIntLauncher };
  int rank = -1;
  char phase[kPhaseChars] = {};
  Action action = kNone;
  bool fired = false;
  static FaultPlan from_env() noexcept;
  void maybe_fire(int rank, const char* phase) noexcept;
};

struct ControlBlock {
  std::uint64_t job_id = 0;
  std::int32_t num_ranks = 0;
  std::atomic<std::uint32_t> barrier_arrived{0};
  std::atomic<std::uint32_t> barrier_generation{0};
  // The bootstrap barrier's doorbell in the sleep wait mode (MappedTransport's Bell): [0] rings,
  // [1] counts the ranks asleep on it.
  std::atomic<std::uint32_t> barrier_bell[2] = {};
  // Elastic: the survivors' agreement of round g is claimed by one rank (claim: g-1 -> g),
  // which writes the members' bit set (parity g % 2) and then publishes decided = g; the
  // rebuilt group's control block is announced by its lowest member (ready = g, or
  // ready_failed = g when it could not create it).
  std::atomic<std::uint32_t> elastic_claim{0};
  std::atomic<std::uint32_t> elastic_decided{0};
  std::atomic<std::uint32_t> elastic_ready{0};
  std::atomic<std::uint32_t> elastic_ready_failed{0};
  std::atomic<std::uint64_t> elastic_members[2][kMemberWords] = {};
  // Admission of round g (epx::admit): the group's rank 0 publishes how many joiners it
  // invited (admit_joined, then admit_decided = g; admit_failed = g when it could not make the
  // new group's control block). In the control block of the group an admission makes: the
  // members' verdict, 1 = the new group stands, 2 = it was abandoned (a joiner died or never
  // arrived), which the joiners wait for.
  std::atomic<std::uint32_t> admit_decided{0};
  std::atomic<std::uint32_t> admit_failed{0};
  std::atomic<std::int32_t> admit_joined{0};
  std::atomic<std::uint32_t> admit_outcome{0};
  // Threads transport only: every rank's window base, published in allocate().
  // (Processes map segments by name instead.)
  RankSlot* ranks() noexcept { return reinterpret_cast<RankSlot*>(this + 1); }
  std::byte** window_table() noexcept {
    return reinterpret_cast<std::byte**>(ranks() + num_ranks);
  }
  static_assert(sizeof(RankSlot) % alignof(std::byte*) == 0);
  static std::size_t bytes_for(int num_ranks) noexcept {
    return sizeof(ControlBlock) + static_cast<std::size_t>(num_ranks) * (sizeof(RankSlot) + sizeof(std::byte*));
  }
  /// Placement-initialises a control block for `num_ranks` ranks in `memory` (bytes_for long).
  static ControlBlock* create(void* memory, int num_ranks, std::uint64_t job_id);

  /// Records a rank's failure (first failure of that rank wins).
  void record_failure(int rank, int error_code, int origin_rank, const char* message) noexcept;

  /// Rank `rank` enters `phase` (a transport wait or bootstrap barrier).
  void enter_phase(int rank, const char* phase) noexcept;
};

}  // namespace epx::detail
