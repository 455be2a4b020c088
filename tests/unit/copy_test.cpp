// bulk_copy (streaming stores for large copies) copies exactly the bytes memcpy would, for
// every alignment of source and destination and sizes around the streaming threshold and
// the 128-byte step, and touches nothing outside [dst, dst + bytes); stream_copy_rows
// gathers rows exactly, leaving the rows of null sources untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "epx/spi/copy.hpp"

namespace {

TEST(BulkCopy, CopiesExactlyTheBytesAtAnyAlignment) {
  const std::size_t threshold = epx::stream_min_bytes();
  std::vector<std::size_t> sizes = {0, 1, 31, 127, 128, 129, 4096};
  for (std::size_t base : {threshold, threshold + 1, threshold + 127, 3 * threshold + 77, std::size_t{1} << 20})
    sizes.push_back(base);
  std::vector<std::uint8_t> src((std::size_t{1} << 20) + 256), dst(src.size() + 256);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 131 + 7);
  for (std::size_t bytes : sizes)
    for (std::size_t src_off : {0, 1, 33})
      for (std::size_t dst_off : {0, 5, 32, 63}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        epx::bulk_copy(dst.data() + dst_off, src.data() + src_off, bytes);
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_off && i < dst_off + bytes;
          const std::uint8_t want = inside ? src[src_off + (i - dst_off)] : 0xee;
          ASSERT_EQ(dst[i], want) << "bytes " << bytes << " src+" << src_off << " dst+" << dst_off << " at " << i;
        }
      }
}

TEST(StreamCopyRows, GathersExactlyTheRowsAndLeavesNullRows) {
  std::vector<std::uint8_t> table(64 * 1024 + 64);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::uint8_t>(i * 37 + 11);
  for (std::size_t row : {std::size_t{8}, std::size_t{72}, std::size_t{144}, std::size_t{512}, std::size_t{520}})
    for (std::size_t dst_off : {0, 8}) {
      const std::size_t n = 100;
      std::vector<const void*> src(n);
      for (std::size_t i = 0; i < n; ++i)
        src[i] = i % 9 == 4 ? nullptr : table.data() + (i * 7919 + 3) % (table.size() - row);
      std::vector<std::uint8_t> dst(n * row + 64, 0xee);
      epx::stream_copy_rows(dst.data() + dst_off, src.data(), n, row);
      for (std::size_t k = 0; k < dst.size(); ++k) {
        const bool inside = k >= dst_off && k < dst_off + n * row;
        const std::size_t i = inside ? (k - dst_off) / row : 0;
        const std::uint8_t want = inside && src[i] ? static_cast<const std::uint8_t*>(src[i])[(k - dst_off) % row] : 0xee;
        ASSERT_EQ(dst[k], want) << "row bytes " << row << " dst+" << dst_off << " at " << k;
      }
    }
}

// A StreamScope decides for its thread only and restores what it found; copies inside a
// non-streaming scope are exact too (the engine's small calls, DataPlaneOptions::stream_min_call_bytes).
TEST(BulkCopy, StreamScopeTurnsStreamingOffOnItsThreadOnly) {
  const std::size_t big = std::max<std::size_t>(epx::stream_min_bytes(), std::size_t{1} << 16);
  const bool by_default = epx::bulk_copy_streams(big);  // false only with EPX_STREAM_MIN_BYTES=0
  std::vector<std::uint8_t> src(big + 64), dst(big + 64, 0xee);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 29 + 3);
  {
    const epx::StreamScope off(false);
    EXPECT_FALSE(epx::bulk_copy_streams(big));
    bool other_thread = false;
    std::thread([&] { other_thread = epx::bulk_copy_streams(big); }).join();
    EXPECT_EQ(other_thread, by_default);
    {
      const epx::StreamScope on(true);
      EXPECT_EQ(epx::bulk_copy_streams(big), by_default);
    }
    EXPECT_FALSE(epx::bulk_copy_streams(big));  // the inner scope restored "off"
    epx::bulk_copy(dst.data() + 3, src.data() + 1, big);
    for (std::size_t i = 0; i < dst.size(); ++i)
      ASSERT_EQ(dst[i], i >= 3 && i < 3 + big ? src[1 + i - 3] : 0xee) << "at " << i;
  }
  EXPECT_EQ(epx::bulk_copy_streams(big), by_default);
  EXPECT_FALSE(epx::bulk_copy_streams(0));
}

}  // namespace
