// Which elements each member reduces, and how they are cut into chunks.
#include <algorithm>

#include "algorithms.hpp"

namespace epx::detail {

namespace {
constexpr std::uint64_t kLine = 16;  // float32 elements per 64-byte line
}

std::vector<Piece> part_of(const BucketCall& c, int k) {
  std::vector<Piece> part;
  const auto n = static_cast<std::uint64_t>(c.n());
  if (c.op == BucketOp::kReduceScatter) {
    for (int t = 0; t < c.num_tensors(); ++t) {
      const std::uint64_t shard = c.mine.tensors[static_cast<std::size_t>(t)].bytes / 4 / n;
      if (shard > 0) part.push_back({t, static_cast<std::uint64_t>(k) * shard, shard});
    }
    return part;
  }
  return stream_part(c, c.n(), k);
}

std::vector<Piece> stream_part(const BucketCall& c, int parts, int k) {
  std::vector<Piece> part;
  const auto n = static_cast<std::uint64_t>(parts);
  std::uint64_t total = 0;
  for (const TensorDesc& d : c.mine.tensors) total += d.bytes / 4;
  const std::uint64_t share = (total + n * kLine - 1) / (n * kLine) * kLine;
  const std::uint64_t lo = std::min(total, static_cast<std::uint64_t>(k) * share), hi = std::min(total, lo + share);
  std::uint64_t at = 0;  // stream position of tensor t's element 0
  for (int t = 0; t < c.num_tensors() && at < hi; ++t) {
    const std::uint64_t e = c.mine.tensors[static_cast<std::size_t>(t)].bytes / 4;
    const std::uint64_t a = std::max(lo, at), b = std::min(hi, at + e);
    if (a < b) part.push_back({t, a - at, b - a});
    at += e;
  }
  return part;
}

std::vector<std::vector<Piece>> chunks_of(const std::vector<Piece>& part, std::uint64_t cap) {
  std::vector<std::vector<Piece>> chunks;
  std::uint64_t room = 0;
  for (Piece p : part)
    while (p.count > 0) {
      if (room == 0) chunks.emplace_back(), room = cap;
      const std::uint64_t m = std::min(room, p.count);
      chunks.back().push_back({p.tensor, p.elem, m});
      p.elem += m, p.count -= m, room -= m;
    }
  return chunks;
}

std::uint64_t elems_of(const std::vector<Piece>& pieces) {
  std::uint64_t e = 0;
  for (const Piece& p : pieces) e += p.count;
  return e;
}

}  // namespace epx::detail
