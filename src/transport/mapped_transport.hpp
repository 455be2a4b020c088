// MappedTransport: the shared part of every transport whose peers' windows are mapped
// into this address space (threads/, shm/). A put is a copy into the peer's window
// (streaming stores for large puts: epx/spi/copy.hpp), a
// signal a release store into the peer's signal slot, a wait an acquire load that spins
// briefly and then yields the core (spi::Backoff, the wait policy every buffer kind uses; with
// more ranks than cores a pure spin loses whole scheduler slices, so there it yields at once). Subclasses only obtain and map the memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "control_block.hpp"
#include "epx/spi/backoff.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

/// What every mapped transport guarantees: puts are memcpys that complete on return,
/// so a later release-store signal orders them on any queue.
TransportCaps mapped_caps(const char* name);

/// How a mapped transport's waits pass the time once their short spin is over
/// (EPX_WAIT = spin | sleep, read when a transport is made; default spin):
///   spin  — sched_yield between looks (the waiter stays runnable);
///   sleep — yield for 500 us, then a futex on the waiting rank's doorbell word, rung by every
///           signal and flagged put to that rank while a waiter sleeps (the waiter leaves the
///           run queue). Measured with 8 shm ranks on 2 cores, 128 tokens: 1.15-1.4x slower
///           than spin (the wake-ups' syscalls and scheduler latency cost more than the
///           yielding ranks' slices; BENCHMARKS.md, "What we tried"), so it is opt-in.
enum class WaitMode { kSpin, kSleep };
WaitMode wait_mode_from_env() noexcept;

class MappedTransport : public Transport {
 public:
  MappedTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout,
                  TransportCaps caps);

  int rank() const noexcept override { return rank_; }
  int num_ranks() const noexcept override { return num_ranks_; }
  const TransportCaps& caps() const noexcept override { return caps_; }
  std::byte* window() noexcept override { return windows_.empty() ? nullptr : windows_[rank_]; }
  std::size_t window_bytes() const noexcept override { return window_bytes_; }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }

  void put(int peer, std::size_t offset, const void* src, std::size_t bytes, int queue) override;
  /// A copy out of the peer's mapped window (complete on return).
  void get(int peer, std::size_t offset, void* dst, std::size_t bytes, int queue) override;
  void signal(int peer, std::size_t slot, std::uint64_t value, int queue) override;
  void wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) override;
  std::uint64_t read_signal(std::size_t slot) noexcept override;
  void put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                   int queue) override;
  void wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) override;
  void quiet(int queue) override;
  void barrier(const char* phase) override;
  void enter_phase(const char* phase) noexcept override { note_phase(phase); }
  const std::byte* peer_window(int peer) const noexcept override {
    return windows_.empty() ? nullptr : windows_[static_cast<std::size_t>(peer)];
  }

  /// The group's control block (elastic agreement and sums, src/transport/elastic.cpp).
  ControlBlock* control_block() const noexcept { return control_; }
  /// Throws kPeerFailed if any rank failed, or if `peer` (>= 0) already finished.
  void check_peers(const char* phase, int peer) const;
  /// The liveness check this transport runs while a wait yields (check_alive), for its
  /// endpoints, which check their peers as the transport they came from does.
  void check_alive_of(const char* phase) const { check_alive(phase); }
  [[noreturn]] void throw_timeout(const char* phase, int peer) const;

 protected:
  /// Bytes of one rank's segment: the window, then the signal slots (user + barrier).
  std::size_t segment_bytes(std::size_t window_bytes, std::size_t num_signals) const noexcept;
  /// An endpoint (open_endpoint) of `parent`: records phases where the parent does (its
  /// mirror) and keeps the parent's fault hook state (a fired hook stays fired).
  void inherit_from(const MappedTransport& parent) noexcept;
  /// Drops the windows (allocate(0, 0), destruction): no window, no signal slots.
  void clear_segments() noexcept { set_segments({}, 0, 0); }
  /// Points windows/signals at each rank's mapped segment base.
  void set_segments(const std::vector<std::byte*>& bases, std::size_t window_bytes,
                    std::size_t num_signals);
  /// Barrier through the control block (usable before any window exists).
  void bootstrap_barrier(const char* phase);
  /// Records `phase` in this rank's control-block slot (skipped if it is the last one).
  void note_phase(const char* phase) noexcept;
  /// The fault-injection hook (EPX_FAULT_INJECT) names ranks of the launched group: a
  /// rebuilt group (elastic.cpp) turns it off.
  void disarm_fault_hook() noexcept { fault_.fired = true; }
  /// Phases are also recorded in `control`'s slot `rank` (a rebuilt group: the launcher
  /// reads the launch's control block, by the rank's number there).
  void mirror_phases_to(ControlBlock* control, int rank) noexcept { mirror_ = control, mirror_rank_ = rank; }
  /// Called by check_peers while a wait yields: a transport whose peers no launcher
  /// watches checks their liveness here (and may throw kPeerFailed). Default: nothing.
  virtual void check_alive(const char* phase) const { (void)phase; }

  ControlBlock* control_;

 private:
  std::atomic<std::uint64_t>* signals_of(int peer) const noexcept;
  /// `peer`'s doorbell: [0] rings (bumped by a signaller that saw sleepers), [1] sleepers.
  std::atomic<std::uint32_t>* doorbell_of(int peer) const noexcept;
  /// After a store a waiter of `peer` may sleep on: wakes it (seq_cst fence, then a look at
  /// its sleepers; a syscall only when there are some).
  void ring(int peer) const noexcept;
  /// Rings `bell` (a doorbell: [0] rings, [1] sleepers) in the sleep wait mode.
  void ring_bell(std::atomic<std::uint32_t>* bell) const noexcept;
  /// The one wait of this transport: until done() — spin, then yield, then (sleep mode, a
  /// `bell` given) asleep on the bell for up to 2 ms at a time — with the peer checks of
  /// `where` between looks; at the deadline, timed_out() (which throws).
  template <class Done, class TimedOut>
  void wait_for(Done done, const WaitPoint& where, std::atomic<std::uint32_t>* bell, TimedOut timed_out);

  int rank_;
  int num_ranks_;
  int spins_;  // wait_spins(num_ranks_)
  std::chrono::milliseconds timeout_;
  TransportCaps caps_;
  std::vector<std::byte*> windows_;
  std::size_t window_bytes_ = 0;
  std::size_t signal_offset_ = 0;  // from a segment base to its signal slots
  std::size_t doorbell_offset_ = 0;  // from a segment base to its doorbell (after the slots)
  WaitMode wait_mode_;
  std::size_t num_signals_ = 0;    // user slots; the barrier's P slots follow
  std::uint64_t barrier_epoch_ = 0;
  std::atomic<const char*> last_phase_{nullptr};
  FaultPlan fault_;
  ControlBlock* mirror_ = nullptr;
  int mirror_rank_ = -1;
};

}  // namespace epx::detail
