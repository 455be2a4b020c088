// How long a mapped transport's waiter spins before it yields (wait_spins): the full spin
// while every rank of the group can have a core of this process's own, none once ranks
// outnumber those cores (a spinning rank would hold a core a rank with work needs).
#include <gtest/gtest.h>
#include <sched.h>

#include "mapped_transport.hpp"

namespace {

TEST(WaitSpins, NoSpinWhenRanksOutnumberCores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int cores = CPU_COUNT(&set);
  EXPECT_EQ(epx::detail::wait_spins(1), epx::detail::Backoff::kSpins);
  EXPECT_EQ(epx::detail::wait_spins(cores), epx::detail::Backoff::kSpins);
  EXPECT_EQ(epx::detail::wait_spins(cores + 1), 0);
  // A Backoff without spins yields from its first step.
  epx::detail::Backoff none(std::chrono::milliseconds(1000), 0);
  EXPECT_TRUE(none.yielding());
  epx::detail::Backoff some(std::chrono::milliseconds(1000), 2);
  EXPECT_FALSE(some.yielding());
  EXPECT_TRUE(some.step());
  EXPECT_TRUE(some.step());
  EXPECT_TRUE(some.yielding());
}

}  // namespace
