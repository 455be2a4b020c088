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
  put_segment_rows(send, h, a, d, p0, p1, base, at, true);
  put_segment_meta(send, h, a, expert_base, d, p0, p1, base);
}

void Buffer::Impl::put_segment_rows(Sender& send, const HandleState& h, const DispatchArgs& a, int d, std::int64_t p0,
                                    std::int64_t p1, std::int64_t base, const detail::Landing& at, bool run_scales) {
  const RoutingPlan& plan = h.plan;
  const bool fp8 = a.x.dtype == DType::kFP8E4M3;
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * dtype_size(a.x.dtype);
  const std::size_t scale_bytes = fp8 ? static_cast<std::size_t>(config.hidden / 128) * sizeof(float) : 0;
  const auto* x = static_cast<const std::byte*>(a.x.data);
  const auto* scales = static_cast<const std::byte*>(a.x_scales.data);
  const std::int32_t first = plan.segment_begin[static_cast<std::size_t>(d)];
  const auto* seg = plan.segment_token.data() + first;
  if (at.expanded) {  // one copy into an expanded output: the row (and its scales) once per slot, at the slot's row
    for (std::int64_t p = p0; p < p1; ++p) {
      const auto t = static_cast<std::size_t>(seg[p]);
      const auto i = static_cast<std::size_t>(first + p);
      for (std::int32_t j = h.slot_begin[i]; j < h.slot_begin[i + 1]; ++j) {
        const std::int32_t row = h.slot_row[static_cast<std::size_t>(j)];
        send.put_landed(d, at, Region::kData, row, x + t * row_bytes, 1, row_bytes);
        if (fp8) send.put_landed(d, at, Region::kScales, row, scales + t * scale_bytes, 1, scale_bytes);
      }
    }
    return;
  }
  // Rows: runs of consecutive tokens (their slots are consecutive too).
  for (std::int64_t p = p0; p < p1;) {
    std::int64_t q = p + 1;
    while (q < p1 && seg[q] == seg[q - 1] + 1) ++q;
    const auto t = static_cast<std::size_t>(seg[p]);
    send.put_landed(d, at, Region::kData, base + p, x + t * row_bytes, q - p, row_bytes);
    if (fp8 && run_scales) send.put_landed(d, at, Region::kScales, base + p, scales + t * scale_bytes, q - p, scale_bytes);
    p = q;
  }
}

void Buffer::Impl::stage_scales(const HandleState& h, const DispatchArgs& a) {
  const bool fp8 = a.x.dtype == DType::kFP8E4M3;
  scale_stage.resize(fp8 ? static_cast<std::size_t>(h.plan.num_entries()) * static_cast<std::size_t>(config.hidden / 128) * sizeof(float) : 0);
}

void Buffer::Impl::put_segment_scales(Sender& send, const HandleState& h, const DispatchArgs& a, int d, std::int64_t p0,
                                      std::int64_t p1, std::int64_t base, const detail::Landing& at) {
  if (a.x.dtype != DType::kFP8E4M3 || at.expanded || p1 <= p0) return;  // bf16; expanded: with each slot's row
  const RoutingPlan& plan = h.plan;
  const std::size_t scale_bytes = static_cast<std::size_t>(config.hidden / 128) * sizeof(float);
  const auto* scales = static_cast<const std::byte*>(a.x_scales.data);
  const auto first = static_cast<std::size_t>(plan.segment_begin[static_cast<std::size_t>(d)]);
  const auto* seg = plan.segment_token.data() + first;
  // This worker's scale rows for d gathered in slot order (plan order in scale_stage, as the
  // metadata), then sent as consecutive rows: not one small put per run of rows.
  std::byte* stage = scale_stage.data() + (first + static_cast<std::size_t>(p0)) * scale_bytes;
  payload.values([&] {
    for (std::int64_t p = p0; p < p1; ++p)
      std::memcpy(stage + static_cast<std::size_t>(p - p0) * scale_bytes, scales + static_cast<std::size_t>(seg[p]) * scale_bytes, scale_bytes);
  });
  send.put_landed(d, at, Region::kScales, base + p0, stage, p1 - p0, scale_bytes);
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

void Buffer::Impl::size_received(HandleState& h) const {
  const std::int64_t N = h.num_recv();
  const int K = config.num_topk;
  h.recv_token.resize(static_cast<std::size_t>(N));
  h.recv_relay_row.resize(static_cast<std::size_t>(N));
  h.recv_slot_row.resize(static_cast<std::size_t>(N * K));
  h.recv_slot_weight.resize(static_cast<std::size_t>(N * K));
}

void Buffer::Impl::receive_meta(HandleState& h, int s, const Peers* rows_first) const {
  const int K = config.num_topk;
  const std::int64_t first_expert = static_cast<std::int64_t>(rank) * L;
  // Rows first: row r of source s sits at s·C + (r - recv_begin[s]); an expanded slot's
  // row = its expert's first row for s (o_j + slots of lower sources) + the slot's rank.
  std::vector<std::int64_t> slot_base(rows_first ? static_cast<std::size_t>(L) : 0);
  for (int j = 0; rows_first && j < L; ++j) {
    std::int64_t row = h.expert_offset[static_cast<std::size_t>(j)];
    for (int lower = 0; lower < s; ++lower) row += rows_first->counts(lower)[P + rank * L + j];
    slot_base[static_cast<std::size_t>(j)] = row;
  }
  std::byte* meta = transport.window() + geo.region(Region::kMeta);
  for (std::int64_t r = h.recv_begin[static_cast<std::size_t>(s)]; r < h.recv_begin[static_cast<std::size_t>(s) + 1]; ++r) {
    const RowMetaView m = geo.meta_row(meta, geo.recv_row(h, s, r, rows_first != nullptr));
    h.recv_token[static_cast<std::size_t>(r)] = *m.token;
    h.recv_relay_row[static_cast<std::size_t>(r)] = *m.relay_row;
    for (int k = 0; k < K; ++k) {
      const std::int64_t e = m.topk_idx[k];
      const bool here = e >= first_expert && e < first_expert + L;  // (no division per slot)
      const auto i = static_cast<std::size_t>(r * K + k);
      // Compact rows keep the local expert in slot_row's place; expanded rows the output row.
      std::int32_t slot = -1;
      if (here && h.layout != RecvLayout::kExpanded) slot = static_cast<std::int32_t>(e - first_expert);
      else if (here && !rows_first) slot = m.slot_row[k];
      else if (here) slot = static_cast<std::int32_t>(slot_base[static_cast<std::size_t>(e - first_expert)] + m.slot_row[k]);
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
    const bool here = idx[k] >= static_cast<std::int64_t>(d) * L && idx[k] < static_cast<std::int64_t>(d + 1) * L;
    const std::int32_t eb = here ? expert_base[static_cast<std::size_t>(idx[k])] : -1;
    m.slot_row[k] = eb >= 0 ? eb + h.plan.slot_rank_in_expert[static_cast<std::size_t>(t) * static_cast<std::size_t>(K) +
                                                               static_cast<std::size_t>(k)]
                            : -1;
  }
}

namespace {
std::int64_t align_rows(std::int64_t n, std::int64_t a) { return (n + a - 1) / a * a; }
}  // namespace

void Buffer::Impl::plan_expanded_slots(HandleState& h, const DispatchArgs& a, const std::vector<std::int32_t>& expert_base) const {
  h.slot_begin.clear();
  h.slot_row.clear();
  h.slot_k.clear();
  if (std::none_of(expert_base.begin(), expert_base.end(), [](std::int32_t b) { return b >= 0; })) return;  // no expanded receiver
  const RoutingPlan& plan = h.plan;
  const int K = config.num_topk;
  const std::int64_t* idx = a.topk_idx.as<std::int64_t>();
  // Slot (t, k) goes to entry (t, e / L); its segment index is segment_begin[d] + entry_position.
  // One look per slot, k ascending (so an entry's slots are too): token t's entries are its
  // destination ranks, one each (plan.token_begin), and e's rank is among them.
  auto for_each_slot = [&](auto&& f) {
    for (std::int64_t t = 0; t < plan.shape.num_tokens; ++t)
      for (int k = 0; k < K; ++k) {
        const std::int64_t e = idx[t * K + k];
        if (e < 0 || expert_base[static_cast<std::size_t>(e)] < 0) continue;
        const auto d = static_cast<std::int32_t>(e / L);
        auto i = static_cast<std::size_t>(plan.token_begin[static_cast<std::size_t>(t)]);
        while (plan.entry_rank[i] != d) ++i;
        const auto seg = static_cast<std::size_t>(plan.segment_begin[static_cast<std::size_t>(d)] + plan.entry_position[i]);
        f(seg, static_cast<std::int32_t>(expert_base[static_cast<std::size_t>(e)] + plan.slot_rank_in_expert[static_cast<std::size_t>(t * K + k)]), k);
      }
  };
  h.slot_begin.assign(static_cast<std::size_t>(plan.num_entries()) + 1, 0);
  for_each_slot([&](std::size_t seg, std::int32_t, int) { ++h.slot_begin[seg + 1]; });
  for (std::size_t i = 1; i < h.slot_begin.size(); ++i) h.slot_begin[i] += h.slot_begin[i - 1];
  h.slot_row.resize(static_cast<std::size_t>(h.slot_begin.back()));
  h.slot_k.resize(h.slot_row.size());
  std::vector<std::int32_t> at(h.slot_begin.begin(), h.slot_begin.end() - 1);
  for_each_slot([&](std::size_t seg, std::int32_t row, int k) {
    const auto j = static_cast<std::size_t>(at[seg]++);
    h.slot_row[j] = row;
    h.slot_k[j] = k;
  });
}

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
  } else if (payload.recv_view(a.recv_in_window)) {  // views: the rows already sit where the compact output wants them
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

namespace {

// One dispatch's epilogue: the facts decided once, then one named step each (Buffer::Impl::
// epilogue runs them). Rows are read where the path left them (`at`); nothing is copied when
// recv_x already holds them (a view of the window, or an output block the senders put into).
class Epilogue {
 public:
  Epilogue(Buffer::Impl& m, const HandleState& h, const DispatchArgs& a, bool fp8, DispatchResult& out, detail::RowsAt at,
           bool in_block)
      : m_(m), h_(h), a_(a), out_(out), fp8_(fp8), expanded_(h.layout == RecvLayout::kExpanded),
        rows_first_(at == detail::RowsAt::kStretches), payload_(m.payload.moves()),
        in_place_(m.payload.recv_view(a.recv_in_window) || in_block),
        // the bounded ring places rows as they arrive; an output block holds them already
        place_rows_(payload_ && at != detail::RowsAt::kPlaced && !in_block),
        copy_scales_(fp8 && !in_place_), zero_rows_(payload_ && (a.zero_padding || h.zero_padding)),  // a cached dispatch keeps its handle's choice
        row_bytes_(static_cast<std::size_t>(m.config.hidden) * dtype_size(a.x.dtype)),
        scale_bytes_(fp8 ? static_cast<std::size_t>(m.config.hidden / 128) * sizeof(float) : 0),
        // row bytes copied out of the receive area per output row (the ring's copies as they arrive count too)
        copied_row_(payload_ && !in_block ? row_bytes_ : 0),
        data_(m.transport.window() + m.geo.region(Region::kData)),
        scales_(m.transport.window() + m.geo.region(Region::kScales)),
        rx_(static_cast<std::byte*>(out.recv_x.data())),
        rs_(static_cast<std::byte*>(fp8 ? out.recv_x_scales.data() : nullptr)),
        src_(out.recv_src.as<std::int64_t>()),
        source_of_(static_cast<std::size_t>(h.num_recv())) {
    for (int s = 0; s < m.P; ++s)
      std::fill(source_of_.begin() + h.recv_begin[static_cast<std::size_t>(s)],
                source_of_.begin() + h.recv_begin[static_cast<std::size_t>(s) + 1], s);
  }

  /// Rows first into a view of the window: close the gaps between the sources' stretches
  /// (ascending: a stretch only moves down, onto rows already moved or its own).
  void close_gaps() const {
    if (!rows_first_ || !a_.recv_in_window || !payload_) return;
    for (int s = 1; s < m_.P; ++s) {
      const std::int64_t b = h_.recv_begin[static_cast<std::size_t>(s)], n = h_.recv_begin[static_cast<std::size_t>(s) + 1] - b;
      const auto at = static_cast<std::size_t>(m_.geo.recv_row(h_, s, b, true));
      std::memmove(rx_ + static_cast<std::size_t>(b) * row_bytes_, data_ + at * row_bytes_, static_cast<std::size_t>(n) * row_bytes_);
      if (fp8_)
        std::memmove(rs_ + static_cast<std::size_t>(b) * scale_bytes_, scales_ + at * scale_bytes_,
                     static_cast<std::size_t>(n) * scale_bytes_);
    }
  }

  /// Compact output rows [r0, r1): their payload (unless in place) and metadata; the bytes copied.
  std::uint64_t compact(std::int64_t r0, std::int64_t r1) const {
    if (!in_place_ && place_rows_) copy_rows(rx_, data_, r0, r1, row_bytes_);
    if (copy_scales_) copy_rows(rs_, scales_, r0, r1, scale_bytes_);
    const int K = m_.config.num_topk;
    for (std::int64_t r = r0; r < r1; ++r) {
      src_[r * 2] = source_of_[static_cast<std::size_t>(r)];
      src_[r * 2 + 1] = h_.recv_token[static_cast<std::size_t>(r)];
      for (int k = 0; k < K; ++k) {
        const auto i = static_cast<std::size_t>(r * K + k);
        out_.recv_topk_idx.as<std::int64_t>()[i] = h_.recv_slot_row[i];
        out_.recv_topk_weights.as<float>()[i] = h_.recv_slot_weight[i];
      }
    }
    return in_place_ ? 0 : static_cast<std::uint64_t>(r1 - r0) * (copied_row_ + scale_bytes_);
  }

  /// Received rows [r0, r1) into their expanded slots' rows (unless the senders put them
  /// there), with each slot's weight and source; the bytes copied.
  std::uint64_t expanded(std::int64_t r0, std::int64_t r1) const {
    const int K = m_.config.num_topk;
    std::uint64_t bytes = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      const auto from = static_cast<std::size_t>(window_row(r));
      for (int k = 0; k < K; ++k) {
        const auto i = static_cast<std::size_t>(r * K + k);
        const std::int64_t row = h_.recv_slot_row[i];
        if (row < 0) continue;
        const auto to = static_cast<std::size_t>(row);
        if (place_rows_) bulk_copy(rx_ + to * row_bytes_, data_ + from * row_bytes_, row_bytes_);
        if (copy_scales_) std::memcpy(rs_ + to * scale_bytes_, scales_ + from * scale_bytes_, scale_bytes_);
        bytes += copied_row_ + (copy_scales_ ? scale_bytes_ : 0);
        out_.recv_weights.as<float>()[row] = h_.recv_slot_weight[i];
        src_[row * 3] = source_of_[static_cast<std::size_t>(r)];
        src_[row * 3 + 1] = h_.recv_token[static_cast<std::size_t>(r)];
        src_[row * 3 + 2] = k;
      }
    }
    return bytes;
  }

  /// Padding rows (expanded: the tail of each expert's aligned range; both: rows past the
  /// real ones up to num_worst_tokens).
  void pad_all() const {
    if (expanded_)
      for (int j = 0; j < m_.L; ++j)
        pad(h_.expert_offset[static_cast<std::size_t>(j)] + h_.expert_count[static_cast<std::size_t>(j)],
            h_.expert_offset[static_cast<std::size_t>(j) + 1]);
    pad(expanded_ ? h_.expert_offset.back() : h_.num_recv(), h_.out_rows);
  }

  bool is_expanded() const noexcept { return expanded_; }

 private:
  // Where received row r sits in the window (rows first: in its source's stretch of C rows).
  std::int64_t window_row(std::int64_t r) const {
    return m_.geo.recv_row(h_, source_of_[static_cast<std::size_t>(r)], r, rows_first_);
  }

  // Rows [r0, r1) of a region (rows of `bytes`) to `to`: one copy per source's stretch.
  void copy_rows(std::byte* to, const std::byte* from, std::int64_t r0, std::int64_t r1, std::size_t bytes) const {
    for (std::int64_t r = r0; r < r1;) {
      const std::int64_t end =
          rows_first_ ? std::min(r1, h_.recv_begin[static_cast<std::size_t>(source_of_[static_cast<std::size_t>(r)]) + 1]) : r1;
      bulk_copy(to + static_cast<std::size_t>(r) * bytes, from + static_cast<std::size_t>(window_row(r)) * bytes,
                static_cast<std::size_t>(end - r) * bytes);
      r = end;
    }
  }

  // Padding rows [r0, r1) have source -1, weight 0, and zero data when asked (zero_padding;
  // docs/spec.md §3.2: unspecified otherwise).
  void pad(std::int64_t r0, std::int64_t r1) const {
    if (r1 <= r0) return;
    const auto n = static_cast<std::size_t>(r1 - r0);
    if (zero_rows_) std::memset(rx_ + static_cast<std::size_t>(r0) * row_bytes_, 0, n * row_bytes_);
    if (fp8_ && zero_rows_) std::memset(rs_ + static_cast<std::size_t>(r0) * scale_bytes_, 0, n * scale_bytes_);
    const int cols = expanded_ ? 3 : 2, K = m_.config.num_topk;
    std::fill(src_ + r0 * cols, src_ + r1 * cols, -1);
    if (expanded_) {
      std::fill(out_.recv_weights.as<float>() + r0, out_.recv_weights.as<float>() + r1, 0.0f);
    } else {
      std::fill(out_.recv_topk_idx.as<std::int64_t>() + r0 * K, out_.recv_topk_idx.as<std::int64_t>() + r1 * K, -1);
      std::fill(out_.recv_topk_weights.as<float>() + r0 * K, out_.recv_topk_weights.as<float>() + r1 * K, 0.0f);
    }
  }

  Buffer::Impl& m_;
  const HandleState& h_;
  const DispatchArgs& a_;
  DispatchResult& out_;
  const bool fp8_, expanded_, rows_first_, payload_, in_place_, place_rows_, copy_scales_, zero_rows_;
  const std::size_t row_bytes_, scale_bytes_, copied_row_;
  const std::byte* data_;
  const std::byte* scales_;
  std::byte* rx_;
  std::byte* rs_;
  std::int64_t* src_;
  std::vector<std::int32_t> source_of_;
};

}  // namespace

void Buffer::Impl::epilogue(const HandleState& h, const DispatchArgs& a, bool fp8, DispatchResult& out, detail::RowsAt at,
                            bool in_block) {
  transport.enter_phase("epilogue");  // no wait of its own: a rank that dies here is reported in it
  const Epilogue e(*this, h, a, fp8, out, at, in_block);
  e.close_gaps();
  std::atomic<std::uint64_t> copied{0};  // payload bytes copied out of the receive area (CallStats)
  run_workers([&](int w) {
    PhaseTimer timer(*this, w, Phase::kEpilogue);
    const auto [r0, r1] = split_range(h.num_recv(), w, W);
    copied.fetch_add(e.is_expanded() ? e.expanded(r0, r1) : e.compact(r0, r1), std::memory_order_relaxed);
    if (w == 0) e.pad_all();
  });
  stats.epilogue_copy_bytes = copied.load();
}

}  // namespace epx
