// The dispatch paths' building blocks (the paths themselves: path.hpp, paths/). A worker
// owns a contiguous range of this rank's tokens; its part of a destination's segment goes
// straight into the planned slots (put_segment): consecutive tokens become one put (up to
// the aggregation limit), with their metadata (fill_meta). The receiver reads the rows'
// metadata into the handle (receive_meta) and turns its receive area into the requested
// layout (make_outputs, epilogue).
#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine.hpp"
#include "epx/spi/copy.hpp"

namespace epx {

using detail::HandleState;
using detail::Region;
using detail::RowMetaView;
using detail::split_range;

void Buffer::Impl::stage_meta(const HandleState& h) {
  meta_stage.resize(static_cast<std::size_t>(h.plan.num_entries()) * geo.meta_bytes());
}

std::pair<std::int64_t, std::int64_t> Buffer::Impl::segment_part(const RoutingPlan& plan, int d, std::int64_t t0,
                                                                 std::int64_t t1) {
  const auto* seg = plan.segment_token.data() + plan.segment_begin[static_cast<std::size_t>(d)];
  const std::int64_t n = plan.tokens_to(d);
  return {std::lower_bound(seg, seg + n, t0) - seg, std::lower_bound(seg, seg + n, t1) - seg};
}

void Buffer::Impl::put_segment(Sender& send, const HandleState& h, const DispatchArgs& a,
                               const std::vector<std::int32_t>* expert_base, int d, std::int64_t p0, std::int64_t p1,
                               std::int64_t base, const detail::Landing& at) {
  put_segment_rows(send, h, a, d, p0, p1, base, at);
  put_segment_meta(send, h, a, expert_base, d, p0, p1, base);
}

void Buffer::Impl::put_segment_rows(Sender& send, const HandleState& h, const DispatchArgs& a, int d, std::int64_t p0,
                                    std::int64_t p1, std::int64_t base, const detail::Landing& at) {
  const RoutingPlan& plan = h.plan;
  const bool fp8 = a.x.dtype == DType::kFP8E4M3;
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * dtype_size(a.x.dtype);
  const std::size_t scale_bytes = fp8 ? static_cast<std::size_t>(config.hidden / 128) * sizeof(float) : 0;
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* scales = static_cast<const std::byte*>(a.x_scales.data);
  const auto* seg = plan.segment_token.data() + plan.segment_begin[static_cast<std::size_t>(d)];
  // Rows: runs of consecutive tokens (their slots are consecutive too).
  for (std::int64_t p = p0; p < p1;) {
    std::int64_t q = p + 1;
    while (q < p1 && seg[q] == seg[q - 1] + 1) ++q;
    const auto t = static_cast<std::size_t>(seg[p]);
    send.put_landed(d, at, Region::kData, base + p, x + t * row_bytes, q - p, row_bytes);
    if (fp8) send.put_landed(d, at, Region::kScales, base + p, scales + t * scale_bytes, q - p, scale_bytes);
    p = q;
  }
}

void Buffer::Impl::put_segment_meta(Sender& send, const HandleState& h, const DispatchArgs& a,
                                    const std::vector<std::int32_t>* expert_base, int d, std::int64_t p0,
                                    std::int64_t p1, std::int64_t base) {
  if (expert_base == nullptr || p1 <= p0) return;
  const RoutingPlan& plan = h.plan;
  const auto* seg = plan.segment_token.data() + plan.segment_begin[static_cast<std::size_t>(d)];
  // Metadata for the same rows: built in plan order, sent as consecutive rows.
  const std::size_t stage_row = static_cast<std::size_t>(plan.segment_begin[static_cast<std::size_t>(d)] + p0);
  for (std::int64_t p = p0; p < p1; ++p)
    fill_meta(geo.meta_row(meta_stage.data(), static_cast<std::int64_t>(stage_row) + (p - p0)), h, a, d, seg[p], *expert_base);
  send.put_rows(d, Region::kMeta, base + p0, meta_stage.data() + stage_row * geo.meta_bytes(), p1 - p0, geo.meta_bytes());
}

void Buffer::Impl::receive_meta(HandleState& h, const Peers* rows_first) {
  const std::int64_t N = h.num_recv();
  const int K = config.num_topk;
  // Rows first: row r of source s sits at s·C + (r - recv_begin[s]); an expanded slot's
  // row = its expert's first row for s (o_j + slots of lower sources) + the slot's rank.
  std::vector<std::int64_t> slot_base(rows_first ? static_cast<std::size_t>(P) * static_cast<std::size_t>(L) : 0);
  if (rows_first) {
    for (int j = 0; j < L; ++j) {
      std::int64_t row = h.expert_offset[static_cast<std::size_t>(j)];
      for (int s = 0; s < P; ++s) {
        slot_base[static_cast<std::size_t>(s) * static_cast<std::size_t>(L) + static_cast<std::size_t>(j)] = row;
        row += rows_first->counts(s)[P + rank * L + j];
      }
    }
  }
  h.recv_token.resize(static_cast<std::size_t>(N));
  h.recv_relay_row.resize(static_cast<std::size_t>(N));
  h.recv_slot_row.resize(static_cast<std::size_t>(N * K));
  h.recv_slot_weight.resize(static_cast<std::size_t>(N * K));
  std::byte* meta = transport.window() + geo.region(Region::kMeta);
  int s = 0;  // the source of row r
  for (std::int64_t r = 0; r < N; ++r) {
    while (r >= h.recv_begin[static_cast<std::size_t>(s) + 1]) ++s;
    const RowMetaView m = geo.meta_row(meta, geo.recv_row(h, s, r, rows_first != nullptr));
    h.recv_token[static_cast<std::size_t>(r)] = *m.token;
    h.recv_relay_row[static_cast<std::size_t>(r)] = *m.relay_row;
    for (int k = 0; k < K; ++k) {
      const std::int64_t e = m.topk_idx[k];
      const bool here = e >= 0 && e / L == rank;
      const auto i = static_cast<std::size_t>(r * K + k);
      // Compact rows keep the local expert in slot_row's place; expanded rows the output row.
      std::int32_t slot = -1;
      if (here && h.layout != RecvLayout::kExpanded) slot = static_cast<std::int32_t>(e - rank * L);
      else if (here && !rows_first) slot = m.slot_row[k];
      else if (here)
        slot = static_cast<std::int32_t>(slot_base[static_cast<std::size_t>(s) * static_cast<std::size_t>(L) +
                                                   static_cast<std::size_t>(e - rank * L)] + m.slot_row[k]);
      h.recv_slot_row[i] = slot;
      h.recv_slot_weight[i] = here ? m.weights[k] : 0.0f;
    }
  }
}

void Buffer::Impl::fill_meta(RowMetaView m, const HandleState& h, const DispatchArgs& a, int d, std::int32_t t,
                             const std::vector<std::int32_t>& expert_base) const {
  const int K = config.num_topk;
  *m.token = t;
  *m.relay_row = -1;
  const std::int64_t* idx = a.topk_idx.as<std::int64_t>() + static_cast<std::int64_t>(t) * K;
  const float* wts = a.topk_weights.as<float>() + static_cast<std::int64_t>(t) * K;
  for (int k = 0; k < K; ++k) {
    m.topk_idx[k] = idx[k];
    m.weights[k] = wts[k];
    const bool here = idx[k] >= 0 && idx[k] / L == d;
    const std::int32_t eb = here ? expert_base[static_cast<std::size_t>(idx[k])] : -1;
    m.slot_row[k] = eb >= 0 ? eb + h.plan.slot_rank_in_expert[static_cast<std::size_t>(t) * static_cast<std::size_t>(K) +
                                                               static_cast<std::size_t>(k)]
                            : -1;
  }
}

namespace {
std::int64_t align_rows(std::int64_t n, std::int64_t a) { return (n + a - 1) / a * a; }
}  // namespace

DispatchResult Buffer::Impl::make_outputs(const HandleState& h, const DispatchArgs& a, bool fp8, const detail::Landing* block,
                                          detail::BlockPool::Reservation* reserved) {
  const std::int64_t rows = h.out_rows, H = config.hidden;
  const int K = config.num_topk;
  const DType dt = a.x.dtype;
  const bool expanded = h.layout == RecvLayout::kExpanded;
  DispatchResult out;
  // A modelling transport moves no payload: rows are views of the window whose values are
  // unspecified, and the epilogue reads or writes no payload bytes.
  if (block != nullptr) {  // one copy: the senders put the rows into this block, which the tensors keep
    const std::size_t row_bytes = static_cast<std::size_t>(H) * dtype_size(dt);
    const std::size_t scale_bytes = fp8 ? static_cast<std::size_t>(H / 128) * sizeof(float) : 0;
    std::shared_ptr<std::byte> kept = reserved->keep(detail::Geometry::output_block_bytes(rows, row_bytes, scale_bytes));
    std::byte* window_base = transport.window();
    out.recv_x = Tensor::adopt(kept, dt, {rows, H});
    if (fp8) out.recv_x_scales = Tensor::adopt(std::shared_ptr<std::byte>(kept, window_base + block->scales), DType::kF32, {rows, H / 128});
  } else if (a.recv_in_window || !moves_payload) {  // views: the rows already sit where the compact output wants them
    std::byte* base = transport.window();
    out.recv_x = Tensor::adopt(std::shared_ptr<std::byte>(std::shared_ptr<void>(), base + geo.region(Region::kData)), dt, {rows, H});
    if (fp8)
      out.recv_x_scales =
          Tensor::adopt(std::shared_ptr<std::byte>(std::shared_ptr<void>(), base + geo.region(Region::kScales)), DType::kF32, {rows, H / 128});
  } else {
    out.recv_x = outputs.make(dt, {rows, H});
    if (fp8) out.recv_x_scales = outputs.make(DType::kF32, {rows, H / 128});
  }
  out.recv_src = outputs.make(DType::kI64, {rows, expanded ? 3 : 2});
  if (expanded) {
    out.recv_weights = outputs.make(DType::kF32, {rows});
  } else {
    out.recv_topk_idx = outputs.make(DType::kI64, {rows, K});
    out.recv_topk_weights = outputs.make(DType::kF32, {rows, K});
  }
  out.num_recv_tokens_per_expert = h.expert_count;
  out.num_recv_tokens_per_expert_aligned.resize(static_cast<std::size_t>(L));
  for (int j = 0; j < L; ++j)
    out.num_recv_tokens_per_expert_aligned[static_cast<std::size_t>(j)] =
        align_rows(h.expert_count[static_cast<std::size_t>(j)], h.alignment);
  if (expanded) out.expert_offsets = h.expert_offset;
  return out;
}

void Buffer::Impl::epilogue(const HandleState& h, const DispatchArgs& a, bool fp8, DispatchResult& out, detail::RowsAt at,
                            bool in_block) {
  const bool rows_placed = at == detail::RowsAt::kPlaced, rows_first = at == detail::RowsAt::kStretches;
  transport.enter_phase("epilogue");  // no wait of its own: a rank that dies here is reported in it
  const std::int64_t N = h.num_recv(), rows = h.out_rows, H = config.hidden;
  const int K = config.num_topk;
  const DType dt = a.x.dtype;
  const std::size_t row_bytes = static_cast<std::size_t>(H) * dtype_size(dt);
  const std::int64_t B = fp8 ? H / 128 : 0;
  const std::size_t scale_bytes = static_cast<std::size_t>(B) * sizeof(float);
  const std::byte* data = transport.window() + geo.region(Region::kData);
  const std::byte* scales = transport.window() + geo.region(Region::kScales);
  const bool expanded = h.layout == RecvLayout::kExpanded;
  const bool payload = moves_payload;
  const bool in_window = a.recv_in_window || !payload;
  const bool in_place = in_window || in_block;  // recv_x is where the rows landed: nothing to copy
  const bool place_rows = payload && !rows_placed && !in_block;  // the bounded ring places rows as they arrive
  // Row bytes copied out of the receive area per output row (the ring's copies as they arrive count too).
  const std::size_t copied_row = payload && !in_block ? row_bytes : 0;
  auto* rx = static_cast<std::byte*>(out.recv_x.data());
  auto* rs = static_cast<std::byte*>(fp8 ? out.recv_x_scales.data() : nullptr);
  auto* src = out.recv_src.as<std::int64_t>();

  // Padding rows (expanded: the tail of each expert's aligned range; both: rows past the
  // real ones up to num_worst_tokens) have source -1, weight 0, and zero data when asked
  // (zero_padding — a cached dispatch's too when its handle's dispatch asked; SPEC §3.2:
  // unspecified otherwise).
  const bool zero_rows = payload && (a.zero_padding || h.zero_padding);
  auto pad = [&](std::int64_t r0, std::int64_t r1) {
    if (r1 <= r0) return;
    if (zero_rows) std::memset(rx + static_cast<std::size_t>(r0) * row_bytes, 0, static_cast<std::size_t>(r1 - r0) * row_bytes);
    if (fp8 && zero_rows) std::memset(rs + static_cast<std::size_t>(r0) * scale_bytes, 0, static_cast<std::size_t>(r1 - r0) * scale_bytes);
    const int cols = expanded ? 3 : 2;
    std::fill(src + r0 * cols, src + r1 * cols, -1);
    if (expanded) {
      std::fill(out.recv_weights.as<float>() + r0, out.recv_weights.as<float>() + r1, 0.0f);
    } else {
      std::fill(out.recv_topk_idx.as<std::int64_t>() + r0 * K, out.recv_topk_idx.as<std::int64_t>() + r1 * K, -1);
      std::fill(out.recv_topk_weights.as<float>() + r0 * K, out.recv_topk_weights.as<float>() + r1 * K, 0.0f);
    }
  };

  std::vector<std::int32_t> source_of(static_cast<std::size_t>(N));
  for (int s = 0; s < P; ++s)
    std::fill(source_of.begin() + h.recv_begin[static_cast<std::size_t>(s)],
              source_of.begin() + h.recv_begin[static_cast<std::size_t>(s) + 1], s);
  // Where received row r sits in the window (rows first: in its source's stretch of C rows).
  auto window_row = [&](std::int64_t r) { return geo.recv_row(h, source_of[static_cast<std::size_t>(r)], r, rows_first); };
  // Rows [r0, r1) of a region (rows of `bytes`) to `to`: one copy per source's stretch.
  auto copy_rows = [&](std::byte* to, const std::byte* from, std::int64_t r0, std::int64_t r1, std::size_t bytes) {
    for (std::int64_t r = r0; r < r1;) {
      const std::int64_t end = rows_first ? std::min(r1, h.recv_begin[static_cast<std::size_t>(source_of[static_cast<std::size_t>(r)]) + 1]) : r1;
      bulk_copy(to + static_cast<std::size_t>(r) * bytes, from + static_cast<std::size_t>(window_row(r)) * bytes,
                static_cast<std::size_t>(end - r) * bytes);
      r = end;
    }
  };
  if (rows_first && in_window && payload) {
    // The output is a view of the window: close the gaps between the sources' stretches
    // (ascending: a stretch only moves down, onto rows already moved or its own).
    for (int s = 1; s < P; ++s) {
      const std::int64_t b = h.recv_begin[static_cast<std::size_t>(s)], n = h.recv_begin[static_cast<std::size_t>(s) + 1] - b;
      const auto at = static_cast<std::size_t>(geo.recv_row(h, s, b, true));
      std::memmove(rx + static_cast<std::size_t>(b) * row_bytes, data + at * row_bytes,
                   static_cast<std::size_t>(n) * row_bytes);
      if (fp8)
        std::memmove(rs + static_cast<std::size_t>(b) * scale_bytes, scales + at * scale_bytes,
                     static_cast<std::size_t>(n) * scale_bytes);
    }
  }

  std::atomic<std::uint64_t> copied{0};  // payload bytes copied out of the receive area (CallStats)
  run_workers([&](int w) {
    PhaseTimer timer(*this, w, Phase::kEpilogue);
    const auto [r0, r1] = split_range(N, w, W);
    std::uint64_t slot_bytes = 0;
    if (!expanded) {
      if (!in_place && place_rows) copy_rows(rx, data, r0, r1, row_bytes);
      if (fp8 && !in_place) copy_rows(rs, scales, r0, r1, scale_bytes);
      if (!in_place) copied.fetch_add(static_cast<std::uint64_t>(r1 - r0) * (copied_row + scale_bytes),
                                      std::memory_order_relaxed);
      for (std::int64_t r = r0; r < r1; ++r) {
        src[r * 2] = source_of[static_cast<std::size_t>(r)];
        src[r * 2 + 1] = h.recv_token[static_cast<std::size_t>(r)];
        for (int k = 0; k < K; ++k) {
          const auto i = static_cast<std::size_t>(r * K + k);
          out.recv_topk_idx.as<std::int64_t>()[i] = h.recv_slot_row[i];
          out.recv_topk_weights.as<float>()[i] = h.recv_slot_weight[i];
        }
      }
    } else {
      for (std::int64_t r = r0; r < r1; ++r) {
        for (int k = 0; k < K; ++k) {
          const auto i = static_cast<std::size_t>(r * K + k);
          const std::int64_t row = h.recv_slot_row[i];
          if (row < 0) continue;
          if (place_rows) bulk_copy(rx + static_cast<std::size_t>(row) * row_bytes, data + static_cast<std::size_t>(window_row(r)) * row_bytes, row_bytes);
          if (fp8 && payload)
            std::memcpy(rs + static_cast<std::size_t>(row) * scale_bytes, scales + static_cast<std::size_t>(window_row(r)) * scale_bytes,
                        scale_bytes);
          slot_bytes += copied_row + (fp8 && payload ? scale_bytes : 0);
          out.recv_weights.as<float>()[row] = h.recv_slot_weight[i];
          src[row * 3] = source_of[static_cast<std::size_t>(r)];
          src[row * 3 + 1] = h.recv_token[static_cast<std::size_t>(r)];
          src[row * 3 + 2] = k;
        }
      }
      copied.fetch_add(slot_bytes, std::memory_order_relaxed);
    }
    if (w == 0) {
      if (expanded)
        for (int j = 0; j < L; ++j)
          pad(h.expert_offset[static_cast<std::size_t>(j)] + h.expert_count[static_cast<std::size_t>(j)],
              h.expert_offset[static_cast<std::size_t>(j) + 1]);
      pad(expanded ? h.expert_offset.back() : N, rows);
    }
  });

  stats.epilogue_copy_bytes = copied.load();
}

}  // namespace epx
