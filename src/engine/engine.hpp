// Private to the engine: the Buffer's state, the handle's contents, the window layout and
// the phases (notify → data plane → epilogue; combine), one file each:
//   buffer.cpp    — construction, input validation, the public entry points
//   notify.cpp    — control plane: status + counts exchange, prefix sums, row slots
//   dispatch.cpp  — data plane (puts into peers' windows) and the receiver's epilogue
//   combine.cpp   — partial sums at the expert ranks, puts back, ordered reduction
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epx/buffer.hpp"
#include "epx/error.hpp"
#include "tensor_pool.hpp"
#include "worker_pool.hpp"

namespace epx::detail {

/// An input problem found on this rank, reported to every rank before anything moves.
struct Status {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;  // already names this rank
};
using MaybeStatus = std::optional<Status>;

/// Everything a dispatch decided, shared by its combine and its cached dispatches.
struct HandleState {
  std::uint64_t buffer_id = 0;
  std::uint64_t dispatch_epoch = 0;  // the collective call that made it (same on every rank)
  int rank = 0;
  RecvLayout layout = RecvLayout::kCompact;
  int alignment = 1;
  std::int64_t worst = 0;
  RoutingPlan plan;  // sender side: who sends which row where
  // Sender side, per destination d: first row of my segment in d's receive area.
  std::vector<std::int64_t> send_base;  // [P]
  // Receiver side: rows from source s are [recv_begin[s], recv_begin[s+1]).
  std::vector<std::int64_t> recv_begin;  // [P + 1]
  // Receiver side, per source s: first row of my replies in s's combine area.
  std::vector<std::int64_t> reply_base;  // [P]
  std::int64_t out_rows = 0;             // rows of the dispatch output
  std::vector<std::int64_t> expert_count;   // [L] unaligned n_j
  std::vector<std::int64_t> expert_offset;  // [L + 1] expanded; o_L = aligned total
  // Receiver side, per received row r and slot k: expanded layout, the output row of the
  // slot; compact layout, its local expert (-1 either way: the expert is not on this rank);
  // and the slot's routing weight (0 when not here). Plus each row's source token.
  std::vector<std::int32_t> recv_token;    // [N]
  std::vector<std::int32_t> recv_slot_row; // [N * K]
  std::vector<float> recv_slot_weight;     // [N * K]
  Tensor topk_weights;                     // [S, K] returned by combine
  std::int64_t num_recv() const noexcept { return recv_begin.back(); }
};

/// Per-rank message every rank puts into every peer's header area at the start of a call.
struct NotifyHeader {
  std::uint64_t epoch;
  std::int32_t failed;        // 0 = ok; else ErrorCode + 1
  std::int32_t origin_rank;
  std::uint64_t handle_epoch; // cached dispatch / combine: the handle's dispatch epoch
  std::int32_t dtype;         // dispatch: DType of x
  std::int32_t expanded;      // dispatch: receiver's layout
  std::int32_t alignment;     // dispatch: receiver's expert_alignment
  std::int32_t has_counts;    // fresh dispatch: counts follow
  std::int64_t worst;         // dispatch: receiver's num_worst_tokens
  char message[512];
  // followed by std::int32_t counts[P + E]: tokens to each rank, slots to each expert
};

/// Byte offsets of the regions of one rank's window (the same on every rank).
struct WindowLayout {
  std::size_t header_bytes = 0;  // one NotifyHeader + counts, 64-aligned
  std::size_t headers = 0;       // 2 parities x P headers
  std::size_t data = 0;          // recv_rows x 2H: dispatch rows, in the compact output order
  std::size_t replies = 0;       // reply_rows x 2H: combine partials coming back
  std::size_t scales = 0;        // FP8 scale rows
  std::size_t meta = 0;          // one RowMeta (+ K idx, weights, rows) per received row
  std::size_t meta_bytes = 0;
  std::size_t total = 0;
  std::int64_t reply_rows = 0;   // C * min(K, P): one per (token, destination) of a source
  std::int64_t recv_rows = 0;    // rows the receive area holds (scales, meta)
  std::size_t header_offset(std::uint64_t epoch, int src, int num_ranks) const noexcept {
    return headers + ((epoch & 1) * static_cast<std::size_t>(num_ranks) + static_cast<std::size_t>(src)) * header_bytes;
  }
};

/// Row metadata a dispatch sends with each row: the source token, its topk_idx and
/// weights, and for each slot the expanded output row at the receiver (-1 elsewhere).
struct RowMetaView {
  std::int32_t* token;
  std::int64_t* topk_idx;  // [K]
  float* weights;          // [K]
  std::int32_t* slot_row;  // [K]
};

}  // namespace epx::detail

namespace epx {

struct Buffer::Impl {
  Impl(Transport& transport, const BufferConfig& config);

  // buffer.cpp
  detail::MaybeStatus check_dispatch(const DispatchArgs& a) const;
  detail::MaybeStatus check_combine(const CombineArgs& a) const;
  detail::Status make_status(ErrorCode code, const std::string& what) const;

  // notify.cpp: one all-to-all of headers; throws on every rank if any rank failed.
  struct Peers {
    std::vector<const detail::NotifyHeader*> header;  // [P]
    const std::int32_t* counts(int src) const noexcept {
      return reinterpret_cast<const std::int32_t*>(header[static_cast<std::size_t>(src)] + 1);
    }
  };
  Peers exchange_headers(const detail::MaybeStatus& status, const detail::NotifyHeader& mine,
                         const std::int32_t* counts, const char* phase);
  void plan_slots(detail::HandleState& h, const Peers& peers);
  std::vector<std::int32_t> expert_row_base(const Peers& peers) const;

  // Stats (stats.cpp): a scoped timer that adds to `phase` of `worker` when collecting.
  class PhaseTimer {
   public:
    PhaseTimer(Impl& m, int worker, Phase phase);
    ~PhaseTimer();
   private:
    double* slot_;
    std::chrono::steady_clock::time_point start_;
  };
  void begin_stats(bool combine, bool cached);
  void count_put(WorkerStats& ws, int peer, std::size_t bytes, int queue) const noexcept;
  void end_stats();

  // dispatch.cpp
  template <bool kStats>
  void send_rows_impl(const detail::HandleState& h, const DispatchArgs& a, const std::vector<std::int32_t>* expert_base);
  void send_rows(const detail::HandleState& h, const DispatchArgs& a, const std::vector<std::int32_t>* expert_base);
  void wait_phase(std::size_t first_slot, const char* phase);
  void receive_meta(detail::HandleState& h);
  DispatchResult epilogue(const detail::HandleState& h, const DispatchArgs& a, bool fp8);

  // combine.cpp
  template <bool kStats>
  void send_replies_impl(const detail::HandleState& h, const CombineArgs& a);
  void send_replies(const detail::HandleState& h, const CombineArgs& a);
  Tensor reduce(const detail::HandleState& h, const CombineArgs& a);

  detail::RowMetaView meta_row(std::byte* base, std::int64_t row) const noexcept;
  std::size_t dispatch_signal(int src, int worker) const noexcept;
  std::size_t combine_signal(int src, int worker) const noexcept;

  Transport& transport;
  BufferConfig config;
  int rank, P, L, W;
  std::uint64_t buffer_id;
  std::uint64_t epoch = 0;  // collective calls made so far (the same on every rank)
  detail::WindowLayout window;
  detail::WorkerPool pool;
  detail::TensorPool outputs;  // every tensor a call returns
  std::vector<std::byte> meta_stage;      // sender's row metadata, per plan entry
  std::vector<std::uint16_t> reply_stage;  // combine partials that need rounding
  CallStats stats;
  std::chrono::steady_clock::time_point call_start;
};

}  // namespace epx
