// One-shot (small calls on transports whose peer windows are readable in place): every
// member copied its inputs into its own board slot with its header (board.hpp), so after
// the one header round each member reads all members' inputs where they lie and computes
// its own outputs: all_reduce the whole sum (member order, scale at the end: the same bits
// whoever computes it, so the first member to get there publishes it in its slot and the
// later ones copy it), reduce_scatter its shard, all_gather the gathered tensors. No second
// round: nobody writes into another member's memory.
#include <cstring>

#include "algorithms.hpp"
#include "board.hpp"
#include "kernels.hpp"

namespace epx::detail {

std::uint64_t one_shot_bytes(const BucketCall& c) {
  std::uint64_t b = 0;
  for (const TensorDesc& d : c.mine.tensors) b += board_stride(d.bytes);
  return b;
}

void write_one_shot_payload(const BucketCall& c, std::byte* slot) {
  std::byte* at = slot + kHeaderBytes;
  for (int t = 0; t < c.num_tensors(); ++t) {
    const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
    if (bytes > 0) std::memcpy(at, c.in[static_cast<std::size_t>(t)], bytes);
    at += board_stride(bytes);
  }
}

void exchange_on_board(Board& board, BucketCall& c) {
  std::byte* mine = board.next_slot(c.group);
  encode_header(c.mine, mine);
  if (c.mine.algorithm == BucketAlgorithm::kOneShot && !c.mine.problem) write_one_shot_payload(c, mine);
  board.exchange(c.group, c.members, c.me);
  c.via_board = true;
  const int n = c.n();
  c.headers.assign(static_cast<std::size_t>(n), {});
  c.slots.assign(static_cast<std::size_t>(n), nullptr);
  c.headers[static_cast<std::size_t>(c.me)] = c.mine;
  for (int j = 0; j < n; ++j) {
    if (j == c.me) continue;
    const int peer = c.members[static_cast<std::size_t>(j)];
    c.slots[static_cast<std::size_t>(j)] = board.slot(c.group, peer);
    c.headers[static_cast<std::size_t>(j)] = decode_header(c.slots[static_cast<std::size_t>(j)], peer);
  }
}

namespace {

/// all_reduce: a member's published sum, else the sum computed here and published; then
/// copied into this member's tensors.
void all_reduce_once(Board& board, BucketCall& c) {
  const std::byte* result = board.published_result(c.group, c.members);
  if (result == nullptr) {
    std::byte* mine = board.my_result(c.group);
    std::vector<ReduceSource> srcs(static_cast<std::size_t>(c.n()));
    std::uint64_t at = 0;  // tensor t's place in the inputs and the result
    for (int t = 0; t < c.num_tensors(); ++t) {
      const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
      for (int j = 0; j < c.n(); ++j)
        srcs[static_cast<std::size_t>(j)] = {j == c.me ? c.in[static_cast<std::size_t>(t)] : c.slots[static_cast<std::size_t>(j)] + kHeaderBytes + at,
                                             SourceKind::kF32};
      reduce_into(reinterpret_cast<float*>(mine + at), srcs.data(), c.n(), bytes / 4, c.scale);
      at += board_stride(bytes);
    }
    board.publish_result(c.group);
    result = mine;
  }
  std::uint64_t at = 0;
  for (int t = 0; t < c.num_tensors(); ++t) {
    const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
    if (bytes > 0) std::memcpy(c.out[static_cast<std::size_t>(t)], result + at, bytes);
    at += board_stride(bytes);
  }
}

}  // namespace

void run_one_shot(BucketContext& ctx, BucketCall& c) {
  if (c.op == BucketOp::kAllReduce) return all_reduce_once(*ctx.board, c);
  const int n = c.n();
  const bool bf16 = c.op == BucketOp::kReduceScatter && c.precision == CommPrecision::kBF16;
  std::vector<ReduceSource> srcs(static_cast<std::size_t>(n));
  std::uint64_t at = kHeaderBytes;  // tensor t's place in every member's slot
  for (int t = 0; t < c.num_tensors(); ++t) {
    const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
    auto input = [&](int j) { return j == c.me ? c.in[static_cast<std::size_t>(t)] : c.slots[static_cast<std::size_t>(j)] + at; };
    std::byte* out = c.out[static_cast<std::size_t>(t)];
    if (c.op == BucketOp::kAllGather) {
      for (int j = 0; j < n; ++j) {
        std::byte* to = out + static_cast<std::uint64_t>(j) * bytes;
        if (to != input(j) && bytes > 0) std::memcpy(to, input(j), bytes);
      }
    } else {
      const std::uint64_t lo = c.op == BucketOp::kReduceScatter ? static_cast<std::uint64_t>(c.me) * shard_bytes(c, t) : 0;
      const std::uint64_t count = (c.op == BucketOp::kReduceScatter ? shard_bytes(c, t) : bytes) / 4;
      for (int j = 0; j < n; ++j)
        srcs[static_cast<std::size_t>(j)] = {input(j) + lo, bf16 ? SourceKind::kF32ToBF16 : SourceKind::kF32};
      reduce_into(reinterpret_cast<float*>(out + lo), srcs.data(), n, count, c.scale);
    }
    at += board_stride(bytes);
  }
}

}  // namespace epx::detail
