// The dispatch's send policy (src/ep/send_policy.hpp): tokens per block of the send loop
// from the policy, the shape of the call and the transport's put costs.
#include "send_policy.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace epx::detail {
namespace {

TransportCaps costs(double overhead_ns, double gbps) {
  TransportCaps c;
  c.put_overhead_ns = overhead_ns;
  c.put_gbps = gbps;
  return c;
}

// The calibration shape's FP8 row (7168 B + 56 scales x 4 B) on 16384 tokens, about
// R(1-(1-1/R)^6) destination rows per token.
SendShape shape(int peers, double rows_per_token) {
  return {peers, 7392, 16384, static_cast<std::int64_t>(16384 * rows_per_token), std::size_t{1} << 20};
}

TEST(SendPolicy, FixedPoliciesAreWhatTheyName) {
  const TransportCaps none;
  EXPECT_EQ(send_block_tokens({SendPolicyKind::kWhole, 0}, shape(8, 4.4), none), 16384);
  EXPECT_EQ(send_block_tokens({SendPolicyKind::kBlock, 256 << 10}, shape(8, 4.4), none), (256 << 10) / 7392);
  EXPECT_EQ(send_block_tokens({SendPolicyKind::kBlock, 100}, shape(8, 4.4), none), 1);  // less than a row: a row
  EXPECT_EQ(send_block_tokens({SendPolicyKind::kBlock, std::size_t{1} << 30}, shape(8, 4.4), none), 16384);
  SendShape empty = shape(8, 4.4);
  empty.tokens = 0, empty.rows = 0;
  EXPECT_EQ(send_block_tokens({SendPolicyKind::kAuto, 0}, empty, costs(105, 337)), 1);
}

// Puts that cost nothing beyond their bytes (shared memory: a memcpy): cache-sized blocks at
// every P, as the blocked send always did.
TEST(SendPolicy, AutoKeepsCacheBlocksWhenPutsAreFree) {
  for (int P : {8, 64, 128})
    EXPECT_EQ(send_block_tokens({}, shape(P, 5), TransportCaps{}), static_cast<std::int64_t>(kCacheBlockBytes / 7392)) << "P " << P;
  // shm-like costs (tens of ns at ~10 GB/s): the minimum put is below one row.
  EXPECT_EQ(send_block_tokens({}, shape(8, 4.4), costs(50, 10)), static_cast<std::int64_t>(kCacheBlockBytes / 7392));
}

// The ascend950 profile's put (doorbell 100 ns + issue + WR ~ 105 ns at 337 GB/s): each
// destination's share of a block must be a put of >= 8 x 105 ns x 337 GB/s ~ 284 KB, so the
// blocks grow with P (at EP128 a 256 KiB block would give each destination 1-2 rows).
TEST(SendPolicy, AutoGrowsBlocksUntilEachDestinationsShareIsAnEfficientPut) {
  const TransportCaps ascend = costs(105.2, 337.1);
  const std::size_t min_put = min_efficient_put_bytes(ascend, std::size_t{1} << 20);
  EXPECT_NEAR(static_cast<double>(min_put), 8 * 105.2 * 337.1, 1.0);
  std::int64_t last = 0;
  for (const auto& [P, U] : std::vector<std::pair<int, double>>{{8, 4.44}, {16, 5.18}, {32, 5.6}, {64, 5.83}, {128, 5.94}}) {
    const SendShape s = shape(P, U);
    const std::int64_t block = send_block_tokens({}, s, ascend);
    const double share = static_cast<double>(block) * static_cast<double>(s.rows) / (16384.0 * P) * 7392;
    EXPECT_GE(share, static_cast<double>(min_put)) << "P " << P;
    EXPECT_LT(share, static_cast<double>(min_put) + 7392.0 * s.rows / 16384.0 / P * 2) << "P " << P;  // no bigger than needed
    EXPECT_GT(block, last) << "P " << P;
    last = block;
  }
  // The aggregation limit caps the put (a put never grows past it); off, blocks change nothing.
  EXPECT_EQ(min_efficient_put_bytes(ascend, 64 << 10), std::size_t{64} << 10);
  EXPECT_EQ(min_efficient_put_bytes(ascend, 0), 0u);
  SendShape unaggregated = shape(128, 5.94);
  unaggregated.aggregate_bytes = 0;
  EXPECT_EQ(send_block_tokens({}, unaggregated, ascend), static_cast<std::int64_t>(kCacheBlockBytes / 7392));
}

// The relays' chunks (DataPlaneOptions::relay_chunk_bytes): explicit bytes are rows of at
// least one; auto chunks only where the transport states its put costs (the simulator), at
// kRelayChunkWireOverFixed x overhead x rate bytes, never fewer than kRelayChunkMinRows rows.
TEST(RelayChunks, ExplicitBytesAreRowsAndAutoFollowsThePutCosts) {
  const std::size_t row = 14336;  // H 7168, bf16
  EXPECT_EQ(relay_chunk_rows(0, row, costs(20, 150)), 0);  // 0: the serial relay, whatever the costs
  EXPECT_EQ(relay_chunk_rows(1, row, TransportCaps{}), 1);  // less than a row: a row
  EXPECT_EQ(relay_chunk_rows(std::size_t{1} << 20, row, TransportCaps{}), (1 << 20) / 14336);
  const std::size_t autob = DataPlaneOptions::kRelayChunkAuto;
  EXPECT_EQ(relay_chunk_rows(autob, row, TransportCaps{}), 0);  // threads, shm, shmem, UCX: serial
  EXPECT_EQ(relay_chunk_rows(autob, row, costs(0, 150)), 0);
  EXPECT_EQ(relay_chunk_rows(autob, row, costs(1, 10)), kRelayChunkMinRows);  // cheap puts: the floor
  const double bytes = kRelayChunkWireOverFixed * 105.2 * 337.1;  // ascend950's put costs
  EXPECT_EQ(relay_chunk_rows(autob, row, costs(105.2, 337.1)), static_cast<std::int64_t>(std::ceil(bytes / 14336.0)));
}

}  // namespace
}  // namespace epx::detail
