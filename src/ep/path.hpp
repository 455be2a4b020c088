// The data paths' seam: one small interface for how a dispatch's rows and a combine's
// replies travel. A call picks its path once, from the support table (spi::dispatch_path /
// spi::combine_path), and runs front → path.send → path.receive → back without knowing
// which path it is. Each path is one unit in src/ep/paths/, read top to bottom, with its
// row of the table (spi::PathRule) beside it; a PathUnit joins the two and add_path
// registers it (paths/units.cpp: the built-in ones; tests/recipes: one from outside):
//   dispatch_direct.cpp   direct (rows at their planned slots) and its rows-first variant
//   dispatch_relay.cpp    hierarchical schedule: cross-server rows through a same-lane relay
//   dispatch_ring.cpp     bounded receive area: rows paced by credits, placed as they arrive
//   combine_push.cpp      push (replies into the sources' reply areas) and replies first
//   combine_pull.cpp      pull: sources read the experts' rows in place
//   combine_relay.cpp     push through the relays (they forward other servers' replies)
//   combine_ring.cpp      bounded reply area: rounds of replies paced by credits
// A unit sees its Buffer only through PathContext (path_context.hpp): the Setup (read only),
// the call in progress, and the shared services by name (Sender in channels.cpp, the
// completion protocols' units behind it and await_rows, protocol.hpp; put_segment /
// fill_meta; send_replies / reduce). Receive_meta and the epilogue stay with the call.
// Granularity: one virtual call per step of a call, never per row.
#pragma once

#include <cstdint>
#include <vector>

#include "engine.hpp"
#include "path_context.hpp"

namespace epx::detail {

using Impl = Buffer::Impl;
using Peers = Buffer::Impl::Peers;

/// One dispatch as its path sees it (DispatchCall fills it; fields after the exchange are
/// null before it).
struct DispatchStep {
  const HandleState* h = nullptr;
  const DispatchArgs* a = nullptr;
  bool fresh = false;
  std::size_t row_bytes = 0, scale_bytes = 0;  // per row of x / of its FP8 scales (0: bf16)
  /// After the exchange (fresh): each of my experts' first row at every receiver; null: cached.
  const std::vector<std::int32_t>* expert_base = nullptr;
  const std::vector<Landing>* landing = nullptr;  // after the exchange: where each destination's rows land
  DispatchResult* out = nullptr;                  // after the exchange: the outputs (final shapes)
  /// Fresh dispatch: receive may call it with each source whose rows have landed (their
  /// metadata is read then, while other sources are still sending); null: none.
  const Impl::SourceLanded* landed = nullptr;
};

class DispatchPath {
 public:
  virtual ~DispatchPath() = default;
  /// The rows travel before the header exchange, which completes them (rows first): send
  /// runs before the exchange (the step has no expert_base, landing or out yet).
  virtual bool rows_before_exchange() const noexcept { return false; }
  /// Where the received rows lie once receive is done (what receive_meta and the epilogue read).
  virtual RowsAt rows_at() const noexcept { return RowsAt::kSlots; }
  /// Fresh dispatch, before the exchange: counts this path adds to the header.
  virtual void add_counts(PathContext, HandleState&, std::vector<std::int32_t>&) const {}
  /// Fresh dispatch, after plan_slots: the path's own plan from the gathered counts.
  virtual void plan(PathContext, HandleState&, const Peers&) const {}
  /// This rank's rows to their destinations (and, for a path that needs it, the rows arriving here).
  virtual void send(PathContext, const DispatchStep&) const = 0;
  /// Until every row of this dispatch has landed here (rows first, ring: already).
  virtual void receive(PathContext, const DispatchStep&) const = 0;
  /// Fresh dispatch, after receive_meta: what the handle keeps for this path's combines.
  virtual void keep(PathContext, HandleState&) const {}
};

/// One combine as its path sees it.
struct CombineStep {
  const HandleState* h = nullptr;
  const CombineArgs* a = nullptr;
  const Peers* peers = nullptr;  // after the exchange
  Tensor* out = nullptr;         // after the exchange: combined_x [S, H]
};

class CombinePath {
 public:
  virtual ~CombinePath() = default;
  /// The replies travel before the header exchange, which completes them (replies first).
  virtual bool replies_before_exchange() const noexcept { return false; }
  /// The replies (or partials) of this rank's received rows to their sources.
  virtual void send(PathContext, const CombineStep&) const = 0;
  /// Until every reply to this rank has landed, then docs/spec.md §4's sums into out.
  virtual void receive(PathContext, const CombineStep&) const = 0;
};

/// Combine's reply channels of this rank, fixed per Buffer (paths/combine_relay.cpp owns
/// them): the peers its workers visit, in order, and per peer the sources whose replies
/// travel to it. Flat: every peer in the schedule's visiting order, carrying its own
/// replies. Hierarchical: my server's ranks only, each also carrying the replies to the
/// other servers' sources it relays for; `members` = my server's ranks by lane, `servers`
/// the servers (1 when flat).
struct ReplyChannels {
  std::vector<int> order;
  std::vector<std::vector<int>> sources;  // [P]
  std::vector<int> members;
  int servers = 1;
};
ReplyChannels reply_channels(const Topology& topology, int rank, int P, const std::vector<int>& visit_order,
                             bool hierarchical);

/// A path as the engine knows it: its row of the support table and its two sides (a side
/// may be another path's: a dispatch-only path keeps the base path's combine; null: none,
/// as `rule.dispatch` says). Each path's file defines its own and units.cpp registers it.
struct PathUnit {
  const spi::PathRule& rule;
  const DispatchPath* dispatch;
  const CombinePath* combine;
};

/// Registers a path (its unit must outlive the registration): its row joins spi::kPaths,
/// base_path asks its base_of before every path registered earlier, and dispatch_unit /
/// combine_unit name its sides. Refuses (kInvalidArgument) a Path value or key already
/// registered and a row whose `dispatch` disagrees with the sides. Register before building
/// the Buffers that should take it and remove after destroying them: the table is read by
/// every call, without a lock.
void add_path(const PathUnit& unit);
void remove_path(spi::Path p);

/// A path registered for a scope (a test's, or a library's that loads it).
class RegisteredPath {
 public:
  explicit RegisteredPath(const PathUnit& unit) : path_(unit.rule.path) { add_path(unit); }
  ~RegisteredPath() { remove_path(path_); }
  RegisteredPath(const RegisteredPath&) = delete;
  RegisteredPath& operator=(const RegisteredPath&) = delete;

 private:
  spi::Path path_;
};

/// The sides of a registered path; a path the table names for dispatch or combine.
const DispatchPath& dispatch_unit(spi::Path p);
const CombinePath& combine_unit(spi::Path p);

/// The built-in paths, each defined in its own file beside its row (paths/units.cpp
/// registers them), and the combine sides the dispatch files pair with their own.
const PathUnit& direct_path();      // dispatch_direct.cpp (+ push_combine)
const PathUnit& rows_first_path();  // dispatch_direct.cpp (+ replies_first_combine)
const PathUnit& relay_path();       // dispatch_relay.cpp (+ relay_combine)
const PathUnit& ring_path();        // dispatch_ring.cpp (+ ring_combine)
const PathUnit& pull_path();        // combine_pull.cpp (combine only)
const CombinePath& push_combine();           // combine_push.cpp
const CombinePath& replies_first_combine();  // combine_push.cpp
const CombinePath& relay_combine();          // combine_relay.cpp
const CombinePath& ring_combine();           // combine_ring.cpp

}  // namespace epx::detail
