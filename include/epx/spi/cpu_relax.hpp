// epx/spi/cpu_relax.hpp — the spin-wait hint of every busy loop (transports, worker pool):
// x86's pause, Arm's yield, nothing elsewhere. One definition, so that what builds on x86
// builds on aarch64 too. And the one rule for whether a waiter spins at all.
#pragma once

#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace epx::spi {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

/// Whether `ranks` processes/threads of one job outnumber the CPUs this process may run on
/// (its affinity set). Then a waiter spinning before it yields only burns the time slice
/// of the rank it waits for, queued on the same core: every wait of the mapped transports,
/// the bucket boards and the PP streams yields at once (BENCHMARKS.md, "What we tried":
/// small calls and synchronisation, bucket collectives).
inline bool ranks_outnumber_cpus(int ranks) noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return ranks > cpus;
}

}  // namespace epx::spi
