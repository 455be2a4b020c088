// The bucket algorithms (docs/buffers.md): each runs a call's data phase after the header
// exchange, with the same result bit for bit (docs/spec.md §8's order). One file each.
#pragma once

#include <cstdint>
#include <vector>

#include "call.hpp"
#include "channels.hpp"

namespace epx::detail {

class Board;

/// What an algorithm runs with (this rank's side of the buffer).
struct BucketContext {
  Transport& t;
  Channels& ch;
  bool read_peers = false;             ///< every peer's window is readable in place (peer_window)
  Board* board = nullptr;              ///< headers go through these one-shot boards (board.hpp); null: channels
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
/// Bytes of the staged payload this rank sends member `k` (one-shot: of its board slot; else 0).
std::uint64_t staged_payload_bytes(const BucketCall& c, int k);
/// Puts the staged payload for member `k` at `offset` of its window; `scratch` keeps packed
/// bf16 alive until the exchange's quiet.
void put_staged_payload(BucketContext& ctx, const BucketCall& c, int k, std::size_t offset,
                        std::vector<std::vector<std::uint16_t>>& scratch);

/// all_reduce runs one-shot automatically up to this many bytes: one member reads all P
/// inputs, so above it mapped's P parts in parallel win (8 shm ranks on 2 cores: one-shot
/// 20 vs 26 us at 4 KiB, a tie at 16 KiB, 52 vs 45 us at 32 KiB; BENCHMARKS.md, "What we
/// tried": bucket collectives).
inline constexpr std::uint64_t kOneShotAllReduceBytes = std::uint64_t{16} << 10;
/// Bytes a tensor of `bytes` takes in a one-shot board slot (64-byte aligned places).
inline std::uint64_t board_stride(std::uint64_t bytes) { return (bytes + 63) / 64 * 64; }
/// Bytes of this rank's inputs in its board slot (one-shot: must fit chunk_bytes).
std::uint64_t one_shot_bytes(const BucketCall& c);
/// Copies this rank's inputs into its board slot `slot` (after the header area).
void write_one_shot_payload(const BucketCall& c, std::byte* slot);
/// The header exchange through the boards (board.hpp): my header (and a one-shot call's
/// inputs) into my slot, one round of flags, every member's header decoded where it lies.
void exchange_on_board(Board& board, BucketCall& c);

void run_local(BucketCall& c);  ///< a group of one
void run_staged(BucketContext& ctx, BucketCall& c);
void run_mapped(BucketContext& ctx, BucketCall& c);
void run_pipelined(BucketContext& ctx, BucketCall& c);
void run_two_level(BucketContext& ctx, BucketCall& c);
void run_direct(BucketContext& ctx, BucketCall& c);
void run_one_shot(BucketContext& ctx, BucketCall& c);

/// reduce_scatter's shard bytes of tensor t (x bytes / n).
inline std::uint64_t shard_bytes(const BucketCall& c, int t) {
  return c.mine.tensors[static_cast<std::size_t>(t)].bytes / static_cast<std::uint64_t>(c.n());
}

}  // namespace epx::detail
