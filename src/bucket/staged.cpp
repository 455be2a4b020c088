// Staged: one exchange. Every member's data travels in the message that carries its call
// header (a slot of each receiver), and each receiver reduces (or copies) from its slots.
// For small calls: a single round of signals, no second one.
#include <algorithm>
#include <cstring>

#include "algorithms.hpp"
#include "epx/spi/copy.hpp"
#include "kernels.hpp"

namespace epx::detail {

namespace {

bool bf16_wire(const BucketCall& c) { return c.op == BucketOp::kReduceScatter && c.precision == CommPrecision::kBF16; }

/// Bytes of tensor t in a staged message to one member.
std::uint64_t staged_tensor_bytes(const BucketCall& c, int t) {
  const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
  if (c.op != BucketOp::kReduceScatter) return bytes;
  return bytes / 4 / static_cast<std::uint64_t>(c.n()) * wire_bytes(bf16_wire(c));
}

/// A put of staged data, which its receiver reads at once: on a transport whose puts are
/// copies, in pieces below the streaming threshold (epx/spi/copy.hpp), so the bytes stay in
/// the shared cache instead of going to memory and back.
void put_cached(Transport& t, int peer, std::size_t offset, const std::byte* src, std::size_t bytes) {
  const std::size_t piece = t.caps().put_completes_on_return && stream_min_bytes() > 64 ? stream_min_bytes() - 64 : bytes;
  for (std::size_t at = 0; at < bytes; at += piece) t.put(peer, offset + at, src + at, std::min(piece, bytes - at), 0);
}

std::uint64_t staged_bytes(const BucketCall& c) {
  std::uint64_t b = 0;
  for (int t = 0; t < c.num_tensors(); ++t) b += staged_tensor_bytes(c, t);
  return b;
}

/// Two-level applies: machines known, the members in machine-major order with the same
/// count (>= 2) on each of >= 2 machines.
bool two_level_fits(const BucketCall& c, const BucketContext& ctx) {
  if (ctx.machine_of_rank.empty()) return false;
  std::vector<int> count;
  int last = -1;
  for (int r : c.members) {
    const int m = ctx.machine_of_rank[static_cast<std::size_t>(r)];
    if (m != last) {
      for (int seen = 0; seen < static_cast<int>(count.size()); ++seen)
        if (seen == m) return false;  // a machine's members are not contiguous
      last = m;
      count.push_back(0);
    }
    ++count.back();
  }
  if (count.size() < 2 || count[0] < 2) return false;
  for (int k : count)
    if (k != count[0]) return false;
  return true;
}

}  // namespace

namespace {

/// With the boards: one-shot when the inputs fit a board slot (all_reduce: up to
/// kOneShotAllReduceBytes unless forced), else mapped (reductions) or direct (all_gather);
/// forced mapped / direct where they can run.
BucketAlgorithm choose_on_board(const BucketCall& c, std::size_t chunk_bytes, BucketAlgorithm forced) {
  const std::uint64_t limit = c.op == BucketOp::kAllReduce && forced != BucketAlgorithm::kOneShot
                                  ? std::min<std::uint64_t>(chunk_bytes, kOneShotAllReduceBytes)
                                  : chunk_bytes;
  const bool fits = one_shot_bytes(c) <= limit;
  if (c.op == BucketOp::kAllGather) {
    if (forced == BucketAlgorithm::kDirect) return BucketAlgorithm::kDirect;
    return fits ? BucketAlgorithm::kOneShot : BucketAlgorithm::kDirect;
  }
  if (forced == BucketAlgorithm::kMapped) return BucketAlgorithm::kMapped;
  return fits ? BucketAlgorithm::kOneShot : BucketAlgorithm::kMapped;
}

}  // namespace

BucketAlgorithm choose_algorithm(const BucketCall& c, const BucketContext& ctx, std::size_t chunk_bytes,
                                 BucketAlgorithm forced) {
  if (ctx.board) return choose_on_board(c, chunk_bytes, forced);
  const bool fits = staged_bytes(c) <= chunk_bytes;
  if (c.op == BucketOp::kAllGather) {
    if (forced == BucketAlgorithm::kDirect) return BucketAlgorithm::kDirect;
    return fits ? BucketAlgorithm::kStaged : BucketAlgorithm::kDirect;
  }
  const bool two_level = two_level_fits(c, ctx);
  switch (forced) {
    case BucketAlgorithm::kStaged: if (fits) return BucketAlgorithm::kStaged; break;
    case BucketAlgorithm::kMapped: if (ctx.read_peers) return BucketAlgorithm::kMapped; break;
    case BucketAlgorithm::kPipelined: return BucketAlgorithm::kPipelined;
    case BucketAlgorithm::kTwoLevel:
      return two_level && c.op == BucketOp::kAllReduce ? BucketAlgorithm::kTwoLevel : BucketAlgorithm::kPipelined;
    default: if (fits) return BucketAlgorithm::kStaged; break;
  }
  if (ctx.read_peers) return BucketAlgorithm::kMapped;
  return two_level && c.op == BucketOp::kAllReduce ? BucketAlgorithm::kTwoLevel : BucketAlgorithm::kPipelined;
}

std::uint64_t staged_payload_bytes(const BucketCall& c, int) {
  if (c.mine.algorithm == BucketAlgorithm::kOneShot) return one_shot_bytes(c);
  return c.mine.algorithm == BucketAlgorithm::kStaged ? staged_bytes(c) : 0;
}

void put_staged_payload(BucketContext& ctx, const BucketCall& c, int k, std::size_t offset,
                        std::vector<std::vector<std::uint16_t>>& scratch) {
  const int peer = c.members[static_cast<std::size_t>(k)];
  for (int t = 0; t < c.num_tensors(); ++t) {
    const std::uint64_t b = staged_tensor_bytes(c, t);
    const std::byte* src = c.in[static_cast<std::size_t>(t)];
    if (c.op == BucketOp::kReduceScatter) src += static_cast<std::uint64_t>(k) * shard_bytes(c, t);
    if (bf16_wire(c) && b > 0) {
      scratch.emplace_back(b / 2);
      pack_bf16(scratch.back().data(), reinterpret_cast<const float*>(src), b / 2);
      src = reinterpret_cast<const std::byte*>(scratch.back().data());
    }
    if (b > 0) put_cached(ctx.t, peer, offset, src, b);
    offset += b;
  }
}

void run_staged(BucketContext& ctx, BucketCall& c) {
  const int n = c.n();
  std::vector<ReduceSource> srcs(static_cast<std::size_t>(n));
  std::uint64_t at = kHeaderBytes;  // position of tensor t in every slot
  for (int t = 0; t < c.num_tensors(); ++t) {
    const std::uint64_t b = staged_tensor_bytes(c, t), bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
    const std::byte* own = c.in[static_cast<std::size_t>(t)];
    std::byte* out = c.out[static_cast<std::size_t>(t)];
    if (c.op == BucketOp::kAllGather) {
      for (int j = 0; j < n; ++j) {
        const std::byte* from = j == c.me ? own : c.slots[static_cast<std::size_t>(j)] + at;
        std::byte* to = out + static_cast<std::uint64_t>(j) * bytes;
        if (to != from && bytes > 0) std::memcpy(to, from, bytes);
      }
    } else {
      const std::uint64_t lo = c.op == BucketOp::kReduceScatter ? static_cast<std::uint64_t>(c.me) * shard_bytes(c, t) : 0;
      const bool bf16 = bf16_wire(c);
      for (int j = 0; j < n; ++j)
        srcs[static_cast<std::size_t>(j)] =
            j == c.me ? ReduceSource{own + lo, bf16 ? SourceKind::kF32ToBF16 : SourceKind::kF32}
                      : ReduceSource{c.slots[static_cast<std::size_t>(j)] + at, bf16 ? SourceKind::kBF16Bits : SourceKind::kF32};
      reduce_into(reinterpret_cast<float*>(out + lo), srcs.data(), n, b / wire_bytes(bf16), c.scale);
    }
    at += b;
  }
  for (int j = 0; j < n; ++j)
    if (j != c.me) ctx.ch.consume(c.members[static_cast<std::size_t>(j)]);
}

void run_local(BucketCall& c) {
  for (int t = 0; t < c.num_tensors(); ++t) {
    const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
    if (c.op == BucketOp::kAllGather) {
      if (c.out[static_cast<std::size_t>(t)] != c.in[static_cast<std::size_t>(t)] && bytes > 0)
        std::memcpy(c.out[static_cast<std::size_t>(t)], c.in[static_cast<std::size_t>(t)], bytes);
      continue;
    }
    const bool bf16 = c.op == BucketOp::kReduceScatter && c.precision == CommPrecision::kBF16;
    const ReduceSource own{c.in[static_cast<std::size_t>(t)], bf16 ? SourceKind::kF32ToBF16 : SourceKind::kF32};
    reduce_into(reinterpret_cast<float*>(c.out[static_cast<std::size_t>(t)]), &own, 1, bytes / 4, c.scale);
  }
}

}  // namespace epx::detail
