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
  void allocate(std::size_t window_bytes, std::size_t num_signals) override;

  /// Prefix of every segment name of job `job_id` (without the leading '/').
  static std::string segment_prefix(std::uint64_t job_id);
  /// Unlinks every leftover segment of job `job_id` (the launcher's last word).
  static void unlink_leftovers(std::uint64_t job_id) noexcept;

 private:
  void unmap_all() noexcept;
  void map_segments(std::size_t window_bytes, std::size_t num_signals, std::size_t bytes);
  std::string segment_name(int rank) const;

  std::vector<std::byte*> mapped_;
  std::size_t mapped_bytes_ = 0;
  unsigned generation_ = 0;
};

}  // namespace epx::detail
