// Combine, push path (spi::Path::kDirect) and its replies-first variant (kRowsFirst).
//
// Push: after the header exchange every expert rank puts, for each source, its received
// rows (compact: y's rows themselves, one put per contiguous block; expanded: each token's
// partial sum, or the row itself where one unweighted slot passes unchanged) into the
// source's reply area at the slot its dispatch plan gave the (token, destination) pair
// (send_replies), completed by the configured protocol. The source waits for them by the
// same protocol (await_rows) and adds them up in docs/spec.md §4's order (reduce).
//
// Replies first: a combine right after the dispatch whose handle it uses, when that
// dispatch's headers said no rank's output is a view of its window (CallState): that
// dispatch's exchange proved every reply area read, and without views nobody can pull, so
// every rank pushes before the exchange, only quieted; the exchange completes the replies.
// With an output pool the experts' y may lie in their windows and be pulled (one pass, but
// an exchange first and a "done reading" round after: two synchronisations); a tiny combine
// (every rank's dispatch output at most DataPlaneOptions::replies_first_max_bytes, 160 KiB by
// default) goes replies first all the same: at 1 token x 8 ranks a synchronisation costs
// more than the two extra passes, from 2-4 tokens on it does not (BENCHMARKS.md). Where no
// combine can pull (unmapped peers) replies go first at any size.
#include <algorithm>

#include "../path.hpp"

namespace epx {

bool Buffer::Impl::replies_first_allowed(const detail::HandleState& h) const noexcept {
  if (!spi::allows_replies_first(config)) return false;
  if (geo.output_pool_bytes() == 0) return true;
  if (config.dataplane.replies_first_max_bytes == 0) return false;  // never, with a pool
  // Where nobody can pull (peers not mapped: the simulator, shmem across machines) the
  // replies are pushed either way, and first saves a synchronisation at any size.
  if (!spi::allows(spi::Path::kPull, config, transport.peer_window(rank) != nullptr)) return true;
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * sizeof(std::uint16_t);
  return std::all_of(h.out_rows_at.begin(), h.out_rows_at.end(), [&](std::int64_t rows) {
    return static_cast<std::size_t>(rows) * row_bytes <= config.dataplane.replies_first_max_bytes;
  });
}

}  // namespace epx

namespace epx::detail {
namespace {

class Push final : public CombinePath {
 public:
  void send(PathContext m, const CombineStep& s) const override { m.send_replies(*s.h, *s.a, true); }
  void receive(PathContext m, const CombineStep& s) const override {
    // Reply row i answers plan entry i in segment order (destination d's rows start at segment_begin[d]).
    const std::vector<std::int32_t>& seg = s.h->plan.segment_begin;
    m.await_rows(&Geometry::combine_signal, "combine data", std::vector<std::int64_t>(seg.begin(), seg.end()),
                 {{Region::kReplies, static_cast<std::size_t>(m.setup.config.hidden) * sizeof(std::uint16_t)}});
    m.reduce(*s.h, *s.a, nullptr, *s.out);
  }
};

class RepliesFirst final : public CombinePath {
 public:
  bool replies_before_exchange() const noexcept override { return true; }
  void send(PathContext m, const CombineStep& s) const override { m.send_replies(*s.h, *s.a, false); }
  void receive(PathContext m, const CombineStep& s) const override { m.reduce(*s.h, *s.a, nullptr, *s.out); }  // the exchange completed them
};

}  // namespace

const CombinePath& push_combine() {
  static const Push unit;
  return unit;
}
const CombinePath& replies_first_combine() {
  static const RepliesFirst unit;
  return unit;
}

}  // namespace epx::detail
