// The one owner of the window's geometry: every region of a rank's symmetric window, every
// signal-slot group, and where a row goes or lies. Nothing else in the engine computes a
// byte offset into the window or a signal-slot number; every phase asks this object.
//
// Window (the same on every rank; control data first, payload — rows — after
// payload_begin(), which the simulator's model interface is told):
//
//   headers      2 parities x P x header_bytes         notify headers + counts
//   meta         recv_rows x meta_bytes                 one RowMeta per received row
//   flag_meta    recv_rows x meta_record                flag protocol: metadata blocks
//   relay_records relay_rows x relay_record_bytes       hierarchical: per relayed row
//   ---- payload_begin()
//   data         recv_rows (ring: P x ring_rows) x 2H   dispatch rows
//   replies      reply_rows x 2H                        combine partials coming back
//   scales       recv_rows x H/128 float32              FP8 scale rows
//   flag_rows    recv_rows x row_record                 flag protocol: data + scale blocks
//   flag_replies reply_rows x reply_record              flag protocol: reply blocks
//   relay        relay_rows x 2H                        hierarchical: rows to forward
//   relay_scales relay_rows x scale row                 hierarchical: their scales
//   relay_replies relay_rows x lanes x 2H               hierarchical: replies to forward
//   outputs      output_pool_bytes                      dispatch outputs: blocks of rows the
//                                                       senders put straight into (one copy)
//
// Signal slots (stride: 1, or a 512-byte line per completion slot with the tail protocol):
//
//   header(s)            [P]      notify / rows-first completion, one per source
//   dispatch(s, w)       [P x W]  dispatch data of source s, worker w
//   combine(s, w)        [P x W]  combine replies of expert rank s, worker w
//   forward(s)           [P]      hierarchical: relayed rows / replies of s have landed
//   ring_tail(s)         [P]      ring: rows (dispatch) or rounds (combine) of s published
//   ring_credit(d)       [P]      ring: slots handed back to d
//   pull_done(s)         [P]      combine pull mode: s finished reading my rows
#pragma once

#include <cstddef>
#include <cstdint>

#include "epx/config.hpp"
#include "handle.hpp"

namespace epx::detail {

/// The window regions rows are put into.
enum class Region { kData, kScales, kMeta, kReplies, kRelay, kRelayScales, kRelayRecord, kRelayReplies, kOutputs };

/// Where a receiver's dispatch rows (kData) and their FP8 scales (kScales) land in one call:
/// its receive area, or a block of its output pool (the caller's output itself: one copy).
/// An expanded output block takes a row once per slot, at the slot's expanded row.
struct Landing {
  std::size_t data = 0;    // window offset of row 0
  std::size_t scales = 0;  // window offset of scale row 0
  bool block = false;      // an output block
  bool expanded = false;   // ... of the expanded layout (rows at HandleState::slot_row)
};

/// Flag protocol: a row travels as 512-byte blocks of 480 payload bytes + an 8-byte epoch.
inline constexpr std::size_t kFlagBlock = 512;
inline constexpr std::size_t kFlagPayload = 480;
inline std::size_t flag_blocks(std::size_t bytes) noexcept { return (bytes + kFlagPayload - 1) / kFlagPayload; }

/// Row metadata a dispatch sends with each row: the source token, its topk_idx and
/// weights, and for each slot the expanded output row at the receiver (-1 elsewhere).
struct RowMetaView {
  std::int32_t* token;
  std::int32_t* relay_row;  // hierarchical: the row's place in its relay's area (-1: sent directly)
  std::int64_t* topk_idx;   // [K]
  float* weights;           // [K]
  std::int32_t* slot_row;   // [K]
};

/// A relay record's view: per lane of the relay's server, the row's slot at that rank and
/// its reply row at the source (-1: not a destination), then per lane the row's RowMeta.
struct RelayRecordView {
  std::int32_t* slot;       // [lanes]
  std::int32_t* reply_row;  // [lanes]
  std::byte* meta;          // lanes x meta_bytes (use Geometry::meta_row(meta, lane))
};

/// What the geometry is computed from (all agreed on by every rank at construction).
struct GeometryShape {
  int num_ranks = 1;       // P
  int num_workers = 1;     // W
  int servers = 1;         // hierarchical schedule: servers, and ranks per server (lanes)
  int lanes = 1;
  std::int64_t max_tokens = 0;  // C
  std::int64_t recv_rows = 0;   // rows of the receive area (0 = P x C)
  std::int64_t ring_rows = 0;   // 0 = unbounded
  int hidden = 0;
  int num_topk = 0;
  int num_counts = 0;      // int32 counts after each notify header
  bool flag_protocol = false;
  bool tail_protocol = false;
  bool hierarchical = false;
  bool selection_replies = false;  // combine replies per (token, k): the reply area holds C x K rows
  std::int64_t output_pool_bytes = 0;  // resolved (never -1): bytes of the output pool

  static GeometryShape of(const BufferConfig& c, int P, int W, int servers, int lanes);
};

class Geometry {
 public:
  Geometry() = default;
  explicit Geometry(const GeometryShape& shape);

  // ---- Window regions.
  std::size_t total_bytes() const noexcept { return total_; }
  /// Control data (headers, metadata, records) lies below, payload (rows) from here on.
  std::size_t payload_begin() const noexcept { return data_; }
  /// First byte of a row region.
  std::size_t region(Region r) const noexcept;
  /// Row `row` (of `row_bytes`) of a plain region.
  std::size_t row(Region r, std::int64_t row, std::size_t row_bytes) const noexcept {
    return region(r) + static_cast<std::size_t>(row) * row_bytes;
  }
  /// Flag protocol: the first block of row `row` of a region (kData, kScales, kMeta, kReplies).
  std::size_t flag_block(Region r, std::int64_t row) const noexcept;
  /// This call's (epoch's) notify header of source `src`, followed by its counts.
  std::size_t header(std::uint64_t epoch, int src) const noexcept {
    return headers_ + ((epoch & 1) * static_cast<std::size_t>(s_.num_ranks) + static_cast<std::size_t>(src)) * header_bytes_;
  }
  std::size_t header_bytes() const noexcept { return header_bytes_; }

  std::int64_t recv_rows() const noexcept { return recv_rows_; }    // rows the receive area holds (scales, meta)
  std::int64_t reply_rows() const noexcept { return reply_rows_; }  // rows of the reply area
  std::int64_t relay_rows() const noexcept { return relay_rows_; }  // rows of the relay area
  std::size_t meta_bytes() const noexcept { return meta_bytes_; }   // one RowMeta
  std::size_t relay_record_bytes() const noexcept { return relay_record_bytes_; }

  /// Row `row`'s metadata in a block of RowMeta records starting at `base` (the window's
  /// meta region, a sender's staging area, a relay record's lanes).
  RowMetaView meta_row(std::byte* base, std::int64_t row) const noexcept;
  /// The bytes of that record.
  std::byte* meta_record(std::byte* base, std::int64_t row) const noexcept { return base + static_cast<std::size_t>(row) * meta_bytes_; }
  /// Relay record `row` in a block of records starting at `base` (window or staging area).
  RelayRecordView relay_record(std::byte* base, std::int64_t row) const noexcept;
  /// Byte offset of relay record `row` in a block of records.
  std::size_t relay_record_offset(std::int64_t row) const noexcept {
    return static_cast<std::size_t>(row) * relay_record_bytes_;
  }

  // ---- The output pool: blocks of region kOutputs, each one dispatch output on this rank.
  std::size_t output_pool_bytes() const noexcept { return static_cast<std::size_t>(s_.output_pool_bytes); }
  /// Bytes of an output block of `rows` rows of `row_bytes` (x's dtype) and of `scale_bytes`
  /// (FP8 scales; 0 for bf16): rows, then scales at the next 64 bytes; whole 4 KiB pages.
  static std::size_t output_block_bytes(std::int64_t rows, std::size_t row_bytes, std::size_t scale_bytes) noexcept;
  /// The landing of an output block at byte `block` of the pool holding `rows` rows.
  Landing output_block(std::size_t block, std::int64_t rows, std::size_t row_bytes) const noexcept;
  /// The landing of the receive area (regions kData and kScales).
  Landing receive_area() const noexcept { return {data_, scales_, false}; }
  /// Row `row` (of `row_bytes`) of a landing's kData or kScales rows.
  static std::size_t landed_row(const Landing& l, Region r, std::int64_t row, std::size_t row_bytes) noexcept {
    return (r == Region::kScales ? l.scales : l.data) + static_cast<std::size_t>(row) * row_bytes;
  }

  // ---- Where rows go and lie (rows of the data / meta / scales regions).
  /// The receive area has a stretch of C rows per source (rows first is possible).
  bool has_stretches() const noexcept { return recv_rows_ >= static_cast<std::int64_t>(s_.num_ranks) * s_.max_tokens; }
  /// Dispatch, sender: the row of my p-th row for destination d (position p in my segment
  /// for d) in d's receive area — its planned slot, or (rows first) in my stretch.
  std::int64_t send_row(const HandleState& h, int d, std::int64_t p, bool rows_first) const noexcept {
    return rows_first ? stretch_begin(h.rank) + p : h.send_base[static_cast<std::size_t>(d)] + p;
  }
  /// Dispatch, receiver: where received row r (from source s) lies in my receive area.
  std::int64_t recv_row(const HandleState& h, int s, std::int64_t r, bool rows_first) const noexcept {
    return rows_first ? stretch_begin(s) + (r - h.recv_begin[static_cast<std::size_t>(s)]) : r;
  }
  /// Combine, expert rank: the row at source s answering my received row r (push mode).
  std::int64_t reply_row(const HandleState& h, int s, std::int64_t r) const noexcept {
    return h.reply_base[static_cast<std::size_t>(s)] + (r - h.recv_begin[static_cast<std::size_t>(s)]);
  }
  /// Combine, source: my reply row answering my p-th row for destination d (push mode; the
  /// reply area holds my segments in destination order).
  std::int64_t replied_row(const HandleState& h, int d, std::int64_t p) const noexcept {
    return h.plan.segment_begin[static_cast<std::size_t>(d)] + p;
  }
  /// Combine, per-selection replies (CombineReplies::kSelections): the row of the source's
  /// reply area answering its token t's selection k.
  std::int64_t selection_row(std::int64_t t, int k) const noexcept { return t * s_.num_topk + k; }
  /// Dispatch ring: ring position i of source `src`'s ring (rows of the data region).
  std::int64_t ring_row(int src, std::int64_t i) const noexcept { return src * s_.ring_rows + i % s_.ring_rows; }
  /// Combine ring: tokens per round, and the first reply row of expert rank d in round `round`.
  std::int64_t reply_round_tokens() const noexcept { return reply_round_; }
  std::int64_t reply_ring_row(std::int64_t round, int d) const noexcept {
    return (round % 2) * s_.num_ranks * reply_round_ + d * reply_round_;
  }
  /// Hierarchical combine: where lane `lane`'s reply to relayed row i sits in the relay area.
  std::int64_t relay_reply_row(std::int64_t relayed_row, int lane) const noexcept {
    return relayed_row * s_.lanes + lane;
  }

  // ---- Signal slots.
  std::size_t num_signals() const noexcept { return relay_chunk_signal(s_.num_ranks, 0); }
  std::size_t header_signal(int src) const noexcept { return static_cast<std::size_t>(src); }
  std::size_t dispatch_signal(int src, int worker) const noexcept { return completion(s_.num_ranks, src, worker); }
  std::size_t combine_signal(int src, int worker) const noexcept { return completion(dispatch_signal(s_.num_ranks, 0), src, worker); }
  std::size_t forward_signal(int src) const noexcept { return group(combine_signal(s_.num_ranks, 0), src); }
  std::size_t ring_tail_signal(int src) const noexcept { return group(forward_signal(s_.num_ranks), src); }
  std::size_t ring_credit_signal(int dst) const noexcept { return group(ring_tail_signal(s_.num_ranks), dst); }
  std::size_t pull_done_signal(int src) const noexcept { return group(ring_credit_signal(s_.num_ranks), src); }
  /// Relay chunks (hierarchical dispatch and combine): sender src's worker's count of relay
  /// chunks sent to me, epoch << 32 | chunks (paths/relay_chunks.hpp).
  std::size_t relay_chunk_signal(int src, int worker) const noexcept { return completion(pull_done_signal(s_.num_ranks), src, worker); }

  const GeometryShape& shape() const noexcept { return s_; }

 private:
  std::int64_t stretch_begin(int src) const noexcept { return src * s_.max_tokens; }
  std::size_t completion(std::size_t first, int src, int worker) const noexcept {
    return first + (static_cast<std::size_t>(src) * static_cast<std::size_t>(s_.num_workers) + static_cast<std::size_t>(worker)) * stride_;
  }
  std::size_t group(std::size_t first, int i) const noexcept { return first + static_cast<std::size_t>(i) * stride_; }

  GeometryShape s_;
  std::size_t stride_ = 1;
  std::size_t header_bytes_ = 0, headers_ = 0;
  std::size_t meta_ = 0, meta_bytes_ = 0, flag_meta_ = 0;
  std::size_t data_ = 0, replies_ = 0, scales_ = 0, flag_rows_ = 0, flag_replies_ = 0;
  std::size_t meta_record_ = 0, row_record_ = 0, reply_record_ = 0;
  std::size_t relay_records_ = 0, relay_ = 0, relay_scales_ = 0, relay_replies_ = 0, outputs_ = 0;
  std::size_t relay_record_bytes_ = 0, relay_slots_bytes_ = 0;
  std::size_t total_ = 0;
  std::int64_t relay_rows_ = 0, reply_rows_ = 0, recv_rows_ = 0, reply_round_ = 1;
};

}  // namespace epx::detail
