// tests/reference/pp_engram.hpp — the independent references of docs/spec.md §9 (PPBuffer) and
// §10 (EngramBuffer), written apart from src/pp and src/engram; nothing of include/epx.
//
// PP: a seeded random program of sends and receives over P ranks — one global order of
// events whose per-rank subsequences are the ranks' programs. Every prefix of the order
// has at most `inflight` messages outstanding on each ordered pair, so running each rank's
// program with blocking sends (a full FIFO waits) and receives cannot deadlock: the
// earliest event not yet done can always proceed. Message bytes are a function of (sender,
// receiver, sequence number), so the receiver checks every byte without communication.
//
// Engram: every rank's shard is a function of (seed, layer, rank), so each rank builds the
// whole ("all-gathered") table itself; the expected output is that table indexed in a
// plain loop (docs/spec.md §10).
#pragma once

#include <cstdint>
#include <vector>

namespace epx::ref {

struct PPEvent {
  bool send = false;    ///< else a receive
  int peer = -1;        ///< destination of a send, source of a receive
  std::uint64_t seq = 0;  ///< the message's number on its pair
  std::uint64_t nbytes = 0;
  bool as_view = false;   ///< receives: through recv_view + release (else recv into a tensor)
};

struct PPProgram {
  std::vector<std::vector<PPEvent>> ranks;  ///< ranks[r]: r's events in program order
  std::vector<int> order;                   ///< the global order: the rank of each event
  std::uint64_t messages = 0;
};

/// `num_events` events over `links` (ordered pairs (s, d) that may carry messages; empty:
/// every pair, self included), sizes in [0, max_bytes] (0 and max_bytes among them),
/// at most `inflight` outstanding per pair; every message is received by the end.
PPProgram pp_random_program(int num_ranks, int inflight, std::uint64_t max_bytes, int num_events, std::uint64_t seed,
                            const std::vector<std::pair<int, int>>& links = {});

/// Byte i of message `seq` from `src` to `dst`.
std::uint8_t pp_message_byte(int src, int dst, std::uint64_t seq, std::uint64_t i);
/// The whole message.
std::vector<std::uint8_t> pp_message(int src, int dst, std::uint64_t seq, std::uint64_t nbytes);

/// Rank r's shard of layer l: N rows of `row_bytes` bytes (bf16 or FP8 bits), and, with
/// `sf_floats` > 0, its scale rows (sf_floats float32 each, finite, positive).
std::vector<std::uint8_t> engram_shard(std::uint64_t seed, int l, int r, std::int64_t N, std::size_t row_bytes);
std::vector<float> engram_shard_scales(std::uint64_t seed, int l, int r, std::int64_t N, std::size_t sf_floats);

/// Layer l's output: out[t, e] = table[indices[t, e]] (zero row for -1) over the whole table
/// (P * N rows: rank p's shard at rows p*N..); `indices` [T * E] row-major.
std::vector<std::uint8_t> engram_gather(const std::vector<std::uint8_t>& table, std::size_t row_bytes,
                                        const std::vector<std::int32_t>& indices);
std::vector<float> engram_gather_scales(const std::vector<float>& scales, std::size_t sf_floats,
                                        const std::vector<std::int32_t>& indices);

/// Seeded uniform indices in [0, rows) with about `padding_percent` % of them -1.
std::vector<std::int32_t> engram_random_indices(std::uint64_t seed, std::int64_t count, std::int64_t rows,
                                                int padding_percent);

}  // namespace epx::ref
