// Mapped (reduce_scatter, all_reduce on transports whose peer windows are readable): after
// the header exchange each member reads its part of every member's tensors where they lie,
// sums them block by block in member order and writes the result — reduce_scatter into its
// own shard, all_reduce into every member's tensor (puts) — then a done round. Each element
// is read and written by one member only, so no staging and no copy in between.
#include <algorithm>
#include <cstring>

#include "algorithms.hpp"
#include "kernels.hpp"

namespace epx::detail {

namespace {

/// Member j's tensor t, element `elem`, read in place.
const std::byte* peer_elem(BucketContext& ctx, const BucketCall& c, int j, int t, std::uint64_t elem) {
  const TensorDesc& d = c.headers[static_cast<std::size_t>(j)].tensors[static_cast<std::size_t>(t)];
  return ctx.t.peer_window(c.members[static_cast<std::size_t>(j)]) + d.in_off + elem * 4;
}

void reduce_piece(BucketContext& ctx, const BucketCall& c, const Piece& p, std::vector<ReduceSource>& srcs) {
  const bool bf16 = c.op == BucketOp::kReduceScatter && c.precision == CommPrecision::kBF16;
  float* acc = reduce_accumulator();
  for (int j = 0; j < c.n(); ++j)
    srcs[static_cast<std::size_t>(j)] = {peer_elem(ctx, c, j, p.tensor, p.elem), bf16 ? SourceKind::kF32ToBF16 : SourceKind::kF32};
  for (std::uint64_t off = 0; off < p.count; off += kReduceBlock) {
    const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(kReduceBlock, p.count - off));
    reduce_block(acc, srcs.data(), c.n(), off, m, c.scale);
    if (c.op == BucketOp::kReduceScatter) {
      std::memcpy(c.out[static_cast<std::size_t>(p.tensor)] + (p.elem + off) * 4, acc, m * 4);
      continue;
    }
    for (int s = 0; s < c.n(); ++s) {  // every member's copy, starting with the next one
      const int j = (c.me + 1 + s) % c.n();
      const TensorDesc& d = c.headers[static_cast<std::size_t>(j)].tensors[static_cast<std::size_t>(p.tensor)];
      ctx.t.put(c.members[static_cast<std::size_t>(j)], d.out_off + (p.elem + off) * 4, acc, m * 4, 0);
    }
  }
}

}  // namespace

void run_mapped(BucketContext& ctx, BucketCall& c) {
  std::vector<ReduceSource> srcs(static_cast<std::size_t>(c.n()));
  for (const Piece& p : part_of(c, c.me)) reduce_piece(ctx, c, p, srcs);
  for (int s = 1; s < c.n(); ++s) ctx.ch.send_done(c.members[static_cast<std::size_t>((c.me + s) % c.n())]);
  for (int s = 1; s < c.n(); ++s) ctx.ch.wait_done(c.members[static_cast<std::size_t>((c.me + c.n() - s) % c.n())], "bucket done");
}

}  // namespace epx::detail
