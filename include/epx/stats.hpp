// epx/stats.hpp — where the time of one dispatch or combine went, per worker.
//
// Collected only when BufferConfig::collect_stats is set: phase timers and per-put counters
// are guarded by one runtime check each (a null stats pointer when collection is off), not a
// separate build of the loops; the check is a predictable branch per put, not per byte.
// Each worker writes only its own slot (no shared atomics).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace epx {

enum class Phase : int {
  kPlan,      ///< route scan, routing plan, prefix sums / row slots (worker 0)
  kNotify,    ///< header all-to-all: put own header, wait for every peer's (worker 0)
  kPutIssue,  ///< issuing the puts of this worker's rows (each worker)
  kWaitData,  ///< waiting for every peer's data-complete signal (worker 0); a fresh dispatch reads each landed source's metadata in it
  kBarrier,   ///< explicit barriers; combine pull mode: until every reader of my rows is done
  kEpilogue,  ///< dispatch: window → output layout; combine: ordered reduction (each worker)
};
inline constexpr int kNumPhases = 6;
const char* to_string(Phase p) noexcept;

inline constexpr int kMaxStatQueues = 4;

struct WorkerStats {
  std::array<double, kNumPhases> phase_us{};  ///< wall time this worker spent per phase
  std::uint64_t puts = 0;        ///< data puts to other ranks (rows, merged runs, metadata)
  std::uint64_t put_bytes = 0;   ///< their bytes
  std::uint64_t local_puts = 0;  ///< puts into this rank's own window
  std::uint64_t local_bytes = 0;
  std::array<std::uint64_t, kMaxStatQueues> queue_puts{};  ///< all puts, per queue
  std::array<std::uint64_t, kMaxStatQueues> queue_bytes{};
  /// Time this worker's quiet(queue) waited for its puts on each queue to complete (the
  /// completion wait a queue costs; ~0 where puts complete on return).
  std::array<double, kMaxStatQueues> queue_wait_us{};
  /// Combine in pull mode (CallStats::pulled): bytes of rows this worker read in place
  /// from other ranks' windows, and from this rank's own window. No puts then.
  std::uint64_t pulled_bytes = 0;
  std::uint64_t local_pulled_bytes = 0;
};

/// Where a dispatch's recv_x (and recv_x_scales) came from.
enum class OutputKind : int {
  kNone,     ///< combine (its output is always a tensor of its own)
  kOneCopy,  ///< a block of the output pool the senders put the rows into: one copy per row
  kCopy,     ///< copied out of the receive area by the epilogue (two copies per row); see output_why
  kView,     ///< recv_in_window: a view of the receive area (no copy; valid until the next dispatch)
};
const char* to_string(OutputKind k) noexcept;

struct CallStats {
  bool combine = false;   ///< false: dispatch
  bool cached = false;    ///< dispatch with a handle
  bool pulled = false;    ///< combine that read the expert ranks' rows in place (pull mode; set even without collect_stats)
  /// Rows first: the rows went before the header exchange, which then completed the call
  /// (one synchronisation instead of two; no notify phase, the exchange counts as
  /// wait_data). A dispatch right after a combine, and a combine right after a dispatch,
  /// when no rank holds a zero-copy view (docs/engine.md). Set even without collect_stats.
  bool data_first = false;
  /// The data path this call took, as the support table names it (spi::PathRule::key):
  /// "direct" (combine: push), "relay", "ring", "rows_first" (combine: replies first) or
  /// "pull". A static string; set even without collect_stats.
  const char* path = "";
  /// Dispatch: where recv_x came from; kCopy says why in output_why (a static string: "output
  /// pool exhausted", "output pool off", "ring_rows", "flag protocol", "hierarchical schedule,
  /// expanded layout"; spi::why_copy gives all but the first). Set even without collect_stats.
  OutputKind output = OutputKind::kNone;
  const char* output_why = "";
  /// Dispatch: payload bytes (rows and scales) the epilogue copied out of the receive area
  /// into recv_x: 0 for kOneCopy and kView. Set even without collect_stats.
  std::uint64_t epilogue_copy_bytes = 0;
  double total_us = 0;    ///< the whole call on this rank
  std::vector<WorkerStats> workers;  ///< [num_workers]
};

/// The two collectives whose waits PeerWaits keeps apart.
enum class WaitOp : int { kDispatch, kCombine };
inline constexpr int kNumWaitOps = 2;
const char* to_string(WaitOp op) noexcept;

/// Always on, whatever collect_stats says: for dispatch and for combine, how long this rank
/// waited for each peer's header and rows, summed over its successful calls — this rank's
/// column of the source x destination wait matrix that epx::Diagnose gathers
/// (epx/diagnose.hpp). A wait for peer s is the time from the end of the previous wait of the
/// same loop until s's signal (or, with the flag protocol, s's last flagged block of the
/// worker's rows) was seen; the loops start at a source that rotates from call to call, so
/// in a quiet run no source is favoured. Recorded: the header exchange (every call; rows
/// first: it completes the rows), the completion protocols' await_rows (explicit, tail:
/// every worker's signal; flag: each source's blocks, per worker), and the hierarchical
/// relays' waits. Not recorded: the ring paths' credit and tail polling (their header
/// exchange is). Cost: one clock read per source and wait loop (the flag protocol: per
/// source and worker), and 2·(P+1) relaxed stores per call.
///
/// Threading: one writer (the Buffer, at the end of each call); totals() may be called from
/// any thread at any time — a Buffer shares this object (Buffer::peer_waits()), so a reader
/// may keep it beyond the Buffer's life (it then stops changing).
class PeerWaits {
 public:
  struct Totals {
    std::uint64_t calls = 0;             ///< successful calls recorded so far
    std::vector<std::uint64_t> wait_ns;  ///< [P]: nanoseconds waited for each source, summed over those calls
  };
  /// num_ranks >= 1; every total starts at 0.
  explicit PeerWaits(int num_ranks);
  int num_ranks() const noexcept { return num_ranks_; }
  /// A consistent snapshot of `op`'s totals (lock-free; retried while a call is being added).
  Totals totals(WaitOp op) const;
  /// Calls of `op` recorded so far (any thread).
  std::uint64_t calls(WaitOp op) const noexcept;
  /// The engine, at the end of a successful call: adds its waits (`wait_ns`: [P] ns). One writer.
  void add_call(WaitOp op, const std::uint64_t* wait_ns) noexcept;

 private:
  std::atomic<std::uint64_t>& at(WaitOp op, int i) const noexcept {
    return values_[static_cast<std::size_t>(op) * static_cast<std::size_t>(num_ranks_ + 1) + static_cast<std::size_t>(i)];
  }
  int num_ranks_;
  std::atomic<std::uint64_t> seq_{0};  // odd while add_call writes (a seqlock)
  std::unique_ptr<std::atomic<std::uint64_t>[]> values_;  // [op][0]: calls, [op][1 + s]: ns waited for s
};

}  // namespace epx
