// Dispatch, ring path (spi::Path::kRing: the bounded receive area, BufferConfig::ring_rows > 0).
// Instead of a slot for every row it may receive (up to P x C rows), a rank keeps a ring of
// ring_rows rows per source. Senders fill it a chunk at a time and publish a cumulative
// count (the ring's tail); the receiver places each arrived row in the output and hands the
// slots back with a cumulative credit. A sender never writes row i before the credit reaches
// i - ring_rows + 1, so unconsumed rows are never overwritten. Both sides run in the same
// loop on every worker (each owns some destinations and some sources), which is what keeps
// two ranks filling each other's rings from waiting on each other: send does both, and
// receive has nothing left to wait for (RowsAt::kPlaced: recv_x's rows are in place).
//
// Counts carry the call's epoch in their high 32 bits, so a value left from an earlier
// call reads as "nothing yet" and the slots need no reset. Row metadata and FP8 scales
// (a few percent of a row) still go to their full-size regions at the planned slots.
#include <algorithm>
#include <cstring>

#include "../path.hpp"
#include "epx/spi/copy.hpp"
#include "ring_progress.hpp"

namespace epx::detail {
namespace {

// What every worker of one ring dispatch reads: the call's shape and where things lie.
struct RingCall {
  PathContext& m;
  const HandleState& h;
  const DispatchArgs& a;
  const std::vector<std::int32_t>* expert_base;  // fresh: rows travel with their metadata
  std::int64_t ring, chunk;                      // chunk: half a ring, the other half drains meanwhile
  bool fp8, expanded;
  std::size_t row_bytes, scale_bytes;
  std::uint64_t stamp;  // the call's epoch in the counts' high 32 bits
  std::vector<std::uint64_t> channel_bytes;
  void* out_rx;  // recv_x: where the rows are placed

  RingCall(PathContext& m_, const HandleState& h_, const DispatchArgs& a_, const std::vector<std::int32_t>* base, void* rx)
      : m(m_), h(h_), a(a_), expert_base(base), ring(m_.setup.config.ring_rows), chunk(std::max<std::int64_t>(1, ring / 2)),
        fp8(a_.x.dtype == DType::kFP8E4M3), expanded(h_.layout == RecvLayout::kExpanded),
        row_bytes(static_cast<std::size_t>(m_.setup.config.hidden) * dtype_size(a_.x.dtype)),
        scale_bytes(fp8 ? static_cast<std::size_t>(m_.setup.config.hidden / 128) * sizeof(float) : 0), stamp(m_.call.epoch << 32),
        channel_bytes(static_cast<std::size_t>(m_.setup.P)), out_rx(rx) {
    for (int d = 0; d < m.setup.P; ++d)
      channel_bytes[static_cast<std::size_t>(d)] = static_cast<std::uint64_t>(h.plan.tokens_to(d)) * row_bytes;
    if (expert_base != nullptr) m.call.meta_stage.resize(static_cast<std::size_t>(h.plan.num_entries()) * m.setup.geo.meta_bytes());
  }
  std::int64_t count_of(std::uint64_t v) const { return v >= stamp ? static_cast<std::int64_t>(v - stamp) : 0; }
};

// A destination I send to or a source I receive from: rows done of its total.
struct Flow {
  int peer;
  std::int64_t done, total;
};

// One worker's share of the ring dispatch: some destinations to fill, some sources to drain.
class RingWorker {
 public:
  RingWorker(const RingCall& c, int w)
      : c_(c), m_(c.m), timer_(c.m.timer(w, Phase::kPutIssue)), send_(c.m.sender(w, 0, c.channel_bytes, c.m.setup.visit_order)) {
    const HandleState& h = c.h;
    for (std::size_t i = static_cast<std::size_t>(w); i < m_.setup.visit_order.size(); i += static_cast<std::size_t>(m_.setup.W)) {
      const int d = m_.setup.visit_order[i];
      sends_.push_back({d, 0, h.plan.tokens_to(d)});
      const int s = (m_.setup.rank - static_cast<int>(i) + m_.setup.P) % m_.setup.P;  // sources in the mirrored order
      receives_.push_back({s, 0, h.recv_begin[static_cast<std::size_t>(s) + 1] - h.recv_begin[static_cast<std::size_t>(s)]});
    }
  }

  void run() {
    progress_until_done(m_.setup.transport.timeout(), m_.setup.rank, "dispatch ring", sends_.empty() ? -1 : sends_.front().peer,
                        [this] { return pass(); }, [this] { return waiting(); });
    send_.flush();
  }

 private:
  // One chunk of my segment for d: positions [p0, p1) into ring slots p % ring.
  void send_chunk(int d, std::int64_t p0, std::int64_t p1) {
    const RoutingPlan& plan = c_.h.plan;
    const auto* seg = plan.segment_token.data() + plan.segment_begin[static_cast<std::size_t>(d)];
    const std::int64_t base = m_.setup.geo.send_row(c_.h, d, 0, false);
    const auto* x = static_cast<const std::byte*>(c_.a.x.data);
    const auto* scales = static_cast<const std::byte*>(c_.a.x_scales.data);
    for (std::int64_t p = p0; p < p1;) {
      std::int64_t q = p + 1;  // a run: consecutive tokens that don't wrap the ring
      while (q < p1 && seg[q] == seg[q - 1] + 1 && q % c_.ring != 0) ++q;
      const auto t = static_cast<std::size_t>(seg[p]);
      send_.put_rows(d, Region::kData, m_.setup.geo.ring_row(m_.setup.rank, p), x + t * c_.row_bytes, q - p, c_.row_bytes);
      if (c_.fp8) send_.put_rows(d, Region::kScales, base + p, scales + t * c_.scale_bytes, q - p, c_.scale_bytes);
      p = q;
    }
    if (c_.expert_base != nullptr) send_meta(d, p0, p1);
    send_.signal(d, m_.setup.geo.ring_tail_signal(m_.setup.rank), c_.stamp + static_cast<std::uint64_t>(p1));
  }

  // The chunk's row metadata, staged at its place in my plan, to its full-size region at d.
  void send_meta(int d, std::int64_t p0, std::int64_t p1) {
    const RoutingPlan& plan = c_.h.plan;
    const auto* seg = plan.segment_token.data() + plan.segment_begin[static_cast<std::size_t>(d)];
    const std::int64_t stage_row = plan.segment_begin[static_cast<std::size_t>(d)] + p0;
    for (std::int64_t p = p0; p < p1; ++p)
      m_.fill_meta(m_.setup.geo.meta_row(m_.call.meta_stage.data(), stage_row + (p - p0)), c_.h, c_.a, d, seg[p], *c_.expert_base);
    send_.put_rows(d, Region::kMeta, m_.setup.geo.send_row(c_.h, d, 0, false) + p0,
                   m_.call.meta_stage.data() + static_cast<std::size_t>(stage_row) * m_.setup.geo.meta_bytes(), p1 - p0,
                   m_.setup.geo.meta_bytes());
  }

  // Rows [i0, i1) from s: out of the ring into the output, then their slots go back.
  void place(int s, std::int64_t i0, std::int64_t i1) {
    const std::int64_t first = c_.h.recv_begin[static_cast<std::size_t>(s)];
    m_.setup.payload.values([&] {
      for (std::int64_t i = i0; i < i1; ++i)
        place_row(m_.setup.transport.window() + m_.setup.geo.row(Region::kData, m_.setup.geo.ring_row(s, i), c_.row_bytes), first + i);
    });
    m_.setup.transport.signal(s, m_.setup.geo.ring_credit_signal(m_.setup.rank), c_.stamp + static_cast<std::uint64_t>(i1), 0);
  }

  // Received row r (compact order) to its output row, or to each of its expanded slots.
  void place_row(const std::byte* row, std::int64_t r) {
    auto* rx = static_cast<std::byte*>(c_.out_rx);
    if (!c_.expanded) return bulk_copy(rx + static_cast<std::size_t>(r) * c_.row_bytes, row, c_.row_bytes);
    std::byte* meta = m_.setup.transport.window() + m_.setup.geo.region(Region::kMeta);
    for (int k = 0; k < m_.setup.config.num_topk; ++k) {
      const std::int32_t to = c_.expert_base != nullptr ? m_.setup.geo.meta_row(meta, r).slot_row[k]
                                                        : c_.h.recv_slot_row[static_cast<std::size_t>(r * m_.setup.config.num_topk + k)];
      if (to >= 0) bulk_copy(rx + static_cast<std::size_t>(to) * c_.row_bytes, row, c_.row_bytes);
    }
  }

  // One round over my flows: a chunk to each destination its credit allows, every source's
  // arrived rows placed.
  Progress pass() {
    Progress p;
    for (Flow& f : sends_) {
      if (f.done == f.total) continue;
      p.pending = true;
      const std::int64_t credit = c_.count_of(m_.setup.transport.read_signal(m_.setup.geo.ring_credit_signal(f.peer)));
      const std::int64_t n = std::min({f.total - f.done, credit + c_.ring - f.done, c_.chunk});
      if (n <= 0) continue;
      send_chunk(f.peer, f.done, f.done + n);
      f.done += n;
      p.moved = true;
    }
    for (Flow& f : receives_) {
      if (f.done == f.total) continue;
      p.pending = true;
      const std::int64_t tail = c_.count_of(m_.setup.transport.read_signal(m_.setup.geo.ring_tail_signal(f.peer)));
      if (tail <= f.done) continue;
      place(f.peer, f.done, tail);
      f.done = tail;
      p.moved = true;
    }
    return p;
  }

  std::string waiting() const {
    std::string what;
    for (const Flow& f : sends_)
      if (f.done < f.total) what += " credit from rank " + std::to_string(f.peer);
    for (const Flow& f : receives_)
      if (f.done < f.total) what += " rows from rank " + std::to_string(f.peer);
    return what;
  }

  const RingCall& c_;
  PathContext& m_;
  Impl::PhaseTimer timer_;
  Impl::Sender send_;
  std::vector<Flow> sends_, receives_;
};

void exchange_through_ring(PathContext& m, const HandleState& h, const DispatchArgs& a,
                           const std::vector<std::int32_t>* expert_base, DispatchResult& out) {
  RingCall call(m, h, a, expert_base, out.recv_x.data());
  m.run_workers([&](int w) { RingWorker(call, w).run(); });
}

class Ring final : public DispatchPath {
 public:
  RowsAt rows_at() const noexcept override { return RowsAt::kPlaced; }
  void send(PathContext m, const DispatchStep& s) const override { exchange_through_ring(m, *s.h, *s.a, s.expert_base, *s.out); }
  void receive(PathContext, const DispatchStep&) const override {}  // send placed every arriving row
};

// The ring path's row: explicit or tail (credits are signals), no views (no slot for every
// row), both layouts, always a copy out of the ring; the base path where ring_rows > 0.
constexpr spi::PathRule kRingRow{spi::Path::kRing, "ring_rows (bounded receive area)", {true, true, false},
                                 "ring counts travel as signals (use explicit or tail)", false, true, false, false, "ring_rows", true,
                                 "ring", true, [](const BufferConfig& c) { return c.ring_rows > 0; }};

}  // namespace

const PathUnit& ring_path() {
  static const Ring unit;
  static const PathUnit path{kRingRow, &unit, &ring_combine()};
  return path;
}

}  // namespace epx::detail
