// Dispatch, direct path (spi::Path::kDirect) and its rows-first variant (kRowsFirst).
//
// Direct: after the header exchange every worker takes a contiguous range of my tokens and,
// a block of rows at a time (the send policy), for every destination in the schedule's order, puts
// the block's part of the destination's segment at its planned slots — in the destination's receive area or, one
// copy, its output block (the landing; an expanded block takes each row at each of its
// slots' rows) — then per destination the FP8 scale rows of its whole part (gathered: one
// put, not one per run of rows) and, on a fresh dispatch, the rows' metadata. The
// Sender completes the puts by the configured protocol; the receiver waits for them by the
// same protocol (await_rows: signals, or unpacking flagged blocks).
//
// Rows first: a dispatch right after a combine that freed every receive area (CallState)
// puts the same rows before the exchange, at rank·C + their position in my segment (the
// per-source stretches of DeepEP's low-latency layout, known without the counts), only
// quieted; the header exchange after them completes them. The receiver reads each source's
// stretch (RowsAt::kStretches) and places expanded rows itself: the senders send each
// slot's rank among their tokens for the expert (expert bases of 0).
#include <algorithm>

#include "../path.hpp"
#include "../send_policy.hpp"

namespace epx::detail {
namespace {

// Every worker's part of every destination's segment, in the schedule's order.
// `rows_first`: at the stretches of the receive area, signalling nobody.
void send_segments(PathContext& m, const DispatchStep& s, const std::vector<std::int32_t>* expert_base, bool rows_first,
                   const std::vector<Landing>& landing) {
  const HandleState& h = *s.h;
  const RoutingPlan& plan = h.plan;
  const std::size_t per_row = s.row_bytes + s.scale_bytes + (expert_base ? m.setup.geo.meta_bytes() : 0);
  if (expert_base) m.stage_meta(h);
  m.stage_scales(h, *s.a);
  m.run_workers([&](int w) {
    Impl::PhaseTimer timer = m.timer(w, Phase::kPutIssue);
    const auto [t0, t1] = split_range(plan.shape.num_tokens, w, m.setup.W);
    std::vector<std::pair<std::int64_t, std::int64_t>> part(static_cast<std::size_t>(m.setup.P));
    std::vector<std::uint64_t> channel_bytes(static_cast<std::size_t>(m.setup.P));
    std::int64_t rows = 0;
    for (int d = 0; d < m.setup.P; ++d) {
      const auto ud = static_cast<std::size_t>(d);
      part[ud] = Impl::segment_part(plan, d, t0, t1);
      channel_bytes[ud] = static_cast<std::uint64_t>(part[ud].second - part[ud].first) * per_row;
      rows += part[ud].second - part[ud].first;
    }
    Impl::Sender send = m.sender(w, rows_first ? Impl::Sender::kNoSignal : m.setup.geo.dispatch_signal(m.setup.rank, w), channel_bytes,
                      m.setup.visit_order);
    // My tokens in blocks (the send policy, send_policy.hpp), each block to every
    // destination: a block's x rows are read from memory once for their ~K copies. Each
    // destination still gets its rows in ascending slot order; a run ends at a block edge.
    const std::int64_t block =
        send_block_tokens(m.setup.config.dataplane.send_policy,
                          {m.setup.P, s.row_bytes + s.scale_bytes, t1 - t0, rows, m.setup.config.dataplane.aggregate_bytes}, m.setup.transport.caps());
    std::vector<std::int64_t> at(static_cast<std::size_t>(m.setup.P));
    for (int d = 0; d < m.setup.P; ++d) at[static_cast<std::size_t>(d)] = part[static_cast<std::size_t>(d)].first;
    for (std::int64_t b0 = t0; b0 < t1; b0 += block) {
      const std::int64_t b1 = std::min(t1, b0 + block);
      for (int d : m.setup.visit_order) {
        const auto ud = static_cast<std::size_t>(d);
        const auto* seg = plan.segment_token.data() + plan.segment_begin[ud];
        std::int64_t p = at[ud];
        while (p < part[ud].second && seg[p] < b1) ++p;
        m.put_segment_rows(send, h, *s.a, d, at[ud], p, m.setup.geo.send_row(h, d, 0, rows_first), landing[ud], false);
        at[ud] = p;
      }
    }
    for (int d : m.setup.visit_order) {
      const auto ud = static_cast<std::size_t>(d);
      const std::int64_t base = m.setup.geo.send_row(h, d, 0, rows_first);
      m.put_segment_scales(send, h, *s.a, d, part[ud].first, part[ud].second, base, landing[ud]);
      m.put_segment_meta(send, h, *s.a, expert_base, d, part[ud].first, part[ud].second, base);
      send.end_channel(d);
    }
    send.finish();
  });
}

class Direct final : public DispatchPath {
 public:
  void send(PathContext m, const DispatchStep& s) const override { send_segments(m, s, s.expert_base, false, *s.landing); }

  void receive(PathContext m, const DispatchStep& s) const override {
    m.await_rows(&Geometry::dispatch_signal, "dispatch data", s.h->recv_begin,
                 {{Region::kMeta, s.fresh ? m.setup.geo.meta_bytes() : 0}, {Region::kData, s.row_bytes}, {Region::kScales, s.scale_bytes}},
                 s.landed);
  }
};

class RowsFirst final : public DispatchPath {
 public:
  bool rows_before_exchange() const noexcept override { return true; }
  RowsAt rows_at() const noexcept override { return RowsAt::kStretches; }

  void send(PathContext m, const DispatchStep& s) const override {
    // Expert bases of 0: the metadata carries each slot's rank among my tokens for its expert.
    const std::vector<std::int32_t> local(static_cast<std::size_t>(s.fresh ? m.setup.config.num_experts : 0), 0);
    send_segments(m, s, s.fresh ? &local : nullptr, true,
                  std::vector<Landing>(static_cast<std::size_t>(m.setup.P), m.setup.geo.receive_area()));
  }

  void receive(PathContext, const DispatchStep&) const override {}  // the header exchange completed the rows
};

// The direct path's row: every protocol, views, both layouts, one copy; the base path of a
// flat schedule without a ring.
constexpr spi::PathRule kDirectRow{spi::Path::kDirect, "direct", {true, true, true}, "", true, true, false, false, nullptr, true,
                                   "direct", true, [](const BufferConfig& c) {
                                     return c.ring_rows <= 0 && c.dataplane.schedule.kind != ScheduleKind::kHierarchical;
                                   }};
constexpr spi::PathRule kRowsFirstRow{spi::Path::kRowsFirst, "rows first", {true, true, false},
                                      "flagged rows complete themselves, not by the exchange", true, true, true, false,
                                      "rows first", false, "rows_first", true};

}  // namespace

const PathUnit& direct_path() {
  static const Direct unit;
  static const PathUnit path{kDirectRow, &unit, &push_combine()};
  return path;
}
const PathUnit& rows_first_path() {
  static const RowsFirst unit;
  static const PathUnit path{kRowsFirstRow, &unit, &replies_first_combine()};
  return path;
}

}  // namespace epx::detail
