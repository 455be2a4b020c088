// epx/spi/backoff.hpp — the one wait policy of every busy wait in epx: the transports' waits,
// the EP engine's rings and worker pool, the bucket boards and the PP streams.
//
// A waiter first spins (a pause between looks: the peer is likely running and about to
// write), then yields the core between looks (with more ranks than cores a spinning waiter
// only burns the time slice of the rank it waits for), until its deadline. How long it spins
// depends on whether ranks outnumber cores (wait_spins); what happens at the deadline (a
// timeout naming the peer and phase, a futex sleep) is the caller's, as is the peer-failure
// check it runs between steps.
#pragma once

#include <sched.h>

#include <chrono>

#include "epx/spi/cpu_relax.hpp"

namespace epx::spi {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  /// Pauses before the first yield when every rank has a core of its own.
  static constexpr int kSpins = 256;

  /// No deadline: step() is true forever.
  Backoff() noexcept : Backoff(kSpins) {}
  explicit Backoff(int spins) noexcept : max_spins_(spins) {}
  /// step() turns false once `timeout` has passed since construction (or the last reset()).
  Backoff(Clock::duration timeout, int spins) noexcept : max_spins_(spins), timeout_(timeout), has_deadline_(true) { reset(); }
  explicit Backoff(std::chrono::milliseconds timeout) noexcept : Backoff(timeout, kSpins) {}

  /// Something moved: spin again, and the deadline starts over.
  void reset() noexcept {
    spins_ = 0;
    if (has_deadline_) deadline_ = Clock::now() + timeout_;
  }

  /// One idle step: a pause while spinning, then a yield; false once the deadline has passed
  /// (the clock is read only while yielding).
  bool step() noexcept {
    if (spins_ < max_spins_) {
      ++spins_;
      cpu_relax();
      return true;
    }
    sched_yield();
    return !has_deadline_ || Clock::now() < deadline_;
  }

  bool yielding() const noexcept { return spins_ >= max_spins_; }
  bool expired() const noexcept { return has_deadline_ && Clock::now() >= deadline_; }

 private:
  int spins_ = 0;
  int max_spins_;
  Clock::duration timeout_{};
  bool has_deadline_ = false;
  Clock::time_point deadline_{};
};

/// How many pauses a waiter of a group of `ranks` on this machine spins before it yields:
/// Backoff::kSpins when every rank can have a core of its own (sched_getaffinity), none when
/// ranks outnumber the cores (8 ranks on 2 cores: 1-token calls 1.25x faster without the
/// spin; BENCHMARKS.md, "What we tried").
inline int wait_spins(int ranks) noexcept { return ranks_outnumber_cpus(ranks) ? 0 : Backoff::kSpins; }

/// The short look a buffer kind takes at a word it owns before it calls the transport's own
/// wait (which spins longer, yields, and owns the timeout and the peer-failure checks):
/// kPeekSpins looks a pause apart, then looks with the core yielded between them, kPeekLooks
/// in all (`yield_at_once`: no pauses, for ranks that outnumber the cores). True as soon as
/// `ready()` is; false if it never was, and the caller then waits on the transport.
inline constexpr int kPeekSpins = 64;
inline constexpr int kPeekLooks = kPeekSpins + 512;
template <class Ready>
bool peek(Ready&& ready, bool yield_at_once) {
  for (int i = 0; i < kPeekLooks; ++i) {
    if (ready()) return true;
    if (yield_at_once || i >= kPeekSpins) sched_yield();
    else cpu_relax();
  }
  return false;
}

}  // namespace epx::spi
