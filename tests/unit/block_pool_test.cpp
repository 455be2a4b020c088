// The output pool's allocator (src/ep/block_pool.hpp) alone: reservations take the
// largest free extent up to the asked size, a kept block returns when its last owner dies
// (from any thread), released neighbours merge, and a block outliving its pool is harmless.
#include "block_pool.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace epx::detail {
namespace {

constexpr std::size_t kPage = 4096;

TEST(BlockPool, ReservesTheLargestExtentUpToTheAskedSize) {
  std::vector<std::byte> mem(16 * kPage);
  BlockPool pool(mem.data(), mem.size());
  BlockPool::Reservation a = pool.reserve(3 * kPage + 1);  // rounded up to whole pages
  EXPECT_EQ(a.offset(), 0u);
  EXPECT_EQ(a.bytes(), 4 * kPage);
  EXPECT_EQ(pool.free_bytes(), 12 * kPage);
  BlockPool::Reservation b = pool.reserve(100 * kPage);  // more than is free: all that is left
  EXPECT_EQ(b.offset(), 4 * kPage);
  EXPECT_EQ(b.bytes(), 12 * kPage);
  EXPECT_EQ(pool.reserve(kPage).bytes(), 0u);  // full
  EXPECT_EQ(pool.reserve(0).bytes(), 0u);
}

TEST(BlockPool, KeptBlocksReturnWhenTheLastOwnerDiesAndNeighboursMerge) {
  std::vector<std::byte> mem(16 * kPage);
  BlockPool pool(mem.data(), mem.size());
  BlockPool::Reservation r1 = pool.reserve(8 * kPage);
  std::shared_ptr<std::byte> b1 = r1.keep(2 * kPage);  // the rest (6 pages) goes back now
  EXPECT_EQ(b1.get(), mem.data());
  EXPECT_EQ(pool.free_bytes(), 14 * kPage);
  BlockPool::Reservation r2 = pool.reserve(2 * kPage);
  EXPECT_EQ(r2.offset(), 2 * kPage);  // the freed tail merged with the untouched rest
  std::shared_ptr<std::byte> b2 = r2.keep(2 * kPage);
  std::shared_ptr<std::byte> alias(b2, b2.get() + 100);  // a second tensor over the same block (scales)
  b2.reset();
  EXPECT_EQ(pool.free_bytes(), 12 * kPage);  // alias still holds it
  std::thread([&] { alias.reset(); }).join();  // dropped on another thread
  EXPECT_EQ(pool.free_bytes(), 14 * kPage);
  b1.reset();
  EXPECT_EQ(pool.free_bytes(), 16 * kPage);
  BlockPool::Reservation all = pool.reserve(16 * kPage);  // one extent again: everything merged
  EXPECT_EQ(all.offset(), 0u);
  EXPECT_EQ(all.bytes(), 16 * kPage);
}

TEST(BlockPool, AnUnkeptReservationGoesBackAndAMoveKeepsOneOwner) {
  std::vector<std::byte> mem(4 * kPage);
  BlockPool pool(mem.data(), mem.size());
  {
    BlockPool::Reservation r = pool.reserve(4 * kPage);
    BlockPool::Reservation moved = std::move(r);
    EXPECT_EQ(r.bytes(), 0u);
    EXPECT_EQ(moved.bytes(), 4 * kPage);
    EXPECT_EQ(pool.free_bytes(), 0u);
  }  // e.g. a call that threw after reserving
  EXPECT_EQ(pool.free_bytes(), 4 * kPage);
}

TEST(BlockPool, ManyThreadsReleasingAtOnce) {
  std::vector<std::byte> mem(64 * kPage);
  BlockPool pool(mem.data(), mem.size());
  std::vector<std::shared_ptr<std::byte>> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(pool.reserve(kPage).keep(kPage));
  EXPECT_EQ(pool.free_bytes(), 0u);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < 64; i += 4) blocks[static_cast<std::size_t>(i)].reset();
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(pool.free_bytes(), 64 * kPage);
  EXPECT_EQ(pool.reserve(64 * kPage).bytes(), 64 * kPage);
}

TEST(BlockPool, ABlockMayOutliveItsPool) {
  std::vector<std::byte> mem(4 * kPage);
  std::shared_ptr<std::byte> kept;
  {
    BlockPool pool(mem.data(), mem.size());
    kept = pool.reserve(kPage).keep(kPage);
  }
  EXPECT_EQ(kept.get(), mem.data());
  kept.reset();  // the pool is gone: nothing to give back to, nothing touched (ASan checks)
}

}  // namespace
}  // namespace epx::detail
