// Private to the engine: the Buffer's state and the phases (notify → data plane →
// epilogue; combine), one file each. The state is three parts: Setup (setup.hpp: fixed
// when the Buffer is built — config, ranks, topology, geometry, the payload policy of
// payload.hpp), CallContext (call_context.hpp: epoch, stats, waits, staging) and the
// services below. The handle's contents live in handle.hpp; every window offset, signal
// slot and row address in geometry.hpp (the one owner of the geometry).
//   setup.cpp     — the config's checks and agreement, the ranks' places, the geometry
//   buffer.cpp    — allocation, input validation, the public entry points
//   notify.cpp    — control plane: status + counts exchange, prefix sums, row slots
//   channels.cpp  — a worker's puts: queues, aggregation (Sender), which calls the
//                   completion protocol's unit (protocol.hpp, protocols/*.cpp)
//   dispatch.cpp  — dispatch building blocks: a worker's segment puts, metadata, the
//                   receiver's metadata and epilogue
//   combine.cpp   — combine building blocks: partial sums, the replies' puts, the ordered reduction
//   path.hpp, paths/ — the data paths, one unit each (how rows and replies travel), which
//                   see the Buffer only through path_context.hpp
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "epx/buffer.hpp"
#include "epx/error.hpp"
#include "epx/sim/model_transport.hpp"
#include "epx/spi/copy.hpp"
#include "epx/spi/support.hpp"
#include "epx/topology.hpp"
#include "async_call.hpp"
#include "block_pool.hpp"
#include "call_context.hpp"
#include "call_state.hpp"
#include "geometry.hpp"
#include "handle.hpp"
#include "handle_recycler.hpp"
#include "setup.hpp"
#include "tensor_pool.hpp"
#include "worker_pool.hpp"

namespace epx::detail {

class CompletionProtocol;  // protocol.hpp

/// An input problem found on this rank, reported to every rank before anything moves.
struct Status {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;  // already names this rank
};
using MaybeStatus = std::optional<Status>;

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
  std::int32_t y_in_window;   // combine: my y lies where my peers can read it in place (pull)
  std::int64_t tokens;        // combine: my S (the bounded reply area's rounds)
  std::int32_t recv_view;     // my latest dispatch's output is a view of my receive area
  std::int64_t out_block;       // dispatch: my output block's first byte in my output pool
  std::int64_t out_block_bytes; // ... and its bytes (0: none, my rows land in my receive area)
  std::int64_t y_offset;        // combine, y_in_window: where y's first row lies in my window
  std::uint64_t held_ns;        // ns the network held me since my previous header (PeerWaits, stats.cpp)
  char message[512];
  // followed by std::int32_t counts[P + E]: tokens to each rank, slots to each expert
};

/// Where a dispatch's received rows lie once its path is done (DispatchPath::rows_at):
/// at their planned slots of the receive area (or the output block), in each source's
/// stretch of C rows (rows first), or already placed in recv_x (the ring).
enum class RowsAt { kSlots, kStretches, kPlaced };

/// Counts in a fresh dispatch's header: tokens per rank, slots per expert, and with the
/// hierarchical schedule tokens per relay.
inline int num_counts(const BufferConfig& c, int P) {
  return P + c.num_experts + (c.dataplane.schedule.kind == ScheduleKind::kHierarchical ? P : 0);
}

}  // namespace epx::detail

namespace epx {

struct Buffer::Impl : detail::Setup, detail::CallContext {
  /// Collective: agrees on `config` and allocates the window on `owner`'s endpoint.
  Impl(Buffer& owner, const BufferConfig& config);

  // buffer.cpp: one dispatch / combine in three steps — front (validation, plan, header
  // exchange, outputs), puts, back (completion, epilogue / reduction) — run in a row by
  // dispatch() and combine(), split across threads by dispatch_async() and combine_async().
  struct DispatchCall;
  struct CombineCall;

  /// A group of completion signals: slot (source, worker) of Geometry's dispatch or combine group.
  using CompletionSlot = std::size_t (detail::Geometry::*)(int, int) const noexcept;

  // buffer.cpp
  detail::MaybeStatus check_dispatch(const DispatchArgs& a) const;
  detail::MaybeStatus check_x(const DispatchArgs& a) const;       // check_dispatch's x and x_scales
  detail::MaybeStatus check_cached(const DispatchArgs& a) const;  // check_dispatch's handle of a cached dispatch
  detail::MaybeStatus check_combine(const CombineArgs& a) const;
  detail::Status make_status(ErrorCode code, const std::string& what) const;

  int num_counts() const { return detail::num_counts(config, P); }

  // notify.cpp: one all-to-all of headers; throws on every rank if any rank failed.
  struct Peers {
    std::vector<const detail::NotifyHeader*> header;  // [P]
    const std::int32_t* counts(int src) const noexcept {
      return reinterpret_cast<const std::int32_t*>(header[static_cast<std::size_t>(src)] + 1);
    }
  };
  Peers exchange_headers(const detail::MaybeStatus& status, const detail::NotifyHeader& mine,
                         const std::int32_t* counts, const char* phase);
  /// No rank's latest dispatch returned views of its receive area (the headers' recv_view).
  static bool none_holds_a_view(const Peers& peers);
  /// Whether a call may put its rows before the header exchange and let the exchange
  /// complete them ("rows first", docs/engine.md): not with the ring (its credits pace the
  /// rows), relays or the flag protocol (they complete rows their own way).
  bool rows_first_allowed() const noexcept { return spi::allows(spi::Path::kRowsFirst, config); }
  /// A combine with handle `h` may push its replies before the exchange (the call state
  /// decides the rest): the table allows it, and with an output pool every rank's dispatch
  /// output of `h` is small (DataPlaneOptions::replies_first_max_bytes; the same on every rank).
  bool replies_first_allowed(const detail::HandleState& h) const noexcept;
  void plan_slots(detail::HandleState& h, const Peers& peers);
  /// Dispatch, before the header exchange: the output block this rank offers its senders
  /// (none when its output is a view or must be a copy; `why` then says why, CallStats::
  /// output_why). Fresh: the largest free extent up to the biggest output it may need;
  /// cached: exactly the handle's output, or none.
  detail::BlockPool::Reservation reserve_output(const detail::HandleState* cached, const DispatchArgs& a,
                                                std::size_t row_bytes, std::size_t scale_bytes, const char*& why);
  /// After the exchange: where each destination's rows land this call — its output block
  /// when its header offered one big enough for its output, else its receive area.
  std::vector<detail::Landing> landings(const detail::HandleState& h, const Peers& peers, std::size_t row_bytes,
                                        std::size_t scale_bytes) const;
  std::vector<std::int32_t> expert_row_base(const Peers& peers) const;
  /// The most output rows a fresh dispatch of this layout can return (before num_worst_tokens).
  std::int64_t max_output_rows(const DispatchArgs& a) const;

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
  // Always on (stats.cpp; epx/stats.hpp's PeerWaits): this call's waits per peer.
  using WaitClock = std::chrono::steady_clock;
  /// Adds the time since `since` to worker w's wait for source s this call; returns now
  /// (the start of the loop's next wait).
  WaitClock::time_point lap_wait(int w, int s, WaitClock::time_point since) noexcept;
  void begin_waits(bool combine);  // by begin_stats
  void end_waits();                // by end_stats
  /// The i-th source of this call's wait loops: they start at a source that rotates from
  /// call to call, so that no source is always waited for first.
  int wait_source(int i) const noexcept { return (wait_first + i) % P; }

  // channels.cpp: one worker's puts of one call, on the queues of its channels (a
  // channel = this worker's visit to one peer), completed by the configured protocol.
  class Sender {
   public:
    /// `channel_bytes[d]`: bytes this worker will put to peer d (decides the queues).
    /// `first_signal` = kNoSignal: no completion signals, the caller completes the puts.
    Sender(Impl& m, int worker, std::size_t first_signal, const std::vector<std::uint64_t>& channel_bytes,
           const std::vector<int>& peers);
    /// Puts rows [row, row + n) of `region` at peer d from `src` (rows of `row_bytes`,
    /// consecutive in src): merged into puts of at most aggregate_bytes, or, with the flag
    /// protocol, one flagged block at a time.
    void put_rows(int d, detail::Region region, std::int64_t row, const void* src, std::int64_t n, std::size_t row_bytes);
    /// Dispatch rows (region kData or kScales) into peer d's landing of this call: its
    /// receive area (as put_rows) or its output block (not with the flag protocol).
    void put_landed(int d, const detail::Landing& at, detail::Region region, std::int64_t row, const void* src,
                    std::int64_t n, std::size_t row_bytes);
    /// This worker has put everything for peer d (tail: its ordered signal goes now).
    void end_channel(int d);
    /// Completes the call's puts (explicit: quiet every queue, then signal every peer).
    void finish();
    /// Quiet every queue (the caller's input may be reused afterwards).
    void flush();
    /// A progress signal to peer d on its channel's queue, ordered after the puts before it
    /// (explicit: after a quiet of that queue).
    void signal(int d, std::size_t slot, std::uint64_t value);

    static constexpr std::size_t kNoSignal = ~std::size_t{0};

    // For the completion protocol units (protocol.hpp, protocols/).
    Impl& impl() const noexcept { return m_; }
    int queue_of(int d) const noexcept { return queue_of_[static_cast<std::size_t>(d)]; }
    std::size_t signal_slot() const noexcept { return signal_slot_; }
    const std::vector<int>& peers() const noexcept { return peers_; }
    /// Queue q's staging bytes (the protocol's stage_bytes() each).
    std::byte* stage(int q) noexcept;
    /// n consecutive rows from window offset `first` on: puts of at most aggregate_bytes.
    void put_run(int d, std::size_t first, const std::byte* src, std::int64_t n, std::size_t row_bytes);
    /// Counts one put of `bytes` to d on queue q (when collecting).
    void count(int d, std::size_t bytes, int q) noexcept {
      if (stats_) m_.count_put(*stats_, d, bytes, q);
    }

   private:
    void put(int d, std::size_t offset, const void* src, std::size_t bytes);
    Impl& m_;
    const detail::CompletionProtocol& proto_;  // the configured protocol's unit
    const std::vector<int>& peers_;  // visiting order: the peers this call completes
    std::size_t signal_slot_;        // my completion slot at every peer
    std::vector<int> queue_of_;      // [P]
    std::vector<std::byte> stage_;   // per queue, the protocol's staging (flag: the zero-padded last block of a row)
    WorkerStats* stats_;             // null: not collecting
    int worker_;
  };
  /// The completion protocol's receive side for one group of rows (its unit's await_rows,
  /// protocol.hpp): explicit and tail wait for every source's and worker's signal `slot`;
  /// flag waits for every block of rows [0, begin[P]) of each region and unpacks it (row r
  /// comes from the rank s with begin[s] <= r < begin[s + 1]). Regions of 0 bytes per row
  /// are skipped.
  struct RowGroup {
    detail::Region region;
    std::size_t row_bytes;
  };
  /// Called by await_rows with a source whose rows have all landed here (protocol.hpp).
  using SourceLanded = std::function<void(int)>;
  void await_rows(CompletionSlot slot, const char* phase, const std::vector<std::int64_t>& begin,
                  std::initializer_list<RowGroup> groups, const SourceLanded* landed = nullptr);

  // The hierarchical schedule (paths/dispatch_relay.cpp, paths/combine_relay.cpp): a token
  // crossing servers goes once to the same-lane rank of the target server, which forwards it.
  // (Setup::relayed_sources: the other-server ranks of my lane, whose rows I relay.)
  /// A dispatch row's metadata for destination d (expert_base: each expert's first row there).
  void fill_meta(detail::RowMetaView m, const detail::HandleState& h, const DispatchArgs& a, int d, std::int32_t t,
                 const std::vector<std::int32_t>& expert_base) const;

  // dispatch.cpp: the dispatch paths' building blocks.
  /// Fresh dispatch: room for every plan entry's metadata in meta_stage (before the workers).
  void stage_meta(const detail::HandleState& h);
  /// The plan positions [p0, p1) of my tokens [t0, t1) in my segment for d.
  static std::pair<std::int64_t, std::int64_t> segment_part(const RoutingPlan& plan, int d, std::int64_t t0, std::int64_t t1);
  /// One worker's rows for destination d: positions [p0, p1) of my segment for d, at rows
  /// base + p of d's landing `at` (with their FP8 scales; fresh, `expert_base` non-null:
  /// their metadata, built in meta_stage, at the same rows of d's receive area).
  void put_segment(Sender& send, const detail::HandleState& h, const DispatchArgs& a,
                   const std::vector<std::int32_t>* expert_base, int d, std::int64_t p0, std::int64_t p1,
                   std::int64_t base, const detail::Landing& at);
  /// put_segment's two halves: the rows of positions [p0, p1) (with their FP8 scales, run by
  /// run, when `run_scales`; an expanded landing takes each row and its scales once per slot),
  /// and their metadata.
  void put_segment_rows(Sender& send, const detail::HandleState& h, const DispatchArgs& a, int d, std::int64_t p0,
                        std::int64_t p1, std::int64_t base, const detail::Landing& at, bool run_scales);
  /// FP8, not an expanded landing: the scale rows of positions [p0, p1) gathered in
  /// scale_stage (stage_scales sizes it, before the workers) and put as consecutive rows.
  void stage_scales(const detail::HandleState& h, const DispatchArgs& a);
  void put_segment_scales(Sender& send, const detail::HandleState& h, const DispatchArgs& a, int d, std::int64_t p0,
                          std::int64_t p1, std::int64_t base, const detail::Landing& at);
  /// Fresh dispatch, after the exchange: each of my segment entries' slot rows at receivers
  /// with the expanded layout (HandleState::slot_begin / slot_row / slot_k).
  void plan_expanded_slots(detail::HandleState& h, const DispatchArgs& a, const std::vector<std::int32_t>& expert_base) const;
  void put_segment_meta(Sender& send, const detail::HandleState& h, const DispatchArgs& a,
                        const std::vector<std::int32_t>* expert_base, int d, std::int64_t p0, std::int64_t p1,
                        std::int64_t base);
  /// The metadata of source s's received rows into the handle. `rows_first` (the counts, non-null): the
  /// rows of source s sit at s·C, and expanded slots carry their rank among s's tokens for
  /// the expert, to which the receiver adds the expert's base.
  void receive_meta(detail::HandleState& h, int s, const Peers* rows_first) const;
  /// Before the first receive_meta of a fresh dispatch: the handle's per-row receive arrays.
  void size_received(detail::HandleState& h) const;
  /// The output tensors (recv_x and its scales: a kept output block when `block` is my
  /// landing's, views of the window, or from the heap pool; the rest from the heap pool).
  DispatchResult make_outputs(const detail::HandleState& h, const DispatchArgs& a, bool fp8, const detail::Landing* block,
                              detail::BlockPool::Reservation* reserved);
  /// Receive area → the requested layout (`at`: where the path left the rows — kPlaced: the
  /// ring already put recv_x's rows; kStretches: the rows of source s sit at s·C).
  /// `in_block`: the rows already lie in recv_x (its output block): nothing to copy.
  void epilogue(const detail::HandleState& h, const DispatchArgs& a, bool fp8, DispatchResult& out, detail::RowsAt at,
                bool in_block);

  // combine.cpp. Push mode: the expert ranks put their rows (or partial sums) into the
  // sources' reply areas, the sources reduce them. Pull mode (every rank's y is the
  // zero-copy recv_x in its window, on a transport with mapped peers): each source reduces
  // reading the expert ranks' rows in place — one pass, no puts — then tells them it is done.
  /// `signal` false: the puts are only quieted (the caller's header exchange completes them).
  /// `relayed` false: only the replies to my own server's sources (a node-first relay reads
  /// the rest in place, paths/combine_relay.cpp).
  void send_replies(const detail::HandleState& h, const CombineArgs& a, bool signal, bool relayed = true);
  /// send_replies' parts (the relays' chunked send shares them, paths/combine_relay.cpp):
  /// worker w's slice of my received rows from source s; the partials' stage (expanded
  /// partials, before the workers); the bytes each channel of worker w carries; and the
  /// replies of rows [first, end) from source s on the channel to `peer` (peer != s: to the
  /// relay, my lane's place of each row in its relay area).
  std::pair<std::int64_t, std::int64_t> reply_slice(const detail::HandleState& h, int s, int w) const;
  void reserve_reply_stage(const detail::HandleState& h);
  std::vector<std::uint64_t> reply_channel_bytes(const detail::HandleState& h, int w, bool relayed = true) const;
  /// The sources whose replies travel to channel `peer` (reply_sources; `relayed` false:
  /// only the peer's own), each as f(s, first, end) with worker w's slice of my rows from s.
  template <class F>
  void each_reply_source(const detail::HandleState& h, int peer, int w, bool relayed, F&& f) const {
    for (int s : reply_sources[static_cast<std::size_t>(peer)])
      if (relayed || s == peer) {
        const auto [first, end] = reply_slice(h, s, w);
        f(s, first, end);
      }
  }
  class Replies;
  void put_replies(Sender& send, Replies& replies, const detail::HandleState& h, const CombineArgs& a, int peer, int s,
                   std::int64_t first, std::int64_t end);
  /// At an expert rank, one worker's replies: received row r's is y's row where it passes
  /// unchanged (compact; expanded with one unweighted slot), else the bf16 partial sum of
  /// its slots, built in the worker's slice of reply_stage (reused after a quiet).
  class Replies {
   public:
    Replies(Impl& m, const detail::HandleState& h, const CombineArgs& a, int worker);
    const std::uint16_t* of(std::int64_t r);

   private:
    Impl& m_;
    const detail::HandleState& h_;
    const CombineArgs& a_;
    const std::uint16_t* y_;
    std::uint16_t* stage_;
    std::int64_t staged_ = 0;
    std::vector<const std::uint16_t*> slot_rows_;
    std::vector<float> slot_weights_;
  };
  static constexpr std::int64_t kReplyStageRows = 32;  // per worker, in reply_stage
  /// Where this rank's y lies in its window if its peers can read it in place (sent in the
  /// combine header), else -1: the zero-copy recv_x, or rows inside the output pool (a
  /// one-copy recv_x the experts overwrote in place).
  std::int64_t y_offset_in_window(const detail::HandleState& h, const CombineArgs& a);
  /// The hierarchical schedule's node-first combine, serial relays, compact layout, a
  /// payload moved and every rank of my server mapped (peer_window; on shmem only when every
  /// rank is: across machines the relays still copy, BENCHMARKS.md): my server's relays may
  /// sum its ranks' replies reading their y in place (when each says in its header that y
  /// lies in its window; paths/combine_relay.cpp).
  bool relay_sums_in_place(const detail::HandleState& h) const;
  /// Combine's [S, H] bf16 output: from the pool, or (modelling transport) a view of the replies.
  Tensor combined_output(std::int64_t S);
  /// docs/spec.md §4's sums per token into `out` (combined_output's [S, H]): from my reply area
  /// (push), or (`pull`: the headers, with each peer's y_offset) from the peers' windows.
  void reduce(const detail::HandleState& h, const CombineArgs& a, const Peers* pull, Tensor& out);
  /// The sums of tokens [t0, t1) into o: the row answering entry e (token t at rank d) is
  /// rows_of[d] + (first_row[d] + entry_position[e]) rows — or, expanded and kSlots
  /// (pulled), its slots' rows rows_of[d] + slot_row, or (kSelections) its selections' rows
  /// rows_of[d] + selection_row(t, k), summed as the expert rank would have (docs/spec.md §4's
  /// grouped sum). `pulls`: count the rows as pulled.
  /// Where reduce_tokens finds a token's terms: one reply per (token, rank) entry; the
  /// slots' rows of an expanded y (pulled); one reply per selection (t, k) at
  /// Geometry::selection_row (CombineReplies::kSelections). The last two are grouped per
  /// rank and summed as the expert rank would have (docs/spec.md §4).
  enum class TermRows { kEntries, kSlots, kSelections };
  void reduce_tokens(const detail::HandleState& h, const CombineArgs& a, std::int64_t t0, std::int64_t t1,
                     const std::vector<const std::uint16_t*>& rows_of, const std::vector<std::int64_t>& first_row,
                     std::uint16_t* o, WorkerStats* pulls, TermRows at = TermRows::kEntries) const;
  /// One plan entry's group of a grouped sum (kSlots, kSelections): its slots' rows in
  /// ascending k (`rows`: where they lie) and their weights, appended.
  void add_group(const detail::HandleState& h, TermRows at, std::int64_t t, std::size_t e, const std::uint16_t* rows,
                 const float* topk_w, std::vector<const std::uint16_t*>& terms, std::vector<float>& weights) const;
  /// Fresh expanded dispatch with per-selection replies: each slot's destination rank into
  /// h.slot_dest (what the combine groups by).
  void keep_slot_dests(detail::HandleState& h, const DispatchArgs& a) const;
  /// Whether this handle's combine replies per selection (expanded, CombineReplies::kSelections).
  bool selection_replies(const detail::HandleState& h) const noexcept {
    return h.layout == RecvLayout::kExpanded && config.dataplane.combine_replies == CombineReplies::kSelections;
  }

  /// Runs `task` on every worker (the rank thread is worker 0) and joins them; a modelling
  /// transport hears of the join (sim::ModelTransport::workers_joined). Every fork goes through here.
  void run_workers(const std::function<void(int)>& task) {
    const bool stream = stream_stores;
    pool.run([&](int w) {
      const StreamScope scope(stream);  // the call's store kind, on every worker's thread
      task(w);
    });
    if (model) model->workers_joined();
  }
  /// Whether this call's stores stream (CallContext::stream_stores), by the payload it writes.
  void choose_stores(std::uint64_t payload_bytes) noexcept {
    stream_stores = payload_bytes >= config.dataplane.stream_min_call_bytes;
  }

  detail::CallState calls;  // what the previous calls freed, views out, the last handle (call_state.hpp)
  detail::WorkerPool pool;
  detail::TensorPool outputs;  // every tensor a call returns but one-copy outputs
  detail::HandleRecycler handles;  // fresh handles, their receive arrays recycled
  detail::BlockPool blocks;    // the window's output pool (Geometry's region kOutputs)
  // (The Setup base: what the Buffer fixed when built; the CallContext base: epoch, stats,
  // waits and staging of the call in progress.)
};

}  // namespace epx
