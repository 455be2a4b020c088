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

void exchange_through_ring(Impl& m, const HandleState& h, const DispatchArgs& a,
                                         const std::vector<std::int32_t>* expert_base, DispatchResult& out) {
  const RoutingPlan& plan = h.plan;
  const int K = m.config.num_topk;
  const std::int64_t ring = m.config.ring_rows;
  const std::int64_t chunk = std::max<std::int64_t>(1, ring / 2);  // half a ring: the other half drains meanwhile
  const bool fp8 = a.x.dtype == DType::kFP8E4M3;
  const std::size_t row_bytes = static_cast<std::size_t>(m.config.hidden) * dtype_size(a.x.dtype);
  const std::size_t scale_bytes = fp8 ? static_cast<std::size_t>(m.config.hidden / 128) * sizeof(float) : 0;
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* scales = static_cast<const std::byte*>(a.x_scales.data);
  const bool with_meta = expert_base != nullptr;
  const bool expanded = h.layout == RecvLayout::kExpanded;
  const bool payload = m.moves_payload;
  const std::uint64_t stamp = m.epoch << 32;
  auto count_of = [&](std::uint64_t v) -> std::int64_t { return v >= stamp ? static_cast<std::int64_t>(v - stamp) : 0; };
  if (with_meta) m.meta_stage.resize(static_cast<std::size_t>(plan.num_entries()) * m.geo.meta_bytes());
  const std::byte* window_base = m.transport.window();
  std::byte* meta = m.transport.window() + m.geo.region(Region::kMeta);
  auto* rx = static_cast<std::byte*>(out.recv_x.data());

  std::vector<std::uint64_t> channel_bytes(static_cast<std::size_t>(m.P));
  for (int d = 0; d < m.P; ++d) channel_bytes[static_cast<std::size_t>(d)] = static_cast<std::uint64_t>(plan.tokens_to(d)) * row_bytes;

  m.run_workers([&](int w) {
    Impl::PhaseTimer timer(m, w, Phase::kPutIssue);
    Impl::Sender send(m, w, 0, channel_bytes, m.visit_order);
    struct Flow {
      int peer;
      std::int64_t done, total;
    };
    std::vector<Flow> sends, receives;
    for (std::size_t i = static_cast<std::size_t>(w); i < m.visit_order.size(); i += static_cast<std::size_t>(m.W)) {
      const int d = m.visit_order[i];
      sends.push_back({d, 0, plan.tokens_to(d)});
      const int s = (m.rank - static_cast<int>(i) + m.P) % m.P;  // sources in the mirrored order
      receives.push_back({s, 0, h.recv_begin[static_cast<std::size_t>(s) + 1] - h.recv_begin[static_cast<std::size_t>(s)]});
    }

    // One chunk of my segment for d: positions [p0, p1) into ring slots p % ring.
    auto send_chunk = [&](int d, std::int64_t p0, std::int64_t p1) {
      const auto* seg = plan.segment_token.data() + plan.segment_begin[static_cast<std::size_t>(d)];
      const std::int64_t base = m.geo.send_row(h, d, 0, false);
      for (std::int64_t p = p0; p < p1;) {
        std::int64_t q = p + 1;  // a run: consecutive tokens that don't wrap the ring
        while (q < p1 && seg[q] == seg[q - 1] + 1 && q % ring != 0) ++q;
        const auto t = static_cast<std::size_t>(seg[p]);
        send.put_rows(d, Region::kData, m.geo.ring_row(m.rank, p), x + t * row_bytes, q - p, row_bytes);
        if (fp8) send.put_rows(d, Region::kScales, base + p, scales + t * scale_bytes, q - p, scale_bytes);
        p = q;
      }
      if (with_meta) {
        const std::size_t stage_row = static_cast<std::size_t>(plan.segment_begin[static_cast<std::size_t>(d)] + p0);
        for (std::int64_t p = p0; p < p1; ++p)
          m.fill_meta(m.geo.meta_row(m.meta_stage.data(), static_cast<std::int64_t>(stage_row) + (p - p0)), h, a, d, seg[p], *expert_base);
        send.put_rows(d, Region::kMeta, base + p0, m.meta_stage.data() + stage_row * m.geo.meta_bytes(), p1 - p0, m.geo.meta_bytes());
      }
      send.signal(d, m.geo.ring_tail_signal(m.rank), stamp + static_cast<std::uint64_t>(p1));
    };
    // Rows [i0, i1) from s: out of the ring into the output, then their slots go back.
    auto place = [&](int s, std::int64_t i0, std::int64_t i1) {
      const std::int64_t first = h.recv_begin[static_cast<std::size_t>(s)];
      for (std::int64_t i = i0; i < i1 && payload; ++i) {
        const std::byte* row = window_base + m.geo.row(Region::kData, m.geo.ring_row(s, i), row_bytes);
        const std::int64_t r = first + i;
        if (!expanded) {
          bulk_copy(rx + static_cast<std::size_t>(r) * row_bytes, row, row_bytes);
          continue;
        }
        for (int k = 0; k < K; ++k) {
          const std::int32_t to = with_meta ? m.geo.meta_row(meta, r).slot_row[k]
                                            : h.recv_slot_row[static_cast<std::size_t>(r * K + k)];
          if (to >= 0) bulk_copy(rx + static_cast<std::size_t>(to) * row_bytes, row, row_bytes);
        }
      }
      m.transport.signal(s, m.geo.ring_credit_signal(m.rank), stamp + static_cast<std::uint64_t>(i1), 0);
    };

    auto pass = [&] {
      Progress p;
      for (Flow& f : sends) {
        if (f.done == f.total) continue;
        p.pending = true;
        const std::int64_t credit = count_of(m.transport.read_signal(m.geo.ring_credit_signal(f.peer)));
        const std::int64_t n = std::min({f.total - f.done, credit + ring - f.done, chunk});
        if (n <= 0) continue;
        send_chunk(f.peer, f.done, f.done + n);
        f.done += n;
        p.moved = true;
      }
      for (Flow& f : receives) {
        if (f.done == f.total) continue;
        p.pending = true;
        const std::int64_t tail = count_of(m.transport.read_signal(m.geo.ring_tail_signal(f.peer)));
        if (tail <= f.done) continue;
        place(f.peer, f.done, tail);
        f.done = tail;
        p.moved = true;
      }
      return p;
    };
    auto waiting = [&] {
      std::string what;
      for (const Flow& f : sends)
        if (f.done < f.total) what += " credit from rank " + std::to_string(f.peer);
      for (const Flow& f : receives)
        if (f.done < f.total) what += " rows from rank " + std::to_string(f.peer);
      return what;
    };
    progress_until_done(m.transport.timeout(), m.rank, "dispatch ring", sends.empty() ? -1 : sends.front().peer, pass, waiting);
    send.flush();
  });
}

class Ring final : public DispatchPath {
 public:
  RowsAt rows_at() const noexcept override { return RowsAt::kPlaced; }
  void send(Impl& m, const DispatchStep& s) const override { exchange_through_ring(m, *s.h, *s.a, s.expert_base, *s.out); }
  void receive(Impl&, const DispatchStep&) const override {}  // send placed every arriving row
};

}  // namespace

const DispatchPath& ring_dispatch() {
  static const Ring unit;
  return unit;
}

}  // namespace epx::detail
