// Combine, pull path (spi::Path::kPull). When every rank's y lies in its window — its
// zero-copy recv_x, or rows inside the output pool such as a one-copy recv_x the experts
// overwrote in place (each rank says so in its combine header, with y's offset) — and the
// transport maps peers' windows, nobody puts: each source reduces reading the expert
// ranks' rows where they lie (reduce with the headers), one pass, then tells every peer it
// has read its rows and waits until every peer has read its own (so nobody overwrites rows
// still being read: the user's next y, the next dispatch).
#include "../path.hpp"

namespace epx::detail {
namespace {

// My reads are plain loads that completed before this store (release orders them), so a
// peer that sees it may overwrite the rows I read.
void finish_pull(PathContext& m) {
  Impl::PhaseTimer timer = m.timer(0, Phase::kBarrier);
  // My reads are plain loads that completed before this store (release orders them), so a
  // peer that sees it may overwrite the rows I read (its user's next y, the next dispatch).
  for (int i = 0; i < m.setup.P; ++i) m.setup.transport.signal((m.setup.rank + i) % m.setup.P, m.setup.geo.pull_done_signal(m.setup.rank), m.call.epoch, 0);
  for (int s = 0; s < m.setup.P; ++s) m.setup.transport.wait_signal(m.setup.geo.pull_done_signal(s), m.call.epoch, {"combine pull done", s});
}

class Pull final : public CombinePath {
 public:
  void send(PathContext, const CombineStep&) const override {}  // nothing moves: the sources read in place
  void receive(PathContext m, const CombineStep& s) const override {
    m.reduce(*s.h, *s.a, s.peers, *s.out);
    finish_pull(m);
  }
};

// The pull path's row: a per-call variant of direct's combine (no dispatch side) where the
// peers are mapped; explicit or tail (flagged rows are not where y lies).
constexpr spi::PathRule kPullRow{spi::Path::kPull, "pull", {true, true, false}, "flagged rows are not where y lies", true, true, true,
                                 true, "pull", true, "pull", false};

}  // namespace

const PathUnit& pull_path() {
  static const Pull unit;
  static const PathUnit path{kPullRow, nullptr, &unit};
  return path;
}

}  // namespace epx::detail
