// bulk_copy (streaming stores for large copies) copies exactly the bytes memcpy would, for
// every alignment of source and destination and sizes around the streaming threshold and
// the 128-byte step, and touches nothing outside [dst, dst + bytes).
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace
