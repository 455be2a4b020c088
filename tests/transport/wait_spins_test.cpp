// epx's one wait policy (epx/spi/backoff.hpp): how long a waiter spins before it yields
// (wait_spins: the full spin while every rank of the group can have a core of this
// process's own, none once ranks outnumber those cores — a spinning rank would hold a core a
// rank with work needs), the deadline and its reset, and the short peek the buffer kinds take
// before a transport's wait.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "epx/spi/backoff.hpp"

namespace {

using epx::spi::Backoff;

TEST(WaitSpins, NoSpinWhenRanksOutnumberCores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int cores = CPU_COUNT(&set);
  EXPECT_EQ(epx::spi::wait_spins(1), Backoff::kSpins);
  EXPECT_EQ(epx::spi::wait_spins(cores), Backoff::kSpins);
  EXPECT_EQ(epx::spi::wait_spins(cores + 1), 0);
  // A Backoff without spins yields from its first step.
  Backoff none(std::chrono::milliseconds(1000), 0);
  EXPECT_TRUE(none.yielding());
  Backoff some(std::chrono::milliseconds(1000), 2);
  EXPECT_FALSE(some.yielding());
  EXPECT_TRUE(some.step());
  EXPECT_TRUE(some.step());
  EXPECT_TRUE(some.yielding());
}

TEST(Backoff, StepTurnsFalseAtTheDeadlineAndResetRestartsIt) {
  using namespace std::chrono;
  // Long enough that no scheduler stall between reset() and expired() below reaches it.
  Backoff b(milliseconds(200), 4);
  const auto start = steady_clock::now();
  int steps = 0;
  while (b.step()) ++steps;
  const auto took = steady_clock::now() - start;
  EXPECT_GE(took, milliseconds(200));
  EXPECT_GT(steps, 4);  // the spins, then yields until the deadline
  EXPECT_TRUE(b.expired());
  b.reset();  // something moved: spinning again, a new deadline
  EXPECT_FALSE(b.yielding());
  EXPECT_FALSE(b.expired());
  EXPECT_TRUE(b.step());
}

TEST(Backoff, WithoutADeadlineNeverExpires) {
  Backoff b(0);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(b.step());
  EXPECT_FALSE(b.expired());
}

TEST(Backoff, PeekSeesAWriteAndGivesUpAfterItsLooks) {
  std::atomic<int> word{0};
  int looks = 0;
  EXPECT_FALSE(epx::spi::peek([&] { ++looks; return word.load() != 0; }, false));
  EXPECT_EQ(looks, epx::spi::kPeekLooks);
  looks = 0;
  EXPECT_FALSE(epx::spi::peek([&] { ++looks; return false; }, true));  // yielding from the first look
  EXPECT_EQ(looks, epx::spi::kPeekLooks);
  std::thread writer([&] { word.store(1); });
  writer.join();
  looks = 0;
  EXPECT_TRUE(epx::spi::peek([&] { ++looks; return word.load() != 0; }, false));
  EXPECT_EQ(looks, 1);
}

}  // namespace
