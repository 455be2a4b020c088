// Combine: each expert rank reduces the rows of one source token that it holds into one
// partial (expanded: in ascending k, float32 from 0.0f, rounded to bf16; compact: the row
// itself) and puts it back into the source's window at the slot the dispatch plan gave
// that (token, destination) pair. The source adds bias0, bias1 and the partials in the
// fixed order of docs/spec.md §4 in float32 and rounds once (reduce_row.hpp).
// These are the combine paths' building blocks (the paths: path.hpp, paths/combine_*.cpp):
// the replies' puts along the reply channels (send_replies), the partial sums (Replies),
// where y lies for pull (y_offset_in_window), the ordered reduction (reduce, reduce_tokens).
#include <algorithm>
#include <cstring>
#include <functional>

#include "engine.hpp"
#include "epx/spi/copy.hpp"
#include "reduce_row.hpp"

namespace epx {

using detail::HandleState;
using detail::Region;
using detail::reduce_row;
using detail::RowTerms;
using detail::split_range;

Buffer::Impl::Replies::Replies(Impl& m, const HandleState& h, const CombineArgs& a, int worker)
    : m_(m),
      h_(h),
      a_(a),
      y_(a.y.as<std::uint16_t>()),
      // No stage at all where this combine needs none (reply_stage empty): never offset a null pointer.
      stage_(m.reply_stage.empty() ? nullptr
                                   : m.reply_stage.data() + static_cast<std::size_t>(worker * kReplyStageRows * m.config.hidden)),
      slot_rows_(static_cast<std::size_t>(m.config.num_topk)),
      slot_weights_(static_cast<std::size_t>(m.config.num_topk)) {}

const std::uint16_t* Buffer::Impl::Replies::of(std::int64_t r) {
  const int K = m_.config.num_topk;
  const auto H = static_cast<std::size_t>(m_.config.hidden);
  if (h_.layout == RecvLayout::kCompact) return y_ + static_cast<std::size_t>(r) * H;
  const std::int32_t* rows = h_.recv_slot_row.data() + r * K;
  const float* wts = h_.recv_slot_weight.data() + r * K;
  int slots = 0;
  for (int k = 0; k < K; ++k) {
    if (rows[k] < 0) continue;
    slot_rows_[static_cast<std::size_t>(slots)] = y_ + static_cast<std::size_t>(rows[k]) * H;
    slot_weights_[static_cast<std::size_t>(slots++)] = wts[k];
  }
  if (slots == 1 && !a_.weighted) return slot_rows_[0];  // passes through unchanged
  if (staged_ == kReplyStageRows) {  // the staged rows may still be in flight
    for (int q = 0; q < m_.config.dataplane.queues; ++q) m_.transport.quiet(q);
    staged_ = 0;
  }
  std::uint16_t* out = stage_ + static_cast<std::size_t>(staged_++) * H;
  m_.payload.values([&] { reduce_row(out, RowTerms{nullptr, slot_rows_.data(), a_.weighted ? slot_weights_.data() : nullptr, slots}, H); });
  return out;
}

namespace {

// Per-selection replies (CombineReplies::kSelections): the replies of received row r, one
// per slot it holds (else one: the row or its partial).
std::int64_t replies_of(const HandleState& h, std::int64_t r, int K, bool selections) {
  if (!selections) return 1;
  const std::int32_t* rows = h.recv_slot_row.data() + r * K;
  return std::count_if(rows, rows + K, [](std::int32_t row) { return row >= 0; });
}

// Per-selection replies of my received rows [first, end) from source s: each slot's y row as
// it is, at s's row for the selection (t, k) (Geometry::selection_row).
void put_selections(Buffer::Impl& m, Buffer::Impl::Sender& send, const HandleState& h, const std::uint16_t* y, int s,
                    std::int64_t first, std::int64_t end) {
  const int K = m.config.num_topk;
  const std::size_t H = static_cast<std::size_t>(m.config.hidden), row_bytes = H * sizeof(std::uint16_t);
  for (std::int64_t r = first; r < end; ++r)
    for (int k = 0; k < K; ++k)
      if (const std::int32_t row = h.recv_slot_row[static_cast<std::size_t>(r * K + k)]; row >= 0)
        send.put_rows(s, Region::kReplies, m.geo.selection_row(h.recv_token[static_cast<std::size_t>(r)], k),
                      y + static_cast<std::size_t>(row) * H, 1, row_bytes);
}

}  // namespace

std::pair<std::int64_t, std::int64_t> Buffer::Impl::reply_slice(const HandleState& h, int s, int w) const {
  // Every worker takes a slice of every source and visits the peers in the schedule's order;
  // splitting the sources among the workers instead would aim all workers' first puts at a
  // few ranks (incast), undoing the rotation.
  const std::int64_t b = h.recv_begin[static_cast<std::size_t>(s)];
  const auto [i0, i1] = split_range(h.recv_begin[static_cast<std::size_t>(s) + 1] - b, w, W);
  return {b + i0, b + i1};
}

void Buffer::Impl::reserve_reply_stage(const HandleState& h) {
  if (h.layout == RecvLayout::kExpanded && !selection_replies(h))
    reply_stage.resize(static_cast<std::size_t>(W * kReplyStageRows) * static_cast<std::size_t>(config.hidden));
}

std::vector<std::uint64_t> Buffer::Impl::reply_channel_bytes(const HandleState& h, int w, bool relayed) const {
  const std::size_t row_bytes = static_cast<std::size_t>(config.hidden) * sizeof(std::uint16_t);
  const bool selections = selection_replies(h);
  std::vector<std::uint64_t> bytes(static_cast<std::size_t>(P));
  for (int peer : reply_order)
    each_reply_source(h, peer, w, relayed, [&](int, std::int64_t first, std::int64_t end) {
      for (std::int64_t r = first; r < end; ++r)
        bytes[static_cast<std::size_t>(peer)] += static_cast<std::uint64_t>(replies_of(h, r, config.num_topk, selections)) * row_bytes;
    });
  return bytes;
}

void Buffer::Impl::put_replies(Sender& send, Replies& replies, const HandleState& h, const CombineArgs& a, int peer, int s,
                               std::int64_t first, std::int64_t end) {
  const std::size_t H = static_cast<std::size_t>(config.hidden), row_bytes = H * sizeof(std::uint16_t);
  const auto* y = a.y.as<std::uint16_t>();
  if (first >= end) return;
  if (s != peer) {  // relayed: one row at a time to my lane's place of its row in the relay's area
    const int my_lane = topology.ranks[static_cast<std::size_t>(rank)].lane;
    for (std::int64_t r = first; r < end; ++r)
      send.put_rows(peer, Region::kRelayReplies, geo.relay_reply_row(h.recv_relay_row[static_cast<std::size_t>(r)], my_lane),
                    replies.of(r), 1, row_bytes);
    return;
  }
  if (selection_replies(h)) return put_selections(*this, send, h, y, s, first, end);  // every slot's y row, to its (t, k) row
  const std::int64_t dst_row = geo.reply_row(h, s, first);
  if (h.layout != RecvLayout::kExpanded)  // compact: y's rows from s are contiguous and so are their slots at s
    return send.put_rows(s, Region::kReplies, dst_row, y + static_cast<std::size_t>(first) * H, end - first, row_bytes);
  for (std::int64_t r = first; r < end; ++r) send.put_rows(s, Region::kReplies, dst_row + (r - first), replies.of(r), 1, row_bytes);
}

void Buffer::Impl::send_replies(const HandleState& h, const CombineArgs& a, bool signal, bool relayed) {
  reserve_reply_stage(h);
  // Hierarchical: a reply to another server's source goes to the relay (reply_sources lists,
  // per channel peer, whose replies travel to it), unless the relay reads it in place.
  run_workers([&](int w) {
    PhaseTimer timer(*this, w, Phase::kPutIssue);
    Sender send(*this, w, signal ? geo.combine_signal(rank, w) : Sender::kNoSignal, reply_channel_bytes(h, w, relayed), reply_order);
    Replies replies(*this, h, a, w);
    for (int peer : reply_order) {
      each_reply_source(h, peer, w, relayed, [&](int s, std::int64_t first, std::int64_t end) {
        put_replies(send, replies, h, a, peer, s, first, end);
      });
      send.end_channel(peer);
    }
    send.finish();
  });
}

bool Buffer::Impl::relay_sums_in_place(const HandleState& h) const {
  return payload.reads_in_place() && spi::base_path(config) == spi::Path::kRelay && config.dataplane.combine_order == CombineOrder::kNodeFirst &&
         relay_chunk_rows == 0 && h.layout == RecvLayout::kCompact &&
         std::all_of(server_members.begin(), server_members.end(), [&](int d) { return transport.peer_window(d) != nullptr; });
}

std::int64_t Buffer::Impl::y_offset_in_window(const HandleState& h, const CombineArgs& a) {
  // y must be the zero-copy recv_x (rows where the senders put them, at send_base + the
  // token's position) or rows inside the output pool (a one-copy recv_x, rows in the same
  // order, overwritten in place), on a transport that maps peers' windows: for pull, or for
  // my server's node-first relays.
  const bool pull = spi::allows(spi::Path::kPull, config, transport.peer_window(rank) != nullptr) &&
                    (h.layout == RecvLayout::kCompact || spi::rule(spi::Path::kPull).expanded);
  if (!pull && !relay_sums_in_place(h)) return -1;
  // Expanded: the sources read the slots' rows at the positions their handle kept.
  if (h.layout == RecvLayout::kExpanded && h.slot_begin.empty() && h.plan.num_entries() > 0) return -1;
  if (h.out_rows == 0) return static_cast<std::int64_t>(geo.region(Region::kData));  // no rows anyone reads
  if (a.y.data == nullptr) return -1;
  const auto* y = static_cast<const std::byte*>(a.y.data);
  const std::byte* window_base = transport.window();
  if (y == window_base + geo.region(Region::kData)) return static_cast<std::int64_t>(geo.region(Region::kData));
  const std::byte* pool = window_base + geo.region(Region::kOutputs);
  const std::size_t bytes = a.y.shape.numel() > 0 ? static_cast<std::size_t>(a.y.shape.numel()) * sizeof(std::uint16_t) : 0;
  if (std::less_equal<const std::byte*>()(pool, y) && std::less_equal<const std::byte*>()(y + bytes, pool + geo.output_pool_bytes()))
    return static_cast<std::int64_t>(y - window_base);
  return -1;
}

void Buffer::Impl::add_group(const HandleState& h, TermRows at, std::int64_t t, std::size_t e, const std::uint16_t* rows,
                             const float* topk_w, std::vector<const std::uint16_t*>& terms, std::vector<float>& weights) const {
  const RoutingPlan& plan = h.plan;
  const std::size_t H = static_cast<std::size_t>(config.hidden);
  const int K = config.num_topk;
  if (at == TermRows::kSelections) {  // ascending k, as the expert rank's partial
    for (int k = 0; k < K; ++k) {
      if (h.slot_dest[static_cast<std::size_t>(t * K + k)] != plan.entry_rank[e]) continue;
      terms.push_back(rows + static_cast<std::size_t>(geo.selection_row(t, k)) * H);
      weights.push_back(topk_w ? topk_w[t * K + k] : 0.0f);
    }
    return;
  }
  const auto seg = static_cast<std::size_t>(plan.segment_begin[static_cast<std::size_t>(plan.entry_rank[e])] + plan.entry_position[e]);
  for (std::int32_t j = h.slot_begin[seg]; j < h.slot_begin[seg + 1]; ++j) {
    terms.push_back(rows + static_cast<std::size_t>(h.slot_row[static_cast<std::size_t>(j)]) * H);
    weights.push_back(topk_w ? topk_w[t * K + h.slot_k[static_cast<std::size_t>(j)]] : 0.0f);
  }
}

void Buffer::Impl::reduce_tokens(const HandleState& h, const CombineArgs& a, std::int64_t t0, std::int64_t t1,
                                 const std::vector<const std::uint16_t*>& rows_of, const std::vector<std::int64_t>& first_row,
                                 std::uint16_t* o, WorkerStats* pulls, TermRows at) const {
  const RoutingPlan& plan = h.plan;
  const std::size_t H = static_cast<std::size_t>(config.hidden);
  const std::size_t row_bytes = H * sizeof(std::uint16_t);
  const auto* b0 = a.bias0.empty() ? nullptr : a.bias0.as<std::uint16_t>();
  const auto* b1 = a.bias1.empty() ? nullptr : a.bias1.as<std::uint16_t>();
  const bool by_max_slot = h.layout == RecvLayout::kExpanded;
  // Expanded, pulled (kSlots) or replied per selection (kSelections): no expert rank
  // computed the partials; each group is the token's slots at one rank, read at their rows
  // of its y (HandleState::slot_row) or at their selection rows of my reply area.
  const bool slots = by_max_slot && at != TermRows::kEntries;
  std::vector<std::pair<std::int32_t, std::int32_t>> order;  // (sort key, plan entry)
  std::vector<const std::uint16_t*> terms;                   // bias1 (or zeros), then the replies or slot rows
  std::vector<float> weights;                                // per term (grouped, weighted)
  std::vector<std::int32_t> group_end;
  const float* topk_w = a.weighted ? h.topk_weights.as<float>() : nullptr;
  const int lead = b0 || b1 ? 1 : 0;
  const bool stream = row_bytes >= stream_min_bytes();  // rows not read back here: streamed as bulk_copy would
  for (std::int64_t t = t0; t < t1; ++t) {
    const std::size_t off = static_cast<std::size_t>(t) * H;
    // Expanded: groups in ascending order of their largest k; compact: ascending rank.
    order.clear();
    for (std::int32_t i = plan.token_begin[static_cast<std::size_t>(t)]; i < plan.token_begin[static_cast<std::size_t>(t) + 1]; ++i)
      order.emplace_back(by_max_slot ? plan.entry_max_slot[static_cast<std::size_t>(i)] : plan.entry_rank[static_cast<std::size_t>(i)], i);
    if (by_max_slot) std::sort(order.begin(), order.end());
    // f32(bias0) + f32(bias1) first, a missing bias counting as 0: adding a row of +0.0
    // for a missing bias1 turns f32(bias0) = -0.0 into +0.0 exactly as "+ 0.0f" does. With
    // neither, the sum starts at +0.0f, to which +0.0 adds nothing: no lead row to read.
    terms.assign(lead, b1 ? b1 + off : zero_row.data());
    weights.assign(terms.size(), 0.0f);
    group_end.clear();
    for (const auto& [key, i] : order) {
      const auto e = static_cast<std::size_t>(i);
      const auto d = static_cast<std::size_t>(plan.entry_rank[e]);
      const std::size_t first_term = terms.size();
      if (!slots) {
        terms.push_back(rows_of[d] + static_cast<std::size_t>(first_row[d] + plan.entry_position[e]) * H);
      } else {
        add_group(h, at, t, e, rows_of[d], topk_w, terms, weights);
        group_end.push_back(static_cast<std::int32_t>(terms.size()));
      }
      if (pulls) (plan.entry_rank[e] == rank ? pulls->local_pulled_bytes : pulls->pulled_bytes) += row_bytes * (terms.size() - first_term);
    }
    RowTerms rt{b0 ? b0 + off : nullptr, terms.data(), nullptr, static_cast<int>(terms.size())};
    rt.stream = stream;
    if (slots) {
      rt.weights = topk_w ? weights.data() : nullptr;
      rt.group_end = group_end.data();
      rt.groups = static_cast<int>(group_end.size());
      rt.lead = lead;
    }
    reduce_row(o + off, rt, H);
  }
}

void Buffer::Impl::keep_slot_dests(HandleState& h, const DispatchArgs& a) const {
  h.slot_dest.clear();
  if (!selection_replies(h)) return;
  const std::int64_t* idx = a.topk_idx.as<std::int64_t>();
  h.slot_dest.resize(static_cast<std::size_t>(h.plan.shape.num_tokens) * static_cast<std::size_t>(config.num_topk));
  for (std::size_t i = 0; i < h.slot_dest.size(); ++i) h.slot_dest[i] = idx[i] >= 0 ? static_cast<std::int32_t>(idx[i] / L) : -1;
}

Tensor Buffer::Impl::combined_output(std::int64_t S) {
  const Shape shape{S, static_cast<std::int64_t>(config.hidden)};
  if (payload.computes_sums()) return outputs.make(DType::kBF16, shape);
  // A modelling transport: no values are added up, so the output is a view of the replies.
  return Tensor::adopt(std::shared_ptr<std::byte>(std::shared_ptr<void>(), transport.window() + geo.region(Region::kReplies)), DType::kBF16,
                       shape);
}

void Buffer::Impl::reduce(const HandleState& h, const CombineArgs& a, const Peers* pull, Tensor& out) {
  if (!payload.computes_sums()) return;
  const std::int64_t S = h.plan.shape.num_tokens;
  // Where the row answering entry e (token t at destination d) is: push, my reply area at
  // d's block; pull, d's receive area (its y in place) at my segment.
  std::vector<const std::uint16_t*> rows_of(static_cast<std::size_t>(P));
  std::vector<std::int64_t> first_row(static_cast<std::size_t>(P));
  for (int d = 0; d < P; ++d) {
    const auto du = static_cast<std::size_t>(d);
    rows_of[du] = reinterpret_cast<const std::uint16_t*>(
        pull ? transport.peer_window(d) + static_cast<std::size_t>(pull->header[du]->y_offset)
             : transport.window() + geo.region(Region::kReplies));
    first_row[du] = pull ? geo.send_row(h, d, 0, false) : geo.replied_row(h, d, 0);
  }
  const TermRows at = pull != nullptr ? TermRows::kSlots : selection_replies(h) ? TermRows::kSelections : TermRows::kEntries;
  run_workers([&](int w) {
    PhaseTimer timer(*this, w, Phase::kEpilogue);
    WorkerStats* pulls = pull != nullptr && config.collect_stats ? &stats.workers[static_cast<std::size_t>(w)] : nullptr;
    const auto [t0, t1] = split_range(S, w, W);
    reduce_tokens(h, a, t0, t1, rows_of, first_row, out.as<std::uint16_t>(), pulls, at);
  });
}

}  // namespace epx
