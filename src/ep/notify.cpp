// Control plane: every call makes one all-to-all of headers (status, and for a fresh
// dispatch the counts), so a bad input anywhere fails every rank, and a rank's header for
// call n+1 also tells its peers it is done with call n (their writes into its window are
// safe from then on). It comes first, before any data moves — or, rows first (a call right
// after one of the other kind, docs/engine.md), after the data, which it then completes.
// From the gathered counts each rank computes, with prefix sums, the slot of every row it
// sends and receives.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine.hpp"
#include "epx/spi/agreement.hpp"

namespace epx {

using detail::HandleState;
using detail::NotifyHeader;

namespace {

/// A failed header's words without its "rank s: " prefix.
std::string check_words(const NotifyHeader& h, int s) {
  const std::string m = h.message, prefix = "rank " + std::to_string(s) + ": ";
  return m.compare(0, prefix.size(), prefix) == 0 ? m.substr(prefix.size()) : m;
}

/// The error of a call some rank failed, the same on every rank (all see the same headers),
/// by the one agreement rule (epx/spi/agreement.hpp).
void throw_if_failed(const std::vector<const NotifyHeader*>& headers, int me) {
  std::vector<std::optional<CallProblem>> all(headers.size());
  for (std::size_t s = 0; s < headers.size(); ++s)
    if (headers[s]->failed != 0)
      all[s] = CallProblem{static_cast<ErrorCode>(headers[s]->failed - 1), check_words(*headers[s], static_cast<int>(s))};
  spi::throw_agreed_error("", all, me);
}

// What every rank's header must agree on beyond the failure flags: the handle of the same
// dispatch and the rows' dtype (the same error on every rank: they read the same headers).
void check_same_call(const std::vector<const NotifyHeader*>& header) {
  const int P = static_cast<int>(header.size());
  // Every rank must pass the handle of the same dispatch; a rank with an older one than
  // the newest in use holds a stale handle and is the rank at fault.
  std::uint64_t newest = 0;
  for (const NotifyHeader* hs : header) newest = std::max(newest, hs->handle_epoch);
  for (int s = 0; s < P; ++s) {
    const NotifyHeader& hs = *header[static_cast<std::size_t>(s)];
    if (hs.handle_epoch != newest)
      throw Error(ErrorCode::kBadHandle,
                  "rank " + std::to_string(s) + ": passes a stale handle (of collective call #" +
                      std::to_string(hs.handle_epoch) + ") while other ranks pass the handle of call #" +
                      std::to_string(newest) + "; every rank must pass the handle of the same dispatch",
                  s);
  }
  const NotifyHeader& h0 = *header[0];
  for (int s = 1; s < P; ++s) {
    const NotifyHeader& hs = *header[static_cast<std::size_t>(s)];
    if (hs.dtype != h0.dtype)
      throw Error(ErrorCode::kDtypeMismatch,
                  "rank " + std::to_string(s) + ": dispatches " + to_string(static_cast<DType>(hs.dtype)) +
                      " rows but rank 0 dispatches " + to_string(static_cast<DType>(h0.dtype)),
                  s);
  }
}

}  // namespace

Buffer::Impl::Peers Buffer::Impl::exchange_headers(const detail::MaybeStatus& status, const NotifyHeader& in,
                                                   const std::int32_t* counts, const char* phase) {
  NotifyHeader mine = in;
  mine.epoch = epoch;
  mine.failed = status ? static_cast<std::int32_t>(status->code) + 1 : 0;
  mine.origin_rank = status ? rank : -1;
  if (status) std::snprintf(mine.message, sizeof mine.message, "%s", status->message.c_str());
  mine.has_counts = mine.has_counts && counts != nullptr;
  // Held since my last header: the rest of my last call, and this call's quiets so far
  // (rows first: the rows' quiet came before this exchange).
  laps_announced = 0;
  for (std::uint64_t lap : call_laps) laps_announced += lap;
  mine.held_ns = held_ns + laps_announced;

  const auto n_counts = static_cast<std::size_t>(num_counts());
  // Every header first, one quiet, then the signals: one completion wait per call, not one
  // round trip per peer (what a transport with real completion latency would pay).
  const std::size_t off = geo.header(epoch, rank);
  for (int i = 0; i < P; ++i) {
    const int p = (rank + i) % P;
    transport.put(p, off, &mine, sizeof mine, 0);
    if (mine.has_counts) transport.put(p, off + sizeof mine, counts, n_counts * sizeof(std::int32_t), 0);
  }
  transport.quiet(0);
  for (int i = 0; i < P; ++i) transport.signal((rank + i) % P, geo.header_signal(rank), epoch, 0);
  Peers peers;
  peers.header.resize(static_cast<std::size_t>(P));
  WaitClock::time_point since = WaitClock::now();
  for (int i = 0; i < P; ++i) {
    const int s = wait_source(i);
    transport.wait_signal(geo.header_signal(s), epoch, {phase, s});
    since = lap_wait(0, s, since);
    peers.header[static_cast<std::size_t>(s)] =
        reinterpret_cast<const NotifyHeader*>(transport.window() + geo.header(epoch, s));
    if (config.record_waits) call_held[static_cast<std::size_t>(s)] = peers.header[static_cast<std::size_t>(s)]->held_ns;
  }
  // Every rank sees the same headers, so every rank throws the same error.
  throw_if_failed(peers.header, rank);
  check_same_call(peers.header);
  return peers;
}

bool Buffer::Impl::none_holds_a_view(const Peers& peers) {
  return std::none_of(peers.header.begin(), peers.header.end(), [](const NotifyHeader* p) { return p->recv_view != 0; });
}

namespace {
std::int64_t align_rows(std::int64_t n, std::int64_t a) { return (n + a - 1) / a * a; }
}  // namespace

void Buffer::Impl::plan_slots(HandleState& h, const Peers& peers) {
  auto tokens = [&](int s, int d) -> std::int64_t { return peers.counts(s)[d]; };
  auto slots = [&](int s, int e) -> std::int64_t { return peers.counts(s)[P + e]; };

  // Every rank checks every receiver's needs, so all fail together naming the same rank.
  h.out_rows_at.assign(static_cast<std::size_t>(P), 0);
  for (int d = 0; d < P; ++d) {
    const NotifyHeader& hd = *peers.header[static_cast<std::size_t>(d)];
    std::int64_t compact = 0;
    for (int s = 0; s < P; ++s) compact += tokens(s, d);
    if (compact > geo.recv_rows())
      throw Error(ErrorCode::kCapacityExceeded,
                  "rank " + std::to_string(d) + ": would receive " + std::to_string(compact) +
                      " rows but its receive area holds " + std::to_string(geo.recv_rows()) +
                      " (raise max_recv_rows)",
                  d);
    std::int64_t needed = compact;
    if (hd.expanded) {
      needed = 0;
      for (int j = 0; j < L; ++j) {
        std::int64_t n = 0;
        for (int s = 0; s < P; ++s) n += slots(s, d * L + j);
        needed += align_rows(n, hd.alignment);
      }
    }
    if (hd.worst > 0 && needed > hd.worst)
      throw Error(ErrorCode::kCapacityExceeded,
                  "rank " + std::to_string(d) + ": needs " + std::to_string(needed) +
                      " output rows but num_worst_tokens is " + std::to_string(hd.worst),
                  d);
    h.out_rows_at[static_cast<std::size_t>(d)] = hd.worst > 0 ? hd.worst : needed;
  }

  h.send_base.assign(static_cast<std::size_t>(P), 0);
  h.reply_base.assign(static_cast<std::size_t>(P), 0);
  h.recv_begin.assign(static_cast<std::size_t>(P) + 1, 0);
  for (int d = 0; d < P; ++d)
    for (int s = 0; s < rank; ++s) h.send_base[static_cast<std::size_t>(d)] += tokens(s, d);
  for (int s = 0; s < P; ++s) {
    for (int d = 0; d < rank; ++d) h.reply_base[static_cast<std::size_t>(s)] += tokens(s, d);
    h.recv_begin[static_cast<std::size_t>(s) + 1] = h.recv_begin[static_cast<std::size_t>(s)] + tokens(s, rank);
  }
  h.expert_count.assign(static_cast<std::size_t>(L), 0);
  h.expert_offset.assign(static_cast<std::size_t>(L) + 1, 0);
  for (int j = 0; j < L; ++j) {
    for (int s = 0; s < P; ++s) h.expert_count[static_cast<std::size_t>(j)] += slots(s, rank * L + j);
    h.expert_offset[static_cast<std::size_t>(j) + 1] =
        h.expert_offset[static_cast<std::size_t>(j)] + align_rows(h.expert_count[static_cast<std::size_t>(j)], h.alignment);
  }
  if (h.layout == RecvLayout::kExpanded)
    h.out_rows = h.expert_offset.back();
  else
    h.out_rows = h.num_recv();
  if (h.worst > 0) h.out_rows = h.worst;
}

detail::BlockPool::Reservation Buffer::Impl::reserve_output(const HandleState* cached, const DispatchArgs& a,
                                                            std::size_t row_bytes, std::size_t scale_bytes, const char*& why) {
  why = "";
  if (a.recv_in_window) return {};  // a view: the rows land in the receive area
  // (A model-only simulator has no pool unless one was sized explicitly: "output pool off".)
  why = spi::why_copy(config, a.layout);
  if (*why != '\0') return {};
  const std::int64_t rows = cached ? cached->out_rows : std::max(max_output_rows(a), a.num_worst_tokens);
  const std::size_t need = detail::Geometry::output_block_bytes(rows, row_bytes, scale_bytes);
  detail::BlockPool::Reservation block = blocks.reserve(need);
  if (cached && block.bytes() < need) {
    why = "output pool exhausted";
    return {};
  }
  return block;
}

std::int64_t Buffer::Impl::max_output_rows(const DispatchArgs& a) const {
  if (a.layout == RecvLayout::kCompact) return geo.recv_rows();
  // Expanded: every received row once per local slot (at most min(K, L)), each expert's
  // rows rounded up to the alignment.
  return geo.recv_rows() * std::min(config.num_topk, L) + static_cast<std::int64_t>(L) * (a.expert_alignment - 1);
}

std::vector<detail::Landing> Buffer::Impl::landings(const HandleState& h, const Peers& peers, std::size_t row_bytes,
                                                    std::size_t scale_bytes) const {
  std::vector<detail::Landing> at(static_cast<std::size_t>(P), geo.receive_area());
  for (int d = 0; d < P; ++d) {
    const NotifyHeader& hd = *peers.header[static_cast<std::size_t>(d)];
    const std::int64_t rows = h.out_rows_at[static_cast<std::size_t>(d)];
    const std::size_t need = detail::Geometry::output_block_bytes(rows, row_bytes, scale_bytes);
    if (hd.out_block_bytes > 0 && need > 0 && static_cast<std::size_t>(hd.out_block_bytes) >= need) {
      at[static_cast<std::size_t>(d)] = geo.output_block(static_cast<std::size_t>(hd.out_block), rows, row_bytes);
      at[static_cast<std::size_t>(d)].expanded = hd.expanded != 0;
    }
  }
  return at;
}

std::vector<std::int32_t> Buffer::Impl::expert_row_base(const Peers& peers) const {
  // For receiver d and its local expert j: the expanded row where my first slot for that
  // expert goes = o_j (d's aligned offsets) + slots of lower source ranks for expert j.
  std::vector<std::int32_t> base(static_cast<std::size_t>(P) * static_cast<std::size_t>(L), -1);
  for (int d = 0; d < P; ++d) {
    const NotifyHeader& hd = *peers.header[static_cast<std::size_t>(d)];
    if (!hd.expanded) continue;
    std::int64_t offset = 0;
    for (int j = 0; j < L; ++j) {
      const int e = d * L + j;
      std::int64_t before = 0, total = 0;
      for (int s = 0; s < P; ++s) {
        const std::int64_t n = peers.counts(s)[P + e];
        if (s < rank) before += n;
        total += n;
      }
      base[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(offset + before);
      offset += align_rows(total, hd.alignment);
    }
  }
  return base;
}

}  // namespace epx
