#include "mapped_transport.hpp"

#include <sched.h>

#include <linux/futex.h>
#include <sys/syscall.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <algorithm>
#include <string>
#include <new>
#include <thread>

#include "epx/spi/copy.hpp"
#include "epx/error.hpp"

namespace epx::detail {

ControlBlock* ControlBlock::create(void* memory, int num_ranks, std::uint64_t job_id) {
  auto* c = new (memory) ControlBlock();
  c->job_id = job_id;
  c->num_ranks = num_ranks;
  for (int r = 0; r < num_ranks; ++r) new (c->ranks() + r) RankSlot();
  for (int r = 0; r < num_ranks; ++r) c->window_table()[r] = nullptr;
  return c;
}

void ControlBlock::record_failure(int rank, int error_code, int origin, const char* message) noexcept {
  RankSlot& s = ranks()[rank];
  if (s.state.load(std::memory_order_acquire) == static_cast<std::int32_t>(RankState::kFailed)) return;
  s.error_code = error_code;
  s.origin_rank = origin;
  std::strncpy(s.message, message, sizeof(s.message) - 1);
  s.state.store(static_cast<std::int32_t>(RankState::kFailed), std::memory_order_release);
}

void RankSlot::set_phase(const char* p) noexcept {
  std::size_t i = 0;
  for (; i + 1 < kPhaseChars && p[i] != '\0'; ++i) std::atomic_ref<char>(phase[i]).store(p[i], std::memory_order_relaxed);
  std::atomic_ref<char>(phase[i]).store('\0', std::memory_order_relaxed);
}

void RankSlot::get_phase(char (&out)[kPhaseChars]) const noexcept {
  for (std::size_t i = 0; i < kPhaseChars; ++i)
    out[i] = std::atomic_ref<char>(const_cast<char&>(phase[i])).load(std::memory_order_relaxed);
  out[kPhaseChars - 1] = '\0';
}

void ControlBlock::enter_phase(int rank, const char* phase) noexcept { ranks()[rank].set_phase(phase); }

FaultPlan FaultPlan::from_env() noexcept {
  FaultPlan f;
  const char* env = std::getenv("EPX_FAULT_INJECT");
  if (env == nullptr || *env == '\0') return f;
  const char* a = std::strchr(env, ':');
  const char* b = a ? std::strrchr(env, ':') : nullptr;
  if (a == nullptr || b == a) return f;
  f.rank = std::atoi(env);
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(b - a - 1), kPhaseChars - 1);
  std::memcpy(f.phase, a + 1, n);
  const std::string sig = b + 1;
  f.action = sig == "KILL"           ? kKill
             : sig == "STOP"         ? kStop
             : sig == "KILL_LAUNCHER" ? kKillLauncher
             : sig == "TERM_LAUNCHER" ? kTermLauncher
             : sig == "INT_LAUNCHER"  ? kIntLauncher
                                      : kNone;
  return f;
}

void FaultPlan::maybe_fire(int r, const char* p) noexcept {
  if (action == kNone || fired || r != rank || std::strcmp(phase, p) != 0) return;
  fired = true;
  switch (action) {
    case kKill: raise(SIGKILL); break;
    case kStop: raise(SIGSTOP); break;
    case kKillLauncher: kill(getppid(), SIGKILL); break;
    case kTermLauncher: kill(getppid(), SIGTERM); break;
    case kIntLauncher: kill(getppid(), SIGINT); break;
    case kNone: break;
  }
}

TransportCaps mapped_caps(const char* name) {
  TransportCaps c;
  c.name = name;
  c.peer_memory_mapped = true;
  c.ordered_signal_per_queue = true;
  c.put_completes_on_return = true;
  c.max_queues = 64;
  c.flagged_puts = true;
  c.one_sided_get = true;
  return c;
}

WaitMode wait_mode_from_env() noexcept {
  const char* env = std::getenv("EPX_WAIT");
  return env != nullptr && std::string(env) == "sleep" ? WaitMode::kSleep : WaitMode::kSpin;
}

MappedTransport::MappedTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout,
                                 TransportCaps caps)
    : control_(control), rank_(rank), num_ranks_(control->num_ranks), spins_(spi::wait_spins(num_ranks_)), timeout_(timeout), caps_(caps),
      wait_mode_(wait_mode_from_env()), fault_(FaultPlan::from_env()) {}

namespace {
// A segment: the window (whole pages), the signal slots (the user's, then the barrier's P),
// then the doorbell on a cache line of its own.
std::size_t doorbell_at(std::size_t window_bytes, std::size_t num_signals, int P) {
  const std::size_t slots = (window_bytes + 4095) / 4096 * 4096 + (num_signals + static_cast<std::size_t>(P)) * sizeof(std::uint64_t);
  return (slots + 63) / 64 * 64;
}
}  // namespace

std::size_t MappedTransport::segment_bytes(std::size_t window_bytes, std::size_t num_signals) const noexcept {
  return doorbell_at(window_bytes, num_signals, num_ranks_) + 64;
}

void MappedTransport::set_segments(const std::vector<std::byte*>& bases, std::size_t window_bytes,
                                   std::size_t num_signals) {
  windows_ = bases;
  window_bytes_ = window_bytes;
  signal_offset_ = (window_bytes + 4095) / 4096 * 4096;
  doorbell_offset_ = doorbell_at(window_bytes, num_signals, num_ranks_);
  num_signals_ = num_signals;
  barrier_epoch_ = 0;
}

std::atomic<std::uint64_t>* MappedTransport::signals_of(int peer) const noexcept {
  return reinterpret_cast<std::atomic<std::uint64_t>*>(windows_[static_cast<std::size_t>(peer)] + signal_offset_);
}

std::atomic<std::uint32_t>* MappedTransport::doorbell_of(int peer) const noexcept {
  return reinterpret_cast<std::atomic<std::uint32_t>*>(windows_[static_cast<std::size_t>(peer)] + doorbell_offset_);
}

void MappedTransport::ring(int peer) const noexcept { ring_bell(doorbell_of(peer)); }

void MappedTransport::ring_bell(std::atomic<std::uint32_t>* bell) const noexcept {
  if (wait_mode_ != WaitMode::kSleep) return;
  // Dekker with the sleeper (wait_for): either it sees the store before it sleeps, or this
  // sees it counted among the sleepers and rings. A read-modify-write is the full barrier
  // (std::atomic_thread_fence is not supported under ThreadSanitizer).
  if (bell[1].fetch_add(0, std::memory_order_seq_cst) == 0) return;
  bell[0].fetch_add(1, std::memory_order_seq_cst);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell[0]), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void MappedTransport::put(int peer, std::size_t offset, const void* src, std::size_t bytes, int) {
  bulk_copy(windows_[static_cast<std::size_t>(peer)] + offset, src, bytes);
}

void MappedTransport::get(int peer, std::size_t offset, void* dst, std::size_t bytes, int) {
  std::memcpy(dst, windows_[static_cast<std::size_t>(peer)] + offset, bytes);
}

void MappedTransport::signal(int peer, std::size_t slot, std::uint64_t value, int) {
  signals_of(peer)[slot].store(value, std::memory_order_release);
  ring(peer);
}

std::uint64_t MappedTransport::read_signal(std::size_t slot) noexcept {
  return signals_of(rank_)[slot].load(std::memory_order_acquire);
}

template <class Done, class TimedOut>
void MappedTransport::wait_for(Done done, const WaitPoint& where, std::atomic<std::uint32_t>* bell, TimedOut timed_out) {
  spi::Backoff backoff(timeout_, spins_);
  if (wait_mode_ != WaitMode::kSleep) bell = nullptr;
  // Sleep mode yields for a while first: most waits end within a few scheduler slices.
  constexpr auto kYieldFirst = std::chrono::microseconds(500);
  std::chrono::steady_clock::time_point sleep_after{};
  while (!done()) {
    if (!backoff.yielding()) {
      backoff.step();  // the short spin
      continue;
    }
    if (bell == nullptr || std::chrono::steady_clock::now() < sleep_after) {
      if (sleep_after.time_since_epoch().count() == 0) sleep_after = std::chrono::steady_clock::now() + kYieldFirst;
      if (!backoff.step()) timed_out();  // sched_yield
    } else {
      // Sleep until the bell rings (ring_bell), or 2 ms have passed (then the peers and the
      // deadline are looked at, as after a yield).
      bell[1].fetch_add(1, std::memory_order_seq_cst);
      const std::uint32_t seen = bell[0].load(std::memory_order_seq_cst);
      if (!done()) {
        const timespec nap{0, 2'000'000};
        syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&bell[0]), FUTEX_WAIT, seen, &nap, nullptr, 0);
      }
      bell[1].fetch_sub(1, std::memory_order_relaxed);
      if (done()) return;
      if (backoff.expired()) timed_out();
    }
    try {
      check_peers(where.phase, where.peer);
    } catch (const Error&) {
      if (done()) return;  // a peer may write and then fail or finish
      throw;
    }
  }
}

void MappedTransport::note_phase(const char* phase) noexcept {
  if (phase == last_phase_.load(std::memory_order_relaxed)) return;
  last_phase_.store(phase, std::memory_order_relaxed);
  control_->enter_phase(rank_, phase);
  if (mirror_ != nullptr) mirror_->enter_phase(mirror_rank_, phase);
  fault_.maybe_fire(rank_, phase);
}

void MappedTransport::wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) {
  note_phase(where.phase);
  std::atomic<std::uint64_t>& s = signals_of(rank_)[slot];
  wait_for([&] { return s.load(std::memory_order_acquire) >= at_least; }, where, doorbell_of(rank_),
           [&] { throw_timeout(where.phase, where.peer); });
}

void MappedTransport::put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes,
                                  std::uint64_t flag, int) {
  std::byte* block = windows_[static_cast<std::size_t>(peer)] + offset;
  bulk_copy(block, src, bytes);
  // The release store orders the block's bytes before the flag for an acquiring reader.
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(block + bytes)).store(flag, std::memory_order_release);
  ring(peer);
}

void MappedTransport::wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) {
  note_phase(where.phase);
  std::atomic_ref<std::uint64_t> flag(*reinterpret_cast<std::uint64_t*>(windows_[static_cast<std::size_t>(rank_)] + offset));
  wait_for([&] { return flag.load(std::memory_order_acquire) >= at_least; }, where, doorbell_of(rank_),
           [&] { throw_timeout(where.phase, where.peer); });
}

void MappedTransport::quiet(int) {
  // Puts are plain stores that complete on return; the release store of a later
  // signal orders them for the reader.
}

void MappedTransport::inherit_from(const MappedTransport& parent) noexcept {
  mirror_ = parent.mirror_;
  mirror_rank_ = parent.mirror_rank_;
  fault_ = parent.fault_;
}

void MappedTransport::barrier(const char* phase) {
  // A transport whose buffers each opened an endpoint may have no window of its own: its
  // barrier then goes through the control block.
  if (windows_.empty()) return bootstrap_barrier(phase);
  ++barrier_epoch_;
  const std::size_t base = num_signals_;
  for (int p = 0; p < num_ranks_; ++p) {
    signals_of(p)[base + static_cast<std::size_t>(rank_)].store(barrier_epoch_, std::memory_order_release);
    ring(p);
  }
  for (int p = 0; p < num_ranks_; ++p)
    wait_signal(base + static_cast<std::size_t>(p), barrier_epoch_, WaitPoint{phase, p});
}

void MappedTransport::bootstrap_barrier(const char* phase) {
  note_phase(phase);
  const std::uint32_t gen = control_->barrier_generation.load(std::memory_order_acquire);
  const std::uint32_t mine = control_->ranks()[rank_].barriers_arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (control_->barrier_arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<std::uint32_t>(num_ranks_)) {
    control_->barrier_arrived.store(0, std::memory_order_relaxed);
    control_->barrier_generation.fetch_add(1, std::memory_order_release);
    ring_bell(control_->barrier_bell);
    return;
  }
  // A peer that arrived last and then failed (or ended) completed the barrier first: done()
  // is looked at again before a peer's failure is thrown.
  wait_for([&] { return control_->barrier_generation.load(std::memory_order_acquire) != gen; }, WaitPoint{phase, -1},
           control_->barrier_bell, [&] {
             // Blame the lowest rank that has not arrived (the one stalled, stopped or blocked).
             for (int p = 0; p < num_ranks_; ++p)
               if (p != rank_ && control_->ranks()[p].barriers_arrived.load(std::memory_order_acquire) < mine)
                 throw_timeout(phase, p);
             throw_timeout(phase, -1);
           });
}

void MappedTransport::check_peers(const char* phase, int peer) const {
  for (int p = 0; p < num_ranks_; ++p) {
    const auto state = static_cast<RankState>(control_->ranks()[p].state.load(std::memory_order_acquire));
    if (p != rank_ && state == RankState::kFailed) {
      // The peer's own report travels with it: every rank says why, not only who.
      const RankSlot& slot = control_->ranks()[p];
      const int origin = slot.origin_rank >= 0 ? slot.origin_rank : p;
      // A peer that failed because of a third rank (it timed out waiting for it) passes on
      // its code too: this rank's error is then the same kind of error about the same rank.
      const ErrorCode code = origin != p ? static_cast<ErrorCode>(slot.error_code) : ErrorCode::kPeerFailed;
      throw Error(code,
                  "rank " + std::to_string(rank_) + ": peer rank " + std::to_string(p) +
                      " failed while this rank waited in phase '" + phase + "': " + std::string(slot.message),
                  origin);
    }
    if (p == peer && p != rank_ && state == RankState::kDone)
      throw Error(ErrorCode::kPeerFailed,
                  "rank " + std::to_string(rank_) + ": peer rank " + std::to_string(p) +
                      " finished without answering in phase '" + phase + "'",
                  p);
  }
  check_alive(phase);  // after the recorded failures: a rank that failed first is the one to name
}

void MappedTransport::throw_timeout(const char* phase, int peer) const {
  std::string who = peer >= 0 ? "rank " + std::to_string(peer) : std::string("the other ranks");
  if (peer >= 0 && peer != rank_) {
    char where[kPhaseChars];
    control_->ranks()[peer].get_phase(where);
    who += " (last seen in phase '" + std::string(where) + "')";
  }
  throw Error(ErrorCode::kTimeout,
              "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) +
                  " ms in phase '" + phase + "' waiting for " + who,
              peer);
}

}  // namespace epx::detail
