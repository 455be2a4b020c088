// shm/: ranks are processes; each rank's window (and its signal slots) is one POSIX
// shared-memory segment "/epx-<job>-<rank>-<generation>", mode 0600, pre-faulted by its
// owner, mapped by every rank, and unlinked by its owner as soon as all ranks mapped it.
// If allocate fails on a rank, that rank unlinks every segment name of the generation
// (a peer that died before unlinking its own leaves nothing behind).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mapped_transport.hpp"
#include "process_identity.hpp"

namespace epx::detail {

/// The identity recorded in a control-block slot / recorded into it (before any peer reads
/// it): a group that no launcher watches (connect()-ed, shm/shm_connect.hpp, and the groups
/// rebuilt from one) checks its peers by the identities in their slots (process_identity.hpp).
ProcessIdentity identity_of(const RankSlot& slot) noexcept;
void record_identity(const ProcessIdentity& id, RankSlot& slot) noexcept;

class ShmTransport : public MappedTransport {
 public:
  ShmTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout);
  ~ShmTransport() override;
  /// allocate(0, 0) releases the window (local: unmapping is safe whatever the peers do).
  void allocate(std::size_t window_bytes, std::size_t num_signals) override;
  /// An endpoint with segments "/<prefix>w<k>-<rank>-<generation>" (k counts this
  /// transport's endpoints), checking its peers as this transport does.
  std::unique_ptr<Transport> open_endpoint() override;

  // Elastic (epx/elastic.hpp, src/transport/elastic.cpp).
  /// Prefix of this group's segment names (without '/'): segment_prefix(job) for a launched
  /// or connected group, the parent's prefix + "e<round>-" for a rebuilt one.
  const std::string& prefix() const noexcept { return prefix_; }
  /// Where the launcher records how ranks ended (kFailed = died or gave up): the launch's
  /// control block, and rank p of this group's number there.
  virtual ControlBlock* root_control() const noexcept { return control_; }
  virtual int root_rank(int p) const noexcept { return p; }
  /// True where a launcher records the deaths (epx::launch); false for a connect()-ed group
  /// and the groups rebuilt from one, whose ranks check each other's processes instead
  /// (ProcessIdentity in their control-block slots).
  virtual bool launcher_watched() const noexcept { return true; }
  /// Rank p of this group has ended for good: its death recorded (by the launcher, or by a
  /// peer that saw its process end) or, without a launcher, its process gone now (a death
  /// seen here is recorded in the control block). A rank that is stopped or hung has not.
  bool peer_ended(int p) const;
  /// Unmaps every window (after a rebuild: the old group is never used again). Local.
  void release_windows() noexcept;
  /// After a rebuild (round `round`) this group and every endpoint opened from it (the old
  /// buffers) refuse all calls but agree_survivors' wait-free reads and allocate(0, 0):
  /// kBadHandle naming the rebuild, never a wait on ranks that moved on. Local.
  void retire(int round) noexcept { retired_->store(round, std::memory_order_release); }
  /// The round that retired this group (0 while it is live).
  int retired_round() const noexcept { return retired_->load(std::memory_order_acquire); }
  /// The caller's hook run while a wait yields (connect()'s ConnectOptions::wait_hook, kept
  /// by a rebuilt group), at most every 50 ms; empty: none.
  const std::function<void()>& wait_hook() const noexcept { return wait_hook_; }

  // Every call below (and allocate, open_endpoint) checks first that no rebuild retired
  // the group.
  void put(int peer, std::size_t offset, const void* src, std::size_t bytes, int queue) override;
  void get(int peer, std::size_t offset, void* dst, std::size_t bytes, int queue) override;
  void signal(int peer, std::size_t slot, std::uint64_t value, int queue) override;
  void wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) override;
  void put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                   int queue) override;
  void wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) override;
  void barrier(const char* phase) override;

  /// Prefix of every segment name of job `job_id` (without the leading '/').
  static std::string segment_prefix(std::uint64_t job_id);
  /// Unlinks every leftover segment of job `job_id` (the launcher's last word).
  static void unlink_leftovers(std::uint64_t job_id) noexcept;

 protected:
  /// A group whose segments are named "/<prefix><rank>-<generation>".
  ShmTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout, std::string prefix);

  /// For a group no launcher watches: runs the wait hook (every 50 ms at most), and every
  /// 20 ms looks at the processes of the peers still running (ProcessIdentity of their
  /// slots): one that ended is recorded as failed and named (kPeerFailed). `what` names
  /// peer p in the message (e.g. " (rank 3 of the first group)"), may be null.
  void check_processes(const char* phase, const std::function<std::string(int)>& what) const;
  /// Throws kBadHandle if a rebuild retired this group (`call` names the call).
  void require_live(const char* call) const;
  /// This transport (an endpoint) is retired with `parent`.
  void follow_retirement_of(const ShmTransport& parent) noexcept { retired_ = parent.retired_; }

  std::function<void()> wait_hook_;
  std::shared_ptr<std::atomic<int>> retired_ = std::make_shared<std::atomic<int>>(0);  // shared with the endpoints

 private:
  void unmap_all() noexcept;
  void map_segments(std::size_t window_bytes, std::size_t num_signals, std::size_t bytes);
  std::string segment_name(int rank) const;

  std::vector<std::byte*> mapped_;
  std::size_t mapped_bytes_ = 0;
  unsigned generation_ = 0;
  std::string prefix_;
  unsigned endpoints_ = 0;
  mutable std::atomic<std::int64_t> next_check_{0};
};

}  // namespace epx::detail
