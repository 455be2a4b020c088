// shm/: ranks are processes; each rank's window (and its signal slots) is one POSIX
// shared-memory segment "/epx-<job>-<rank>-<generation>", mode 0600, pre-faulted by its
// owner, mapped by every rank, and unlinked by its owner as soon as all ranks mapped it.
// If allocate fails on a rank, that rank unlinks every segment name of the generation
// (a peer that died before unlinking its own leaves nothing behind).
#pragma once

#include <string>
#include <vector>

#include "mapped_transport.hpp"

namespace epx::detail {

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
  /// False where no launcher records deaths (a connect()-ed group): no elastic rebuild.
  virtual bool launcher_watched() const noexcept { return true; }
  /// Unmaps every window (after a rebuild: the old group is never used again). Local.
  void release_windows() noexcept;

  /// Prefix of every segment name of job `job_id` (without the leading '/').
  static std::string segment_prefix(std::uint64_t job_id);
  /// Unlinks every leftover segment of job `job_id` (the launcher's last word).
  static void unlink_leftovers(std::uint64_t job_id) noexcept;

 protected:
  /// A group whose segments are named "/<prefix><rank>-<generation>".
  ShmTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout, std::string prefix);

 private:
  void unmap_all() noexcept;
  void map_segments(std::size_t window_bytes, std::size_t num_signals, std::size_t bytes);
  std::string segment_name(int rank) const;

  std::vector<std::byte*> mapped_;
  std::size_t mapped_bytes_ = 0;
  unsigned generation_ = 0;
  std::string prefix_;
  unsigned endpoints_ = 0;
};

}  // namespace epx::detail
