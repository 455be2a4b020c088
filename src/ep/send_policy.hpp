// The dispatch's send policy (epx/dataplane.hpp SendPolicy): how many of a worker's tokens
// go to every destination before its next ones. One owner of the rule; the direct dispatch
// (paths/dispatch_direct.cpp) asks it once per call and worker.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epx/dataplane.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

/// What one worker of one call sends.
struct SendShape {
  int peers = 1;                 ///< P (destinations, the own rank included)
  std::size_t row_bytes = 0;     ///< bytes of x read per row (data + scales)
  std::int64_t tokens = 0;       ///< the worker's tokens
  std::int64_t rows = 0;         ///< rows it sends, summed over destinations
  std::size_t aggregate_bytes = 0;  ///< DataPlaneOptions::aggregate_bytes (0: one put per row)
};

/// The cache-sized block of kAuto (and of today's blocked send): x rows of one block stay
/// in L2 while they are copied to their ~K destinations.
inline constexpr std::size_t kCacheBlockBytes = std::size_t{256} << 10;
/// kAuto: a put's wire time must be at least this many times its fixed cost.
inline constexpr double kPutWireOverFixed = 8.0;

/// The smallest put kAuto aims for: kPutWireOverFixed x put_overhead_ns x put_gbps bytes,
/// capped by the aggregation limit (a put never grows past it); 0 when caps state no costs.
std::size_t min_efficient_put_bytes(const TransportCaps& caps, std::size_t aggregate_bytes);

/// Tokens per block of the send loop, in [1, max(1, tokens)] (== tokens: the whole send).
/// kAuto: the cache block, grown so the average destination's share of a block,
/// block x rows / (tokens x peers) rows, is at least min_efficient_put_bytes.
std::int64_t send_block_tokens(const SendPolicy& policy, const SendShape& shape, const TransportCaps& caps);

/// DataPlaneOptions::relay_chunk_bytes kRelayChunkAuto: a relay chunk's wire time must be at
/// least this many times a put's fixed cost (each chunk costs every member and worker one
/// ordered signal to the relay) ...
inline constexpr double kRelayChunkWireOverFixed = 64.0;
/// ... and at least this many rows (so a chunk is never a handful of rows).
inline constexpr std::int64_t kRelayChunkMinRows = 16;

/// Relayed rows per chunk of the hierarchical schedule's relays, dispatch and combine
/// (paths/relay_chunks.hpp), the
/// same on every rank (from the agreed options and the transport's caps); 0 = the serial
/// relay. Explicit bytes: max(1, bytes / row_bytes). Auto: 0 where the caps state no put
/// costs (threads, shm, shmem, UCX: unchanged, measured in BENCHMARKS.md, "What we
/// tried": across machines), else max(kRelayChunkMinRows, the rows of
/// kRelayChunkWireOverFixed x put_overhead_ns x put_gbps bytes).
std::int64_t relay_chunk_rows(std::size_t relay_chunk_bytes, std::size_t row_bytes, const TransportCaps& caps);

}  // namespace epx::detail
