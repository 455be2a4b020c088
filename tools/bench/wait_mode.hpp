// The wait mode of a diagnosed bench's ranks. With more ranks than cores, epx's default waits
// yield between looks: a waiting rank stays runnable, so the kernel's load balancer counts it
// as busy as a working one and never moves it, and it is never woken (the moment a task is
// placed on the idlest core). A rank that shares its core with busier work (a second job, a
// build) then runs 5-14x slower than its peers for tens of seconds with no fault — and the
// diagnosis names it, rightly: it is that late (docs/diagnose.md, "Tested with real faults").
// In epx's sleep mode (`EPX_WAIT=sleep`: yields for 500 µs, then a futex the peers' signals
// ring) a waiting rank leaves the run queue and is placed again at every wake-up: measured
// with a second job, the ranks' CPU times within 1.3x of each other instead of 2-8x. The
// sleep mode costs speed (BENCHMARKS.md: 1.15x at 128 tokens), so only a bench with
// --diagnose uses it by default, and only when its ranks outnumber the cores.
#pragma once

#include <stdlib.h>

#include "epx/spi/cpu_relax.hpp"

namespace epx::tools {

/// Sets EPX_WAIT=sleep for the ranks launched while it lives (the transports read it when
/// made, in the forked ranks) when `diagnose` and `ranks` outnumber the cores and EPX_WAIT is
/// unset; restores the environment when it dies (a sweep's next point may have fewer ranks).
class DiagnoseWaitMode {
 public:
  DiagnoseWaitMode(bool diagnose, int ranks) {
    if (!diagnose || std::getenv("EPX_WAIT") != nullptr || !spi::ranks_outnumber_cpus(ranks)) return;
    set_ = setenv("EPX_WAIT", "sleep", 0) == 0;
  }
  ~DiagnoseWaitMode() {
    if (set_) unsetenv("EPX_WAIT");
  }
  DiagnoseWaitMode(const DiagnoseWaitMode&) = delete;
  DiagnoseWaitMode& operator=(const DiagnoseWaitMode&) = delete;

  /// Whether this object chose the sleep mode (and the bench says so).
  bool chose_sleep() const noexcept { return set_; }

 private:
  bool set_ = false;
};

}  // namespace epx::tools
