// epx/spi/cpu_relax.hpp — the spin-wait hint of every busy loop (transports, worker pool):
// x86's pause, Arm's yield, nothing elsewhere. One definition, so that what builds on x86
// builds on aarch64 too.
#pragma once

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

}  // namespace epx::spi
