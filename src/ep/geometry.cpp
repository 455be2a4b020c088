#include "geometry.hpp"

#include <algorithm>

#include "engine.hpp"

namespace epx::detail {

namespace {
std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
}  // namespace

GeometryShape GeometryShape::of(const BufferConfig& c, int P, int W, int servers, int lanes) {
  GeometryShape s;
  s.num_ranks = P;
  s.num_workers = W;
  s.servers = servers;
  s.lanes = lanes;
  s.max_tokens = c.max_tokens_per_rank;
  s.recv_rows = c.max_recv_rows;
  s.ring_rows = c.ring_rows;
  s.hidden = c.hidden;
  s.num_topk = c.num_topk;
  s.num_counts = detail::num_counts(c, P);
  s.flag_protocol = c.dataplane.protocol == Protocol::kFlag;
  s.tail_protocol = c.dataplane.protocol == Protocol::kTail;
  s.hierarchical = c.dataplane.schedule.kind == ScheduleKind::kHierarchical;
  s.selection_replies = c.dataplane.combine_replies == CombineReplies::kSelections;
  // Auto: one output of the largest size a compact dispatch can return (bf16, or FP8 rows
  // and scales, whichever is bigger).
  const std::int64_t rows = c.max_recv_rows > 0 ? c.max_recv_rows : static_cast<std::int64_t>(P) * c.max_tokens_per_rank;
  const auto H = static_cast<std::size_t>(std::max(c.hidden, 0));
  const std::size_t scale_row = H % 128 == 0 ? H / 128 * sizeof(float) : 0;
  s.output_pool_bytes = c.output_pool_bytes >= 0
                            ? static_cast<std::int64_t>(align_up(static_cast<std::size_t>(c.output_pool_bytes), 4096))
                            : static_cast<std::int64_t>(std::max(Geometry::output_block_bytes(rows, 2 * H, 0),
                                                                 Geometry::output_block_bytes(rows, H, scale_row)));
  return s;
}

Geometry::Geometry(const GeometryShape& g) : s_(g) {
  const int P = g.num_ranks;
  const std::size_t H = static_cast<std::size_t>(g.hidden), K = static_cast<std::size_t>(g.num_topk);
  stride_ = g.tail_protocol ? 512 / sizeof(std::uint64_t) : 1;
  header_bytes_ = align_up(sizeof(NotifyHeader) + sizeof(std::int32_t) * static_cast<std::size_t>(g.num_counts), 64);
  recv_rows_ = g.recv_rows > 0 ? g.recv_rows : static_cast<std::int64_t>(P) * g.max_tokens;
  // Bounded mode: two rounds of max(1, ring_rows / 2) tokens, a block per expert rank each.
  reply_round_ = std::max<std::int64_t>(1, g.ring_rows / 2);
  reply_rows_ = g.ring_rows > 0 ? 2 * static_cast<std::int64_t>(P) * reply_round_
                                : g.max_tokens * (g.selection_replies ? g.num_topk : std::min<std::int64_t>(g.num_topk, P));
  meta_bytes_ = align_up(8 + 16 * K, 8);
  const std::size_t scale_row = H % 128 == 0 ? H / 128 * sizeof(float) : 0;
  if (g.flag_protocol) {
    meta_record_ = flag_blocks(meta_bytes_) * kFlagBlock;
    row_record_ = (flag_blocks(2 * H) + flag_blocks(scale_row)) * kFlagBlock;
    reply_record_ = flag_blocks(2 * H) * kFlagBlock;
  }
  const auto lanes = static_cast<std::size_t>(g.lanes);
  if (g.hierarchical) {
    // A source of another server relays each of its tokens through me at most once.
    relay_rows_ = static_cast<std::int64_t>(g.servers - 1) * g.max_tokens;
    relay_slots_bytes_ = align_up(2 * lanes * sizeof(std::int32_t), 8);
    relay_record_bytes_ = relay_slots_bytes_ + lanes * meta_bytes_;
  }
  const auto recv = static_cast<std::size_t>(recv_rows_), reply = static_cast<std::size_t>(reply_rows_);
  const auto relay = static_cast<std::size_t>(relay_rows_);
  headers_ = 0;
  meta_ = align_up(headers_ + 2 * static_cast<std::size_t>(P) * header_bytes_, 64);
  flag_meta_ = align_up(meta_ + recv * meta_bytes_, 4096);
  relay_records_ = align_up(flag_meta_ + recv * meta_record_, 64);
  data_ = align_up(relay_records_ + relay * relay_record_bytes_, 4096);
  const std::size_t data_rows = g.ring_rows > 0 ? static_cast<std::size_t>(P) * static_cast<std::size_t>(g.ring_rows) : recv;
  replies_ = align_up(data_ + data_rows * 2 * H, 4096);
  scales_ = align_up(replies_ + reply * 2 * H, 64);
  flag_rows_ = align_up(scales_ + recv * scale_row, 4096);
  flag_replies_ = align_up(flag_rows_ + recv * row_record_, 4096);
  relay_ = align_up(flag_replies_ + reply * reply_record_, 4096);
  relay_scales_ = align_up(relay_ + relay * 2 * H, 64);
  relay_replies_ = align_up(relay_scales_ + relay * scale_row, 4096);
  outputs_ = align_up(relay_replies_ + relay * lanes * 2 * H, 4096);
  total_ = outputs_ + static_cast<std::size_t>(g.output_pool_bytes);
}

std::size_t Geometry::output_block_bytes(std::int64_t rows, std::size_t row_bytes, std::size_t scale_bytes) noexcept {
  const auto n = static_cast<std::size_t>(std::max<std::int64_t>(rows, 0));
  return align_up(align_up(n * row_bytes, 64) + n * scale_bytes, 4096);
}

Landing Geometry::output_block(std::size_t block, std::int64_t rows, std::size_t row_bytes) const noexcept {
  const std::size_t data = outputs_ + block;
  return {data, data + align_up(static_cast<std::size_t>(rows) * row_bytes, 64), true};
}

std::size_t Geometry::region(Region r) const noexcept {
  switch (r) {
    case Region::kData: return data_;
    case Region::kScales: return scales_;
    case Region::kMeta: return meta_;
    case Region::kReplies: return replies_;
    case Region::kRelay: return relay_;
    case Region::kRelayScales: return relay_scales_;
    case Region::kRelayRecord: return relay_records_;
    case Region::kRelayReplies: return relay_replies_;
    case Region::kOutputs: return outputs_;
  }
  return 0;
}

// A received dispatch row is one record of data blocks followed by scale blocks (sized for
// the widest row).
std::size_t Geometry::flag_block(Region r, std::int64_t row) const noexcept {
  const auto i = static_cast<std::size_t>(row);
  switch (r) {
    case Region::kData: return flag_rows_ + i * row_record_;
    case Region::kScales: return flag_rows_ + i * row_record_ + flag_blocks(2 * static_cast<std::size_t>(s_.hidden)) * kFlagBlock;
    case Region::kMeta: return flag_meta_ + i * meta_record_;
    case Region::kReplies: return flag_replies_ + i * reply_record_;
    default: return 0;  // relays forward on signals; flag + hierarchical is refused
  }
}

RowMetaView Geometry::meta_row(std::byte* base, std::int64_t row) const noexcept {
  const std::size_t K = static_cast<std::size_t>(s_.num_topk);
  std::byte* p = meta_record(base, row);
  RowMetaView v;
  v.token = reinterpret_cast<std::int32_t*>(p);
  v.relay_row = reinterpret_cast<std::int32_t*>(p + 4);
  v.topk_idx = reinterpret_cast<std::int64_t*>(p + 8);
  v.weights = reinterpret_cast<float*>(p + 8 + 8 * K);
  v.slot_row = reinterpret_cast<std::int32_t*>(p + 8 + 12 * K);
  return v;
}

RelayRecordView Geometry::relay_record(std::byte* base, std::int64_t row) const noexcept {
  std::byte* p = base + relay_record_offset(row);
  RelayRecordView v;
  v.slot = reinterpret_cast<std::int32_t*>(p);
  v.reply_row = v.slot + s_.lanes;
  v.meta = p + relay_slots_bytes_;
  return v;
}

}  // namespace epx::detail

namespace epx {

std::size_t output_block_bytes(std::int64_t rows, int hidden, DType dtype) noexcept {
  const auto H = static_cast<std::size_t>(std::max(hidden, 0));
  const std::size_t scales = dtype == DType::kFP8E4M3 ? H / 128 * sizeof(float) : 0;
  return detail::Geometry::output_block_bytes(rows, H * dtype_size(dtype), scales);
}

}  // namespace epx
