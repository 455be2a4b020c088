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

struct RankSlot {
  std::atomic<std::int32_t> state{0};
  std::atomic<std::int32_t> pid{0};
  std::int32_t error_code = 0;
  std::int32_t origin_rank = -1;
  char message[1024] = {};
};

struct ControlBlock {
  std::uint64_t job_id = 0;
  std::int32_t num_ranks = 0;
  std::atomic<std::uint32_t> barrier_arrived{0};
  std::atomic<std::uint32_t> barrier_generation{0};
  // Threads transport only: every rank's window base, published in allocate().
  // (Processes map segments by name instead.)
  RankSlot* ranks() noexcept { return reinterpret_cast<RankSlot*>(this + 1); }
  std::byte** window_table() noexcept {
    return reinterpret_cast<std::byte**>(ranks() + num_ranks);
  }
  static std::size_t bytes_for(int num_ranks) noexcept {
    return sizeof(ControlBlock) + static_cast<std::size_t>(num_ranks) * (sizeof(RankSlot) + sizeof(std::byte*));
  }
  /// Placement-initialises a control block for `num_ranks` ranks in `memory` (bytes_for long).
  static ControlBlock* create(void* memory, int num_ranks, std::uint64_t job_id);

  /// Records a rank's failure (first failure of that rank wins).
  void record_failure(int rank, int error_code, int origin_rank, const char* message) noexcept;
};

}  // namespace epx::detail
