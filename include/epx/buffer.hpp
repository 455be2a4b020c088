// epx/buffer.hpp — the EP buffer: dispatch and combine (docs/spec.md §3, §4).
//
//   epx::EPBuffer buffer(transport, {.num_experts = 256, .hidden = 7168, .num_topk = 8,
//                                    .max_tokens_per_rank = 4096});        // collective
//   auto d = buffer.dispatch({.x = x, .topk_idx = idx, .topk_weights = w}); // collective
//   ... experts compute y from d.recv_x ...
//   auto c = buffer.combine({.y = y, .handle = &d.handle});                // collective
//
// Names: epx::EPBuffer (built from an epx::EPConfig) is the EP buffer, as Python's
// epx.EPBuffer and DeepEP V2.5's EPBuffer; epx::Buffer and epx::BufferConfig are the same
// types under their first names, kept so that existing code builds unchanged. Every buffer
// kind is built the same way, `Kind(Transport&, KindConfig)` (EPBuffer/EPConfig,
// BucketBuffer/BucketConfig, PPBuffer/PPConfig, EngramBuffer/EngramConfig), with the
// lifecycle of epx/buffer_base.hpp; docs/cpp.md, "Names", lists every name and its aliases.
//
// Collective calls must be made by every rank of the group, in the same order. A bad
// input on any rank makes the call throw epx::Error on every rank, naming the rank at
// fault (Error::origin_rank()) — the same code, origin and message on every rank: the
// lowest failing rank's, or, when every rank failed the same check, that check with
// origin -1 and a message beginning "every rank: "; a peer that dies or stops answering makes every other
// rank throw within the transport's timeout. A Buffer is used by one thread at a time;
// while an asynchronous call is pending, any other dispatch or combine on it throws
// epx::Error (kInvalidArgument, naming the pending call) on that rank without entering the
// collective.
//
// Asynchronous calls (DeepEP's async_with_compute_stream / defer_epilogue):
//   epx::PendingDispatch p = buffer.dispatch_async(args);  // returns once the puts are handed to epx's threads
//   ... the caller computes (e.g. the shared expert); p.outputs() has the final shapes ...
//   epx::DispatchResult d = p.finish();                     // the rows have landed: d.recv_x holds them
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "epx/buffer_base.hpp"
#include "epx/config.hpp"
#include "epx/error.hpp"
#include "epx/plan.hpp"
#include "epx/stats.hpp"
#include "epx/tensor.hpp"
#include "epx/transport.hpp"

namespace epx {

enum class RecvLayout {
  kCompact,   ///< docs/spec.md §3.1: one row per (source rank, token), ordered (s, t)
  kExpanded,  ///< docs/spec.md §3.2: one row per (s, t, k), grouped by local expert, aligned
};

namespace detail {
struct HandleState;
class AsyncCall;
}

/// The routing plan of one dispatch and everything combine needs: returned by dispatch,
/// passed back to combine or to a cached dispatch. Cheap to copy (shared, immutable).
/// Valid only with the Buffer that made it.
class DispatchHandle {
 public:
  DispatchHandle() = default;
  bool valid() const noexcept { return state_ != nullptr; }
  /// Rows of the dispatch output on this rank (N, or W with num_worst_tokens).
  std::int64_t num_recv_rows() const noexcept;

 private:
  friend class Buffer;
  std::shared_ptr<const detail::HandleState> state_;
};

struct DispatchArgs {
  /// [S, H] bf16, or [S, H] fp8_e4m3 with `x_scales`.
  TensorView x;
  /// [S, H/128] float32 when x is fp8 (docs/spec.md §1), else empty.
  TensorView x_scales;
  /// [S, K] int64 in [-1, E), no expert twice per token. Not used with a handle.
  TensorView topk_idx;
  /// [S, K] float32. Not used with a handle.
  TensorView topk_weights;
  RecvLayout layout = RecvLayout::kCompact;
  int expert_alignment = 1;          ///< A >= 1 (expanded rows per expert rounded up to A)
  std::int64_t num_worst_tokens = 0; ///< W > 0: exactly W output rows (docs/spec.md §3.3)
  /// docs/spec.md §3.2: expanded rows sorted by (s, t) inside each expert. epx places rows by
  /// prefix sums, never by arrival order, so its order is always this one: false permits
  /// any order and gets the sorted one at no cost (kept for DeepEP-style callers).
  bool deterministic = false;
  /// docs/spec.md §3.2/§3.3: padding rows of recv_x (and recv_x_scales) are all-zero bits — the
  /// default, so that an expert run over its whole aligned group (a grouped GEMM) reads no
  /// leftover NaN. false saves one memset of the padding rows (at most L x (A - 1) rows in
  /// the expanded layout, W - N with num_worst_tokens), leaving their bytes unspecified (a
  /// recycled block keeps old bytes). recv_src, weights and recv_topk_idx of padding rows
  /// are always -1 / 0. A cached dispatch pads whenever its handle's dispatch did.
  bool zero_padding = true;
  /// Compact layout only: recv_x and recv_x_scales are views of this Buffer's receive
  /// area, where the senders put the rows (one copy, as the default output pool's blocks,
  /// but no block is held). They stay valid only until the next dispatch on this Buffer
  /// (combine leaves them alone) or its destruction.
  bool recv_in_window = false;
  /// Cached dispatch: reuse this handle's plan; x must have the handle's S and H.
  const DispatchHandle* handle = nullptr;
  /// Set: a problem the caller found in its own inputs (e.g. a language binding's dtype or
  /// stride check). The call enters the collective only to fail: every rank throws this
  /// error's code and message, naming this rank (the rules of Buffer's errors, below).
  const Error* caller_error = nullptr;
};

/// Every tensor is the caller's: valid and unchanged across any number of later calls on
/// the Buffer, until the caller destroys it (and every Tensor sharing its storage). A
/// one-copy recv_x lies in the transport's window: it may outlive the Buffer (its pool
/// block does no harm then) but not the Transport. Exception: recv_in_window views (below).
struct DispatchResult {
  /// [N, H] x's dtype. Compact layout, by default: a block of the Buffer's output pool
  /// (BufferConfig::output_pool_bytes) the senders put the rows into — one copy per row; it
  /// returns to the pool when the last Tensor over it (recv_x, recv_x_scales) is destroyed,
  /// from any thread. The expanded layout lands in a block too (a row per slot). A copy out
  /// of the receive area when the pool is off or has no room, with a ring, the flag
  /// protocol, or relays in the expanded layout (CallStats::output_why says which).
  Tensor recv_x;
  Tensor recv_x_scales;      ///< [N, H/128] float32 (fp8 only); in recv_x's block when recv_x is one copy
  Tensor recv_topk_idx;      ///< compact: [N, K] int64, local expert or -1
  Tensor recv_topk_weights;  ///< compact: [N, K] float32 (0 where idx is -1)
  Tensor recv_weights;       ///< expanded: [N] float32
  Tensor recv_src;           ///< [N, 2] (s, t) compact, [N, 3] (s, t, k) expanded; int64, -1 padding
  std::vector<std::int64_t> num_recv_tokens_per_expert;          ///< [L] unaligned
  std::vector<std::int64_t> num_recv_tokens_per_expert_aligned;  ///< [L] rounded up to A
  std::vector<std::int64_t> expert_offsets;  ///< expanded: [L + 1] o_0..o_L; compact: empty
  DispatchLayout layout;     ///< docs/spec.md §2 of this rank's input (fresh dispatch only)
  DispatchHandle handle;
};

struct CombineArgs {
  /// Rows of the handle's dispatch output on this rank ([N, H] bf16, padding ignored).
  /// Zero-copy combine: if y lies in this Buffer's window on every rank — the recv_x of a
  /// `recv_in_window` dispatch or a one-copy recv_x (a block of the output pool), the
  /// experts having written their output over it in place — and the transport maps peers'
  /// windows, nothing is put: each source reads its rows in place (docs/engine.md, pull
  /// mode). Combine returns only after every peer read this rank's rows, so y may be
  /// overwritten as soon as it returns. Any other y works as well (the rows are put).
  TensorView y;
  const DispatchHandle* handle = nullptr;
  TensorView bias0;  ///< optional [S, H] bf16
  TensorView bias1;  ///< optional [S, H] bf16
  bool weighted = false;  ///< expanded layout only: multiply each row by its routing weight
  /// As DispatchArgs::caller_error (the handle need not be valid then).
  const Error* caller_error = nullptr;
};

struct CombineResult {
  Tensor combined_x;    ///< [S, H] bf16
  Tensor topk_weights;  ///< [S, K] float32, the dispatch's weights unchanged
};

/// Where the back half of an asynchronous call (waiting for the peers' rows, the epilogue or
/// the reduction) runs. Either way its puts are issued on a thread of epx's (with the
/// Buffer's workers) while the caller goes on.
enum class Completion {
  kBackground,  ///< on epx's thread right after the puts: finish() only waits (DeepEP's async_with_compute_stream)
  kAtFinish,    ///< on the thread that calls finish() (DeepEP's defer_epilogue: "issue now, take the result later")
};

/// A dispatch in flight (Buffer::dispatch_async). Move-only; local (finish() is not a
/// collective step: every rank's call already is one). Until finish() returns, the Buffer
/// refuses every other dispatch or combine, and the call's inputs (x, x_scales, topk_idx,
/// topk_weights) must stay alive and unchanged.
class PendingDispatch {
 public:
  /// An empty one (valid() false): what a moved-from one is.
  PendingDispatch() noexcept;
  PendingDispatch(PendingDispatch&&) noexcept;
  PendingDispatch& operator=(PendingDispatch&&) noexcept;
  /// Finishes a call that was not finished (waits for it; its error, if any, is dropped).
  ~PendingDispatch();
  bool valid() const noexcept { return call_ != nullptr; }
  /// The outputs with their final shapes, counts, offsets, layout and handle, as soon as
  /// dispatch_async returns: the tensors share their bytes with finish()'s, whose values
  /// they hold only once finish() returned. The handle may be used only after finish().
  const DispatchResult& outputs() const noexcept { return outputs_; }
  /// finish() would not block (kBackground: the call has completed or failed; kAtFinish:
  /// its puts are done).
  bool ready() const noexcept;
  /// Waits up to `timeout` for ready(); true if it is (e.g. to check for signals between
  /// waits). A step epx's thread has not begun yet (a busy machine may not have run it) runs
  /// here first: each step runs once, on whichever thread comes first. finish() does the same.
  bool wait_for(std::chrono::milliseconds timeout);
  /// Waits for the call (kAtFinish: runs its back half here) and returns its result, or
  /// throws its epx::Error — every rank's finish() throws when the call failed after its
  /// header exchange (a peer that failed is named). Once; the Buffer accepts calls again.
  DispatchResult finish();

 private:
  friend class Buffer;
  std::shared_ptr<detail::AsyncCall> call_;
  DispatchResult outputs_;
};

/// A combine in flight (Buffer::combine_async): as PendingDispatch. The call's y and biases
/// must stay alive and unchanged until finish().
class PendingCombine {
 public:
  /// An empty one (valid() false), as PendingDispatch.
  PendingCombine() noexcept;
  PendingCombine(PendingCombine&&) noexcept;
  PendingCombine& operator=(PendingCombine&&) noexcept;
  ~PendingCombine();
  bool valid() const noexcept { return call_ != nullptr; }
  /// combined_x [S, H] and topk_weights [S, K] (the latter already final); combined_x's
  /// values only once finish() returned.
  const CombineResult& outputs() const noexcept { return outputs_; }
  bool ready() const noexcept;
  bool wait_for(std::chrono::milliseconds timeout);
  CombineResult finish();

 private:
  friend class Buffer;
  std::shared_ptr<detail::AsyncCall> call_;
  CombineResult outputs_;
};

/// The EP buffer (DeepEP's EPBuffer; spelled epx::EPBuffer, the alias below): a BufferBase of
/// kind "ep" (epx/buffer_base.hpp: its own endpoint of the transport, so other buffers may
/// share the group; destroy() collective and idempotent; every call after it throws
/// kInvalidArgument; window_bytes()).
class Buffer : public BufferBase {
 public:
  /// Collective: checks that every rank passes the same config (EPConfig; kInvalidArgument
  /// on every rank naming the first differing value and the rank) and allocates the
  /// symmetric window on its own endpoint of `transport`, which must outlive the Buffer
  /// (kCapacityExceeded when the window does not fit in memory).
  Buffer(Transport& transport, const BufferConfig& config);
  /// Calls destroy() if the caller did not (collective then; errors are swallowed).
  ~Buffer() override;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  /// Local: docs/spec.md §2 for `topk_idx` ([S, K] int64). Throws on invalid input.
  DispatchLayout get_dispatch_layout(const TensorView& topk_idx) const;

  /// Collective: docs/spec.md §3. Fresh when args.handle is null, cached otherwise.
  DispatchResult dispatch(const DispatchArgs& args);

  /// Collective: docs/spec.md §4 with the handle of a dispatch of this Buffer.
  CombineResult combine(const CombineArgs& args);

  /// Local: a bf16 [N, H] tensor for the experts to write combine's y into (N = the
  /// handle's output rows on this rank, compact or expanded), placed in this Buffer's window
  /// where it can be — its receive area, which a one-copy dispatch leaves unused — so that a
  /// combine given it as y reads the rows in place on every rank (pull mode, as with a y
  /// written over a one-copy recv_x): the way to a zero-copy combine after an FP8 dispatch,
  /// whose recv_x cannot hold bf16 rows. Valid (and in the window) until the next dispatch on
  /// this Buffer, which may land rows there; its bytes are unspecified until written. A
  /// tensor of its own (combine then puts the rows, as for any y) where the window cannot
  /// hold it: no mapped peers, a ring, relays, the flag protocol, more rows than the receive
  /// area, this rank's latest output a view of the receive area, or an asynchronous call in
  /// flight. Throws kInvalidArgument for a handle of another Buffer or rank.
  Tensor combine_buffer(const DispatchHandle& handle);

  /// Collective, asynchronous: the same call as dispatch(args) — the same result bit for
  /// bit, the same errors — in two halves. On the caller's thread: validation, plan, the
  /// header exchange (an input error throws here, on every rank) and the outputs' allocation
  /// with their final shapes; then the puts go to a thread of epx's and the call returns.
  /// The back half (waiting for the peers' rows, the epilogue) runs as `completion` says.
  /// A dispatch right after a combine that puts its rows before the header exchange ("rows
  /// first", docs/engine.md) has issued them by the time this returns.
  PendingDispatch dispatch_async(const DispatchArgs& args, Completion completion = Completion::kBackground);

  /// Collective, asynchronous: combine(args) in two halves, as dispatch_async. The handle
  /// must be a finished dispatch's.
  PendingCombine combine_async(const CombineArgs& args, Completion completion = Completion::kBackground);

  /// Where the time of the last dispatch or combine on this rank went (empty `workers`
  /// unless config().collect_stats). Local; not meaningful while an asynchronous call is
  /// pending (its back half writes it).
  const CallStats& last_stats() const noexcept;

  /// Always on: how long this rank waited for each peer's header and rows, per op, summed
  /// over its calls (epx/stats.hpp; what epx::Diagnose gathers). Shared: it may outlive the
  /// Buffer. Local.
  std::shared_ptr<const PeerWaits> peer_waits() const noexcept;

  /// The config the buffer was built with, as passed (auto values such as num_workers = 0
  /// stay as given). Local.
  const BufferConfig& config() const noexcept;

  /// The engine's state: an opaque type, defined only inside the library (src/ep), where
  /// the data-path units (src/ep/paths) work on it.
  struct Impl;

 private:
  void on_destroy() noexcept override;
  std::unique_ptr<Impl> impl_;
};

/// The EP buffer's documented name, the same type as epx::Buffer (static_assert'ed in
/// tests/multirank/names_test.cpp): `epx::EPBuffer ep(transport, epx::EPConfig{...})`.
using EPBuffer = Buffer;

}  // namespace epx
