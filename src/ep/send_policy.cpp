#include "send_policy.hpp"

#include <algorithm>
#include <cmath>

namespace epx::detail {

std::size_t min_efficient_put_bytes(const TransportCaps& caps, std::size_t aggregate_bytes) {
  if (caps.put_overhead_ns <= 0 || caps.put_gbps <= 0) return 0;
  const double want = kPutWireOverFixed * caps.put_overhead_ns * caps.put_gbps;  // GB/s = bytes per ns
  const auto bytes = static_cast<std::size_t>(std::ceil(want));
  return aggregate_bytes > 0 ? std::min(bytes, aggregate_bytes) : 0;  // one put per row: blocks change nothing
}

std::int64_t send_block_tokens(const SendPolicy& policy, const SendShape& shape, const TransportCaps& caps) {
  const std::int64_t all = std::max<std::int64_t>(1, shape.tokens);
  const std::size_t row = std::max<std::size_t>(1, shape.row_bytes);
  const auto rows_of = [&](std::size_t bytes) { return std::max<std::int64_t>(1, static_cast<std::int64_t>(bytes / row)); };
  switch (policy.kind) {
    case SendPolicyKind::kWhole: return all;
    case SendPolicyKind::kBlock: return std::min(all, rows_of(policy.block_bytes));
    case SendPolicyKind::kAuto: break;
  }
  std::int64_t block = rows_of(kCacheBlockBytes);
  const std::size_t min_put = min_efficient_put_bytes(caps, shape.aggregate_bytes);
  if (min_put > 0 && shape.rows > 0) {
    // A destination's share of a block of b tokens: b x rows / (tokens x peers) rows.
    const double share_per_token = static_cast<double>(shape.rows) * static_cast<double>(row) /
                                   (static_cast<double>(all) * static_cast<double>(std::max(1, shape.peers)));
    const double need = std::ceil(static_cast<double>(min_put) / share_per_token);
    block = std::max(block, static_cast<std::int64_t>(std::min(need, static_cast<double>(all))));
  }
  return std::min(all, block);
}

std::int64_t relay_chunk_rows(std::size_t relay_chunk_bytes, std::size_t row_bytes, const TransportCaps& caps) {
  const std::size_t row = std::max<std::size_t>(1, row_bytes);
  if (relay_chunk_bytes != DataPlaneOptions::kRelayChunkAuto)
    return relay_chunk_bytes == 0 ? 0 : std::max<std::int64_t>(1, static_cast<std::int64_t>(relay_chunk_bytes / row));
  if (caps.put_overhead_ns <= 0 || caps.put_gbps <= 0) return 0;
  const double bytes = kRelayChunkWireOverFixed * caps.put_overhead_ns * caps.put_gbps;  // GB/s = bytes per ns
  return std::max<std::int64_t>(kRelayChunkMinRows, static_cast<std::int64_t>(std::ceil(bytes / static_cast<double>(row))));
}

}  // namespace epx::detail
