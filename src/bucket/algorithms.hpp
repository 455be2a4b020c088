// The bucket algorithms (docs/buffers.md): each runs a call's data phase after the header
// exchange, with the same result bit for bit (SPEC §8's order). One file each.
#pragma once

#include <cstdint>
#include <vector>

#include "call.hpp"
#include "channels.hpp"

namespace epx::detail {

/// What an algorithm runs with (this rank's side of the buffer).
struct BucketContext {
  Transport& t;
  Channels& ch;
  bool read_peers = false;             ///< every peer's window is readable in place (peer_window)
  std::vector<int> machine_of_rank;    ///< [P]; empty: unknown
};

/// A run of float32 elements of one tensor.
struct Piece {
  int tensor = 0;
  std::uint64_t elem = 0;   ///< first element
  std::uint64_t count = 0;
};

/// The elements member `k` reduces: reduce_scatter its shard of every tensor; all_reduce
/// its share of all tensors' elements taken as one stream (64-byte aligned splits).
std::vector<Piece> part_of(const BucketCall& c, int k);
/// Part k of `parts` of all tensors' elements taken as one stream (64-byte aligned splits).
std::vector<Piece> stream_part(const BucketCall& c, int parts, int k);
/// `part` cut into chunks of at most `cap` elements (a piece may span chunks).
std::vector<std::vector<Piece>> chunks_of(const std::vector<Piece>& part, std::uint64_t cap);
/// Elements of a list of pieces.
std::uint64_t elems_of(const std::vector<Piece>& pieces);

/// The algorithm of a call (a function of what every member's header carries, so members
/// with the same inputs choose the same one).
BucketAlgorithm choose_algorithm(const BucketCall& c, const BucketContext& ctx, std::size_t chunk_bytes,
                                 BucketAlgorithm forced);
/// Bytes of the staged payload this rank sends member `k` (0 unless staged).
std::uint64_t staged_payload_bytes(const BucketCall& c, int k);
/// Puts the staged payload for member `k` at `offset` of its window; `scratch` keeps packed
/// bf16 alive until the exchange's quiet.
void put_staged_payload(BucketContext& ctx, const BucketCall& c, int k, std::size_t offset,
                        std::vector<std::vector<std::uint16_t>>& scratch);

void run_local(BucketCall& c);  ///< a group of one
void run_staged(BucketContext& ctx, BucketCall& c);
void run_mapped(BucketContext& ctx, BucketCall& c);
void run_pipelined(BucketContext& ctx, BucketCall& c);
void run_two_level(BucketContext& ctx, BucketCall& c);
void run_direct(BucketContext& ctx, BucketCall& c);

/// reduce_scatter's shard bytes of tensor t (x bytes / n).
inline std::uint64_t shard_bytes(const BucketCall& c, int t) {
  return c.mine.tensors[static_cast<std::size_t>(t)].bytes / static_cast<std::uint64_t>(c.n());
}

}  // namespace epx::detail
