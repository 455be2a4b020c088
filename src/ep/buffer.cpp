// Buffer: construction (the Setup, setup.cpp; then the window), input validation at the
// boundary, and the public entry points that run the phases in order.
#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <thread>

#include "engine.hpp"
#include "path.hpp"
#include "send_policy.hpp"
#include "epx/spi/support.hpp"
#include "epx/topology.hpp"

namespace epx {

using detail::HandleState;
using detail::MaybeStatus;
using detail::NotifyHeader;
using detail::Status;

std::int64_t DispatchHandle::num_recv_rows() const noexcept { return state_ ? state_->out_rows : 0; }

Buffer::Impl::Impl(Buffer& owner, const BufferConfig& c)
    : detail::Setup(owner.endpoint("create"), c,
                    [&owner](const std::vector<AgreedValue>& values, const std::string& problem) { owner.agree(values, problem); }),
      detail::CallContext(P),
      pool(W) {
  owner.allocate(geo.total_bytes(), geo.num_signals());
  blocks = detail::BlockPool(transport.window() + geo.region(detail::Region::kOutputs), geo.output_pool_bytes(), owner.endpoint_ref());
  if (auto* listener = dynamic_cast<spi::PayloadRegionListener*>(&transport))
    listener->set_payload_region(geo.payload_begin(), geo.total_bytes());
}

Status Buffer::Impl::make_status(ErrorCode code, const std::string& what) const {
  return Status{code, "rank " + std::to_string(rank) + ": " + what};
}

namespace {

// "x must be [S, 7168] bf16 or fp8_e4m3, got [4, 100] float32"
std::string got(const TensorView& v) { return v.shape.str() + " " + to_string(v.dtype); }

}  // namespace

// x (and x_scales): dtype, [S, H], S within the buffer's tokens, data, FP8's scale shape.
MaybeStatus Buffer::Impl::check_x(const DispatchArgs& a) const {
  const BufferConfig& c = config;
  const TensorView& x = a.x;
  if (x.dtype != DType::kBF16 && x.dtype != DType::kFP8E4M3)
    return make_status(ErrorCode::kDtypeMismatch, "x must be bf16 or fp8_e4m3, got " + got(x));
  if (x.shape.ndim != 2 || x.shape[1] != c.hidden)
    return make_status(ErrorCode::kShapeMismatch, "x must be [S, " + std::to_string(c.hidden) + "], got " + got(x));
  const std::int64_t S = x.shape[0];
  if (S > c.max_tokens_per_rank)
    return make_status(ErrorCode::kCapacityExceeded, "x has S = " + std::to_string(S) +
                                                        " tokens but num_max_tokens_per_rank is " +
                                                        std::to_string(c.max_tokens_per_rank));
  if (S > 0 && x.data == nullptr) return make_status(ErrorCode::kInvalidArgument, "x has no data");
  const bool fp8 = x.dtype == DType::kFP8E4M3;
  if (fp8) {
    if (c.hidden % 128 != 0)
      return make_status(ErrorCode::kShapeMismatch,
                         "FP8 x needs H % 128 == 0, but H = " + std::to_string(c.hidden));
    if (a.x_scales.dtype != DType::kF32 || !(a.x_scales.shape == Shape{S, c.hidden / 128}))
      return make_status(a.x_scales.dtype != DType::kF32 ? ErrorCode::kDtypeMismatch : ErrorCode::kShapeMismatch,
                         "x_scales must be [" + std::to_string(S) + ", " +
                                                        std::to_string(c.hidden / 128) + "] float32, got " +
                                                        got(a.x_scales));
  } else if (!a.x_scales.empty()) {
    return make_status(ErrorCode::kInvalidArgument, "x_scales given but x is bf16 (scales go with fp8_e4m3 x)");
  }
  return std::nullopt;
}

// A cached dispatch's handle: made by this buffer and rank, for S tokens and the same layout.
MaybeStatus Buffer::Impl::check_cached(const DispatchArgs& a) const {
  const HandleState* h = a.handle->state_.get();
  const std::int64_t S = a.x.shape[0];
  if (h == nullptr) return make_status(ErrorCode::kBadHandle, "cached dispatch with an empty handle");
  if (h->buffer_id != buffer_id || h->rank != rank)
    return make_status(ErrorCode::kBadHandle, "the handle was made by another buffer or rank");
  if (h->plan.shape.num_tokens != S)
    return make_status(ErrorCode::kShapeMismatch, "cached dispatch: x has S = " + std::to_string(S) +
                                                      " tokens but the handle's dispatch had " +
                                                      std::to_string(h->plan.shape.num_tokens));
  if (h->layout != a.layout || h->alignment != a.expert_alignment || h->worst != a.num_worst_tokens)
    return make_status(ErrorCode::kBadHandle,
                       "cached dispatch: layout, expert_alignment or num_worst_tokens differ from the handle's");
  return std::nullopt;
}

MaybeStatus Buffer::Impl::check_dispatch(const DispatchArgs& a) const {
  if (a.caller_error != nullptr) return Status{a.caller_error->code(), a.caller_error->what()};
  const BufferConfig& c = config;
  if (MaybeStatus bad = check_x(a)) return bad;
  const std::int64_t S = a.x.shape[0];
  if (a.expert_alignment < 1)
    return make_status(ErrorCode::kInvalidArgument,
                       "expert_alignment must be >= 1, got " + std::to_string(a.expert_alignment));
  bool invalid = false;
  if (std::string why = spi::refuse_output(config, a.layout, a.recv_in_window, invalid); !why.empty())
    return make_status(invalid ? ErrorCode::kInvalidArgument : ErrorCode::kUnsupported, why);
  if (a.recv_in_window && a.num_worst_tokens > geo.recv_rows())
    return make_status(ErrorCode::kCapacityExceeded,
                       "recv_in_window: num_worst_tokens = " + std::to_string(a.num_worst_tokens) +
                           " exceeds the receive area's " + std::to_string(geo.recv_rows()) + " rows");
  if (a.num_worst_tokens < 0)
    return make_status(ErrorCode::kInvalidArgument,
                       "num_worst_tokens must be >= 0, got " + std::to_string(a.num_worst_tokens));
  if (a.handle != nullptr) return check_cached(a);
  const Shape sk{S, c.num_topk};
  if (a.topk_idx.dtype != DType::kI64 || !(a.topk_idx.shape == sk))
    return make_status(a.topk_idx.dtype != DType::kI64 ? ErrorCode::kDtypeMismatch : ErrorCode::kShapeMismatch,
                       "topk_idx must be " + sk.str() + " int64, got " + got(a.topk_idx));
  if (a.topk_weights.dtype != DType::kF32 || !(a.topk_weights.shape == sk))
    return make_status(a.topk_weights.dtype != DType::kF32 ? ErrorCode::kDtypeMismatch : ErrorCode::kShapeMismatch,
                       "topk_weights must be " + sk.str() + " float32, got " + got(a.topk_weights));
  const RoutingShape shape{S, c.num_topk, c.num_experts, P};
  if (auto issue = check_topk_idx(a.topk_idx.as<std::int64_t>(), shape))
    return make_status(ErrorCode::kInvalidArgument, issue->message);
  return std::nullopt;
}

MaybeStatus Buffer::Impl::check_combine(const CombineArgs& a) const {
  if (a.caller_error != nullptr) return Status{a.caller_error->code(), a.caller_error->what()};
  if (a.handle == nullptr || !a.handle->valid())
    return make_status(ErrorCode::kBadHandle, "combine needs the handle of a dispatch (got an empty one)");
  const HandleState* h = a.handle->state_.get();
  if (h->buffer_id != buffer_id || h->rank != rank)
    return make_status(ErrorCode::kBadHandle, "the handle was made by another buffer or rank");
  const Shape rows{h->out_rows, config.hidden};
  if (a.y.dtype != DType::kBF16 || !(a.y.shape == rows))
    return make_status(a.y.dtype != DType::kBF16 ? ErrorCode::kDtypeMismatch : ErrorCode::kShapeMismatch,
                       "combine input y must have the dispatch output's rows: " + rows.str() + " bf16, got " + got(a.y));
  if (h->out_rows > 0 && a.y.data == nullptr) return make_status(ErrorCode::kInvalidArgument, "y has no data");
  const Shape st{h->plan.shape.num_tokens, config.hidden};
  for (const TensorView* b : {&a.bias0, &a.bias1})
    if (!b->empty() && (b->dtype != DType::kBF16 || !(b->shape == st)))
      return make_status(b->dtype != DType::kBF16 ? ErrorCode::kDtypeMismatch : ErrorCode::kShapeMismatch,
                         "bias must be " + st.str() + " bf16, got " + got(*b));
  if (a.weighted && h->layout != RecvLayout::kExpanded)
    return make_status(ErrorCode::kInvalidArgument,
                       "weighted combine needs the expanded layout (in the compact layout the expert applies its own weights)");
  return std::nullopt;
}

Buffer::Buffer(Transport& transport, const BufferConfig& config)
    : BufferBase(transport, "ep"), impl_(std::make_unique<Impl>(*this, config)) {}

Buffer::~Buffer() { on_destroy(); }

void Buffer::on_destroy() noexcept {
  // A pending asynchronous call: its thread finishes (or fails) before the window goes.
  if (impl_ == nullptr) return;
  if (detail::AsyncCall* pending = impl_->calls.pending()) pending->abandon();
}

const BufferConfig& Buffer::config() const noexcept { return impl_->config; }
const CallStats& Buffer::last_stats() const noexcept { return impl_->stats; }

DispatchLayout Buffer::get_dispatch_layout(const TensorView& topk_idx) const {
  require_alive("get_dispatch_layout");
  const Impl& m = *impl_;
  if (topk_idx.dtype != DType::kI64 || topk_idx.shape.ndim != 2 || topk_idx.shape[1] != m.config.num_topk)
    throw Error(ErrorCode::kShapeMismatch, "rank " + std::to_string(m.rank) + ": topk_idx must be [S, " +
                                               std::to_string(m.config.num_topk) + "] int64, got " + got(topk_idx),
                m.rank);
  const RoutingShape shape{topk_idx.shape[0], m.config.num_topk, m.config.num_experts, m.P};
  if (auto issue = check_topk_idx(topk_idx.as<std::int64_t>(), shape))
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(m.rank) + ": " + issue->message, m.rank);
  return make_dispatch_layout(build_routing_plan(topk_idx.as<std::int64_t>(), shape));
}

// One dispatch (docs/spec.md §3) in three steps. Every step runs the same phases in the same order
// whether the call is synchronous (dispatch: all three on the caller's thread) or not
// (dispatch_async: front on the caller's thread, puts — and back, with kBackground — on the
// call's thread): the same bits, the same errors. How the rows travel is the path's (picked
// once in front from the support table, path.hpp): front → path.send → path.receive → back.
struct Buffer::Impl::DispatchCall : detail::AsyncCall {
  Impl& m;
  DispatchArgs a;         // the caller's; a.handle points at `cached`
  DispatchHandle cached;  // the handle of a cached dispatch (copied: the caller's may go)
  bool fresh, fp8;
  const detail::DispatchPath* path = nullptr;
  detail::DispatchStep step;
  MaybeStatus status;
  // One copy: the output block this rank offers its senders (the header names it), and
  // where every destination's rows land (its output block if it offered one big enough).
  const char* why_copy = "";
  detail::BlockPool::Reservation block;
  std::vector<detail::Landing> landing;
  std::shared_ptr<HandleState> made;
  const HandleState* h = nullptr;
  std::vector<std::int32_t> counts, expert_base;
  Impl::Peers peers;
  DispatchResult& out;

  DispatchCall(Impl& impl, const DispatchArgs& args)
      : m(impl),
        a(args),
        cached(args.handle != nullptr ? *args.handle : DispatchHandle{}),
        fresh(args.handle == nullptr),
        fp8(args.x.dtype == DType::kFP8E4M3),
        out(result.emplace<DispatchResult>()) {
    if (!fresh) a.handle = &cached;
  }

  /// Validation, the path, plan, header exchange (rows first: after the rows), slots, outputs.
  void front() {
    ++m.epoch;
    m.begin_stats(false, !fresh);
    m.stats.pulled = false;
    std::optional<Impl::PhaseTimer> plan_timer(std::in_place, m, 0, Phase::kPlan);
    status = m.check_dispatch(a);
    choose_path();
    if (fresh) {
      make_handle();
      h = made.get();
    } else {
      h = status ? nullptr : a.handle->state_.get();
    }
    step.h = h;
    step.a = &a;
    step.fresh = fresh;
    if (!status) {
      step.row_bytes = static_cast<std::size_t>(m.config.hidden) * dtype_size(a.x.dtype);
      step.scale_bytes = fp8 ? static_cast<std::size_t>(m.config.hidden / 128) * sizeof(float) : 0;
      block = m.reserve_output(fresh ? nullptr : h, a, step.row_bytes, step.scale_bytes, why_copy);
    }
    // The rows this rank sends: a small dispatch writes them through the cache.
    m.choose_stores(status ? 0 : static_cast<std::uint64_t>(h->plan.num_entries()) * (step.row_bytes + step.scale_bytes));
    const NotifyHeader mine = my_header();
    plan_timer.reset();
    // Rows first: the rows go now and the exchange completes them (one synchronisation
    // instead of two); it still fails every rank on a bad input, a stale handle or a
    // fresh/cached mix, and ranks that disagree write only their own stretches.
    const bool early = path->rows_before_exchange();
    if (early && !status) path->send(m, step);
    {
      Impl::PhaseTimer timer(m, 0, early ? Phase::kWaitData : Phase::kNotify);
      peers = m.exchange_headers(status, mine, counts.empty() ? nullptr : counts.data(),
                                 early ? (fresh ? "dispatch data" : "cached dispatch data")
                                       : (fresh ? "dispatch notify" : "cached dispatch notify"));
    }
    after_exchange();
    step.landing = &landing;
    step.out = &out;
  }

  void choose_path() {
    // The path, once: rows first when the previous call (a combine) freed every receive area
    // and no rank holds a view of it, where the table allows it (docs/engine.md), else the
    // Buffer's base path.
    const bool rows_first = m.calls.begin_dispatch(m.rows_first_allowed() && m.geo.has_stretches(), a.recv_in_window);
    const spi::Path kind = spi::dispatch_path(m.config, rows_first);
    path = &detail::dispatch_unit(kind);
    m.stats.data_first = path->rows_before_exchange();
    m.stats.path = spi::rule(kind).key;
  }

  /// A fresh call's handle: its routing plan and the counts the header carries.
  void make_handle() {
    made = m.handles.make();
    made->buffer_id = m.buffer_id;
    made->dispatch_epoch = m.epoch;
    made->rank = m.rank;
    made->layout = a.layout;
    made->alignment = a.expert_alignment;
    made->worst = a.num_worst_tokens;
    made->zero_padding = a.zero_padding;
    if (!status) {
      build_routing_plan(a.topk_idx.as<std::int64_t>(), RoutingShape{a.x.shape[0], m.config.num_topk, m.config.num_experts, m.P},
                         made->plan);  // into the recycled arrays (HandleRecycler)
      m.keep_slot_dests(*made, a);
      counts.reserve(static_cast<std::size_t>(m.num_counts()));
      for (int d = 0; d < m.P; ++d) counts.push_back(made->plan.tokens_to(d));
      counts.insert(counts.end(), made->plan.slots_per_expert.begin(), made->plan.slots_per_expert.end());
      path->add_counts(m, *made, counts);
    }
  }

  NotifyHeader my_header() const {
    NotifyHeader mine{};
    mine.out_block = static_cast<std::int64_t>(block.offset());
    mine.out_block_bytes = static_cast<std::int64_t>(block.bytes());
    mine.handle_epoch = fresh || h == nullptr ? 0 : h->dispatch_epoch;
    mine.dtype = static_cast<std::int32_t>(a.x.dtype);
    mine.expanded = a.layout == RecvLayout::kExpanded;
    mine.alignment = a.expert_alignment;
    mine.worst = a.num_worst_tokens;
    mine.has_counts = fresh;
    mine.recv_view = a.recv_in_window;
    return mine;
  }

  /// Slots (fresh), landings and the outputs, from every peer's header.
  void after_exchange() {
    // Every peer sent this header after its last combine had read its reply area.
    m.calls.dispatch_exchanged(!m.none_holds_a_view(peers), h->dispatch_epoch);
    if (fresh) {
      Impl::PhaseTimer timer(m, 0, Phase::kPlan);
      m.plan_slots(*made, peers);
      path->plan(m, *made, peers);
      expert_base = m.expert_row_base(peers);
      m.plan_expanded_slots(*made, a, expert_base);  // expanded receivers: where each of my slots lands
      step.expert_base = &expert_base;
    }
    landing = m.landings(*h, peers, step.row_bytes, step.scale_bytes);
    const detail::Landing& mine_at = landing[static_cast<std::size_t>(m.rank)];
    if (!mine_at.block && *why_copy == '\0') why_copy = "output pool exhausted";  // (a view reports none)
    out = m.make_outputs(*h, a, fp8, mine_at.block ? &mine_at : nullptr, &block);
    if (fresh) {
      out.layout = make_dispatch_layout(made->plan);
      out.handle.state_ = made;
    } else {
      out.handle = cached;
    }
  }

  /// The rows to their slots (rows first: already sent).
  void puts() override {
    if (!path->rows_before_exchange()) path->send(m, step);
  }

  /// Until every row has landed, the received metadata into the handle, the epilogue.
  void back() override {
    const Impl::Peers* rows_first = path->rows_at() == detail::RowsAt::kStretches ? &peers : nullptr;
    std::vector<char> read(static_cast<std::size_t>(fresh ? m.P : 0), 0);  // sources whose metadata is in the handle
    const Impl::SourceLanded landed = [&](int s) {
      m.receive_meta(*made, s, rows_first);
      read[static_cast<std::size_t>(s)] = 1;
    };
    if (fresh) {
      m.size_received(*made);
      made->topk_weights = Tensor(DType::kF32, a.topk_weights.shape);
      if (made->topk_weights.nbytes() > 0)  // S = 0 may come with a null pointer
        std::memcpy(made->topk_weights.data(), a.topk_weights.data, made->topk_weights.nbytes());
      step.landed = &landed;
    }
    path->receive(m, step);
    for (int s = 0; fresh && s < m.P; ++s)
      if (!read[static_cast<std::size_t>(s)]) landed(s);
    if (fresh) path->keep(m, *made);
    const bool in_block = landing[static_cast<std::size_t>(m.rank)].block;
    m.epilogue(*h, a, fp8, out, path->rows_at(), in_block);
    // A receiver with no output rows copies nothing either way.
    m.stats.output = m.payload.recv_view(a.recv_in_window) ? OutputKind::kView
                     : in_block || h->out_rows == 0       ? OutputKind::kOneCopy
                                                          : OutputKind::kCopy;
    m.stats.output_why = m.stats.output == OutputKind::kCopy ? why_copy : "";
    m.end_stats();
  }
};

// One combine (docs/spec.md §4) in three steps, as DispatchCall; the path is picked once — before
// the exchange when the replies go first (the call state knows it then), else after it
// (pull needs every rank's header).
struct Buffer::Impl::CombineCall : detail::AsyncCall {
  Impl& m;
  CombineArgs a;           // the caller's; a.handle points at `handle`
  DispatchHandle handle;   // copied: the caller's may go
  const detail::CombinePath* path = nullptr;
  detail::CombineStep step;
  Impl::Peers peers;
  CombineResult& out;

  CombineCall(Impl& impl, const CombineArgs& args)
      : m(impl), a(args), handle(args.handle != nullptr ? *args.handle : DispatchHandle{}), out(result.emplace<CombineResult>()) {
    if (a.handle != nullptr) a.handle = &handle;
  }

  void pick(spi::Path kind) {
    path = &detail::combine_unit(kind);
    m.stats.data_first = path->replies_before_exchange();
    m.stats.pulled = kind == spi::Path::kPull;  // reported even without collect_stats
    m.stats.path = spi::rule(kind).key;
  }

  /// Validation, header exchange (replies first: after the replies), the path, outputs.
  void front() {
    ++m.epoch;
    m.begin_stats(true, false);
    // Right after a dispatch without window views, with the handle it used, the replies
    // go first, as the rows of a rows-first dispatch do: that dispatch's exchange freed every
    // reply area, and with no view nobody can pull, so every rank pushes and the exchange
    // after the replies completes them. A rank with a bad input or another handle exchanges
    // first and sends nothing (so no two ranks' plans write the same reply rows); the
    // exchange fails every rank.
    const MaybeStatus status = m.check_combine(a);
    // The replies this rank may push (a pull writes none): a small combine writes them through the cache.
    m.choose_stores(status ? 0 : static_cast<std::uint64_t>(a.handle->state_->num_recv()) * m.config.hidden * sizeof(std::uint16_t));
    const bool replies_first = m.calls.begin_combine(!status && m.replies_first_allowed(*a.handle->state_),
                                                     status ? 0 : a.handle->state_->dispatch_epoch);
    NotifyHeader mine{};
    mine.handle_epoch = status ? 0 : a.handle->state_->dispatch_epoch;
    mine.y_offset = status ? -1 : m.y_offset_in_window(*a.handle->state_, a);
    mine.y_in_window = mine.y_offset >= 0;
    mine.tokens = status ? 0 : a.handle->state_->plan.shape.num_tokens;
    mine.recv_view = m.calls.holds_view();
    step.a = &a;
    if (replies_first) {
      step.h = a.handle->state_.get();
      pick(spi::combine_path(m.config, true, false));
      path->send(m, step);
      Impl::PhaseTimer timer(m, 0, Phase::kWaitData);
      peers = m.exchange_headers(status, mine, nullptr, "combine data");
    } else {
      {
        Impl::PhaseTimer timer(m, 0, Phase::kNotify);
        peers = m.exchange_headers(status, mine, nullptr, "combine notify");
      }
      // Pull only when every rank's rows can be read in place (each decides for its own y).
      pick(spi::combine_path(m.config, false, std::all_of(peers.header.begin(), peers.header.end(),
                                                          [](const NotifyHeader* p) { return p->y_in_window != 0; })));
    }
    // Every peer is in this combine, so done with its last dispatch's receive area: free for
    // the next dispatch's rows unless some rank still holds a view of it.
    m.calls.combine_exchanged(!m.none_holds_a_view(peers));
    const HandleState* h = a.handle->state_.get();
    out.combined_x = m.combined_output(h->plan.shape.num_tokens);
    out.topk_weights = m.outputs.make(DType::kF32, h->topk_weights.shape());
    std::memcpy(out.topk_weights.data(), h->topk_weights.data(), h->topk_weights.nbytes());
    step.h = h;
    step.peers = &peers;
    step.out = &out.combined_x;
  }

  /// The replies to their sources (replies first: already sent).
  void puts() override {
    if (!path->replies_before_exchange()) path->send(m, step);
  }

  /// Until every reply has landed, the ordered reduction.
  void back() override {
    path->receive(m, step);
    m.end_stats();
  }
};

namespace {
template <class Result>
Result aliases(const Result& r);
template <>
DispatchResult aliases(const DispatchResult& r) {
  DispatchResult o;
  o.recv_x = r.recv_x.alias();
  o.recv_x_scales = r.recv_x_scales.alias();
  o.recv_topk_idx = r.recv_topk_idx.alias();
  o.recv_topk_weights = r.recv_topk_weights.alias();
  o.recv_weights = r.recv_weights.alias();
  o.recv_src = r.recv_src.alias();
  o.num_recv_tokens_per_expert = r.num_recv_tokens_per_expert;
  o.num_recv_tokens_per_expert_aligned = r.num_recv_tokens_per_expert_aligned;
  o.expert_offsets = r.expert_offsets;
  o.layout.num_tokens_per_rank = r.layout.num_tokens_per_rank;
  o.layout.num_tokens_per_expert = r.layout.num_tokens_per_expert;
  o.layout.is_token_in_rank = r.layout.is_token_in_rank.alias();
  o.handle = r.handle;
  return o;
}
template <>
CombineResult aliases(const CombineResult& r) {
  CombineResult o;
  o.combined_x = r.combined_x.alias();
  o.topk_weights = r.topk_weights.alias();
  return o;
}
}  // namespace

DispatchResult Buffer::dispatch(const DispatchArgs& a) {
  require_alive("dispatch");
  impl_->calls.refuse_while_pending("dispatch", impl_->rank);
  Impl::DispatchCall call(*impl_, a);
  call.front();
  call.puts();
  call.back();
  return std::move(call.out);
}

CombineResult Buffer::combine(const CombineArgs& a) {
  require_alive("combine");
  impl_->calls.refuse_while_pending("combine", impl_->rank);
  Impl::CombineCall call(*impl_, a);
  call.front();
  call.puts();
  call.back();
  return std::move(call.out);
}

Tensor Buffer::combine_buffer(const DispatchHandle& handle) {
  Impl& m = *impl_;
  const HandleState* h = handle.state_.get();
  if (h == nullptr || h->buffer_id != m.buffer_id || h->rank != m.rank)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(m.rank) + ": combine_buffer needs a handle of a dispatch of this Buffer on this rank", m.rank);
  const Shape shape{h->out_rows, static_cast<std::int64_t>(m.config.hidden)};
  // In the receive area (what pull reads as y_offset = the data region) only where pull is
  // possible, the area holds the rows and nobody else may be using it.
  const bool in_window = m.payload.reads_in_place() && spi::allows(spi::Path::kPull, m.config, m.transport.peer_window(m.rank) != nullptr) &&
                         h->out_rows <= m.geo.recv_rows() && !m.calls.holds_view() && !m.calls.pending();
  if (!in_window) return m.outputs.make(DType::kBF16, shape);
  std::byte* data = m.transport.window() + m.geo.region(detail::Region::kData);
  return Tensor::adopt(std::shared_ptr<std::byte>(std::shared_ptr<void>(), data), DType::kBF16, shape);
}

PendingDispatch Buffer::dispatch_async(const DispatchArgs& a, Completion completion) {
  require_alive("dispatch");
  impl_->calls.refuse_while_pending("dispatch", impl_->rank);
  auto call = std::make_shared<Impl::DispatchCall>(*impl_, a);
  call->front();
  PendingDispatch p;
  p.outputs_ = aliases(call->out);
  call->start(impl_->calls, "dispatch (call " + std::to_string(impl_->epoch) + ")", completion);
  p.call_ = std::move(call);
  return p;
}

PendingCombine Buffer::combine_async(const CombineArgs& a, Completion completion) {
  require_alive("combine");
  impl_->calls.refuse_while_pending("combine", impl_->rank);
  auto call = std::make_shared<Impl::CombineCall>(*impl_, a);
  call->front();
  PendingCombine p;
  p.outputs_ = aliases(call->out);
  call->start(impl_->calls, "combine (call " + std::to_string(impl_->epoch) + ")", completion);
  p.call_ = std::move(call);
  return p;
}

// The pending calls: finish() once, the destructor finishes an unfinished one.
PendingDispatch::PendingDispatch() noexcept = default;
PendingDispatch::PendingDispatch(PendingDispatch&&) noexcept = default;
PendingDispatch& PendingDispatch::operator=(PendingDispatch&& o) noexcept {
  PendingDispatch old(std::move(*this));  // finishes the call this one held
  call_ = std::move(o.call_);
  outputs_ = std::move(o.outputs_);
  return *this;
}
PendingDispatch::~PendingDispatch() {
  if (call_ && !call_->finished()) try {
      call_->finish();
    } catch (...) {  // dropped: nobody asked for the result
    }
}
bool PendingDispatch::ready() const noexcept { return call_ && call_->ready(); }
bool PendingDispatch::wait_for(std::chrono::milliseconds timeout) { return call_ && call_->wait_for(timeout); }
DispatchResult PendingDispatch::finish() {
  if (!call_) throw Error(ErrorCode::kInvalidArgument, "finish(): an empty PendingDispatch");
  call_->finish();
  return std::move(std::get<DispatchResult>(call_->result));
}

PendingCombine::PendingCombine() noexcept = default;
PendingCombine::PendingCombine(PendingCombine&&) noexcept = default;
PendingCombine& PendingCombine::operator=(PendingCombine&& o) noexcept {
  PendingCombine old(std::move(*this));  // finishes the call this one held
  call_ = std::move(o.call_);
  outputs_ = std::move(o.outputs_);
  return *this;
}
PendingCombine::~PendingCombine() {
  if (call_ && !call_->finished()) try {
      call_->finish();
    } catch (...) {  // dropped: nobody asked for the result
    }
}
bool PendingCombine::ready() const noexcept { return call_ && call_->ready(); }
bool PendingCombine::wait_for(std::chrono::milliseconds timeout) { return call_ && call_->wait_for(timeout); }
CombineResult PendingCombine::finish() {
  if (!call_) throw Error(ErrorCode::kInvalidArgument, "finish(): an empty PendingCombine");
  call_->finish();
  return std::move(std::get<CombineResult>(call_->result));
}

}  // namespace epx
