// Direct (all_gather): after the header exchange every member puts its srcs straight into
// every other member's outputs (their offsets came with the headers), then a done round.
#include <cstring>

#include "algorithms.hpp"

namespace epx::detail {

void run_direct(BucketContext& ctx, BucketCall& c) {
  const int n = c.n();
  for (int s = 1; s < n; ++s) {
    const int k = (c.me + s) % n;
    for (int t = 0; t < c.num_tensors(); ++t) {
      const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
      const TensorDesc& d = c.headers[static_cast<std::size_t>(k)].tensors[static_cast<std::size_t>(t)];
      if (bytes > 0)
        ctx.t.put(c.members[static_cast<std::size_t>(k)], d.out_off + static_cast<std::uint64_t>(c.me) * bytes,
                  c.in[static_cast<std::size_t>(t)], bytes, 0);
    }
  }
  for (int t = 0; t < c.num_tensors(); ++t) {
    const std::uint64_t bytes = c.mine.tensors[static_cast<std::size_t>(t)].bytes;
    std::byte* mine = c.out[static_cast<std::size_t>(t)] + static_cast<std::uint64_t>(c.me) * bytes;
    if (mine != c.in[static_cast<std::size_t>(t)] && bytes > 0) std::memcpy(mine, c.in[static_cast<std::size_t>(t)], bytes);
  }
  if (!ctx.t.caps().put_completes_on_return) ctx.t.quiet(0);
  for (int s = 1; s < n; ++s) ctx.ch.send_done(c.members[static_cast<std::size_t>((c.me + s) % n)]);
  for (int s = 1; s < n; ++s) ctx.ch.wait_done(c.members[static_cast<std::size_t>((c.me + n - s) % n)], "bucket done");
}

}  // namespace epx::detail
