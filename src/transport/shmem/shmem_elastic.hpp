// The shmem transport's elastic words: one small symmetric block per process (the first
// connect makes it, while every PE lives), indexed by PE, through which the survivors of a
// lost PE agree (agree_survivors), sum (sum_over_group) and meet (the barriers of a group
// rebuilt over them, and the last one at exit) without any call over every PE.
//
//   arrive[pe]   the agreement stamp PE pe announced     barrier[pe]  its barrier stamp
//   check[pe]    a value to compare (the block a rebuilt group's allocate took)
//   sum_round[pe], sum_words[pe][2][kSumWords]          decided, members[2][kMemberWords]
//   dead_at[pe]  the agreement in which a PE of pe's machine saw pe's process gone
//   identity[pe][3]  pe's process (pid, start time, pid namespace), in pe's own words
//   gone[pe]     1 once a PE of pe's machine saw pe's process gone (the waits look at it)
//   joins (shmem_join.cpp): on a spare PE, probe_from / probe (an admitting rank 0 asks
//   whether it lives), answered in probe_ack[spare] on that PE; on every member and joiner
//   of an admission, join_head[kJoinHead] and roster[pe] (the new group's PEs in rank
//   order) and book[pe] (which spares are out), then join_stamp; on a joiner, outcome
//   (the members' verdict: value, then outcome_stamp); on a spare, release (the job ended)
//
// Each word is written by one PE only (its own index; the decision by the deciding PE), with
// stamps that only grow: (group lineage << 40) | sequence within the group, so a group
// rebuilt from another never mistakes the old group's words for its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "control_block.hpp"
#include "epx/bootstrap.hpp"

namespace epx::detail {

class ShmemControl {
 public:
  /// Collective over every PE: shmem_malloc of the words (throws kCapacityExceeded naming `rank`).
  ShmemControl(int rank, int npes);
  ShmemControl(const ShmemControl&) = delete;
  ShmemControl& operator=(const ShmemControl&) = delete;
  // Never freed: shmem_free is collective (and the survivors' exit needs the words).
  ~ShmemControl() = default;

  static std::uint64_t stamp(int lineage, std::uint64_t seq) noexcept {
    return (static_cast<std::uint64_t>(lineage) << 40) | seq;
  }

  std::size_t arrive(int pe) const noexcept { return static_cast<std::size_t>(pe); }
  std::size_t barrier_word(int pe) const noexcept { return n_ + static_cast<std::size_t>(pe); }
  std::size_t check(int pe) const noexcept { return 2 * n_ + static_cast<std::size_t>(pe); }
  std::size_t sum_round(int pe) const noexcept { return 3 * n_ + static_cast<std::size_t>(pe); }
  std::size_t sum_words(int pe, int parity) const noexcept {
    return 4 * n_ + (static_cast<std::size_t>(pe) * 2 + static_cast<std::size_t>(parity)) * kSumWords;
  }
  std::size_t decided() const noexcept { return 4 * n_ + n_ * 2 * kSumWords; }
  std::size_t members(int parity) const noexcept { return decided() + 1 + static_cast<std::size_t>(parity) * kMemberWords; }
  /// The agreement stamp at which a PE on pe's machine saw pe's process gone.
  std::size_t dead_at(int pe) const noexcept { return members(1) + kMemberWords + static_cast<std::size_t>(pe); }
  /// pe's process identity (pid, start time, pid namespace), written by pe into its own words.
  std::size_t identity(int pe) const noexcept { return dead_at(0) + n_ + 3 * static_cast<std::size_t>(pe); }
  /// Non-zero once a PE of pe's machine saw pe's process gone (set on every member; sticky).
  std::size_t gone(int pe) const noexcept { return identity(0) + 3 * n_ + static_cast<std::size_t>(pe); }
  // Joins (shmem_join.cpp; see the top).
  static constexpr std::size_t kJoinHead = 8;
  std::size_t probe_from() const noexcept { return gone(0) + n_; }
  std::size_t probe() const noexcept { return probe_from() + 1; }
  std::size_t probe_ack(int pe) const noexcept { return probe() + 1 + static_cast<std::size_t>(pe); }
  std::size_t join_stamp() const noexcept { return probe_ack(0) + n_; }
  std::size_t join_head(std::size_t i) const noexcept { return join_stamp() + 1 + i; }
  std::size_t roster() const noexcept { return join_head(kJoinHead); }
  std::size_t book() const noexcept { return roster() + n_; }
  std::size_t outcome() const noexcept { return book() + n_; }
  std::size_t outcome_stamp() const noexcept { return outcome() + 1; }
  std::size_t release() const noexcept { return outcome_stamp() + 1; }
  /// pe's stamp in an admission's meeting (the admission's own stamps: a new group that was
  /// abandoned leaves nothing in the barrier words the old group goes on with).
  std::size_t meet(int pe) const noexcept { return release() + 1 + static_cast<std::size_t>(pe); }
  std::size_t total_words() const noexcept { return meet(0) + n_; }
  int num_pes() const noexcept { return static_cast<int>(n_); }

  /// Sets word `w` on PE `pe` to `value`, after this PE's earlier puts to `pe` (this PE's
  /// own word: a local store).
  void set(int pe, std::size_t w, std::uint64_t value);
  /// Writes `n` words from `src` at word `w` on PE `pe` (complete before a later set() to it).
  void put(int pe, std::size_t w, const std::uint64_t* src, std::size_t n);
  /// This PE's word `w` (acquire).
  std::uint64_t load(std::size_t w) const noexcept;
  /// Progresses the runtime until word `w` here holds >= `at_least`; false at `deadline`.
  bool wait(std::size_t w, std::uint64_t at_least, std::chrono::steady_clock::time_point deadline) const;
  /// The same, but false as soon as give_up() is true (looked at after the word, each step).
  bool wait_unless(std::size_t w, std::uint64_t at_least, std::chrono::steady_clock::time_point deadline,
                   const std::function<bool()>& give_up) const;
  /// A barrier over `pes` (this PE among them): sets barrier[me] = `stamp` on each, then
  /// waits for each one's. Returns the index in `pes` of the first that did not arrive
  /// within `timeout`, -1 when all did.
  int barrier(const std::vector<int>& pes, std::uint64_t stamp, std::chrono::milliseconds timeout);
  /// The same over the meet words (an admission's first meeting of its new group).
  int meeting(const std::vector<int>& pes, std::uint64_t stamp, std::chrono::milliseconds timeout);

  int my_pe() const noexcept { return me_; }
  /// PE pe shares this machine (shmem_ptr maps its words) and its process has ended (read
  /// from its own words: ProcessIdentity). False where that cannot be told.
  bool seen_dead(int pe) const;
  /// pe is known gone: announced to this PE (its gone word here) or seen_dead.
  bool known_dead(int pe) const { return load(gone(pe)) != 0 || seen_dead(pe); }
  /// Tells every PE of `pes` but pe and those known gone (this one included) that pe is gone.
  void announce_gone(int pe, const std::vector<int>& pes);

 private:
  std::uint64_t* word(int pe, std::size_t w) const noexcept;
  int me_;
  std::size_t n_;
  std::uint64_t* words_ = nullptr;
  std::vector<std::uint64_t*> mapped_;  // [pe] shmem_ptr of the words, or null (a network peer)
};

/// The launcher lets the other PEs live when one dies (oshrun --mca
/// orte_abort_on_non_zero_status 0, which Open MPI passes to the PEs as
/// OMPI_MCA_orte_abort_on_non_zero_status): the survivors can heal, and whoever ends the
/// process must end the job too (shmem_global_exit), or Open MPI waits for the dead PE.
bool launcher_keeps_survivors() noexcept;

/// From the agreement on, the process ends the survivors' way: at exit, the last rebuilt
/// group meets in a barrier (exit status 0) and its rank 0 ends the job with
/// shmem_global_exit (OpenSHMEM's finalize would wait for the dead PEs, and Open MPI ends a
/// job only when each PE finalised or one aborted); a non-zero status ends it at once.
/// `pes`: the survivors' PEs; `me`: this rank among them. Called again by each agreement and
/// rebuild (the latest group counts).
void end_job_with_group(std::shared_ptr<ShmemControl> control, std::vector<int> pes, int me, int lineage,
                        std::chrono::milliseconds timeout);

/// EPX_SHMEM_SPARES=S (shmem_join.cpp): the job's last S PEs are spares, outside the group
/// until admitted. Collective over every PE (an all-gather: the same S on every one, and a
/// reserve to take windows from, else kInvalidArgument); 0 when unset.
int job_spares(Bootstrap& bootstrap, int npes);

/// Rank 0 of the job's last group, as it ends the job: tells every spare still waiting
/// (never admitted, not known dead) that the job is over, so it ends without running the
/// program (shmem_join.cpp).
void release_spares(ShmemControl& control);

}  // namespace epx::detail
