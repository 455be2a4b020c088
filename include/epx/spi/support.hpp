// epx/spi/support.hpp — the one table of what the engine supports: data path x completion
// protocol x transport guarantee x output layout. The Buffer consults it at construction
// (refuse_config), per dispatch (refuse_output) and once per call for the path the call
// takes (dispatch_path / combine_path, from allows: whether a call may take the rows-first or
// pull path); the conformance and path unit tests enumerate it instead of re-deriving it.
// Adding a path or a protocol = a row here, its unit in src/ep/paths (path.hpp), and its
// tests (docs/engine.md: "Add a data path", "Add a completion protocol").
#pragma once

#include <string>

#include "epx/buffer.hpp"
#include "epx/config.hpp"
#include "epx/transport.hpp"

namespace epx::spi {

/// How rows travel. A Buffer has one base path (direct, relay or ring, from its config);
/// rows first and pull are per-call variants of the direct path.
enum class Path {
  kDirect,    ///< every sender puts its rows at their planned slots (docs/engine.md)
  kRelay,     ///< hierarchical schedule: cross-server rows go through a same-lane relay
  kRing,      ///< bounded receive area (ring_rows): rows paced by credits
  kRowsFirst, ///< a call right after one of the other kind puts before the header exchange
  kPull,      ///< combine reads the experts' rows in place (mapped peers, zero-copy y)
};
inline constexpr int kNumPaths = 5;

struct PathRule {
  Path path;
  const char* name;
  bool protocols[3];     ///< indexed by Protocol: explicit, tail, flag
  const char* why_not;   ///< why the refused protocols do not fit
  bool views;            ///< recv_in_window (zero-copy output) possible
  bool expanded;         ///< the expanded layout possible
  bool variant_of_direct;///< a per-call variant, only where the base path is direct
  bool needs_peer_window;///< needs Transport::peer_window (mapped peers)
  /// Why dispatch rows on this path cannot land in the receiver's output block (one copy;
  /// BufferConfig::output_pool_bytes), or nullptr if they can.
  const char* why_copy;
  /// Usable while the Buffer has an output pool (rows first is not: its rows go before the
  /// header exchange that names the receiver's block).
  bool with_pool;
  const char* key;       ///< short name (CallStats::path, test names)
  bool dispatch;         ///< a dispatch path (pull is combine only)
};

struct ProtocolRule {
  Protocol protocol;
  const char* name;
  bool TransportCaps::*needs;  ///< the guarantee it relies on (nullptr: none)
  const char* needs_text;      ///< ... in words, for the refusal
  bool views;                  ///< zero-copy output possible
  const char* why_no_views;
  const char* why_copy;        ///< why rows cannot land in the receiver's output block (nullptr: they can)
};

inline constexpr PathRule kPaths[kNumPaths] = {
    {Path::kDirect, "direct", {true, true, true}, "", true, true, false, false, nullptr, true, "direct", true},
    {Path::kRelay, "schedule 'hierarchical'", {true, true, false},
     "relays forward a source's rows when its signal arrives (use explicit or tail)", true, true, false, false, nullptr, true, "relay", true},
    {Path::kRing, "ring_rows (bounded receive area)", {true, true, false},
     "ring counts travel as signals (use explicit or tail)", false, true, false, false, "ring_rows", true, "ring", true},
    {Path::kRowsFirst, "rows first", {true, true, false}, "flagged rows complete themselves, not by the exchange", true, true,
     true, false, "rows first", false, "rows_first", true},
    {Path::kPull, "pull", {true, true, false}, "flagged rows are not where y lies", true, true, true, true, "pull", true, "pull", false},
};

inline constexpr ProtocolRule kProtocols[3] = {
    {Protocol::kExplicit, "explicit", nullptr, "", true, "", nullptr},
    {Protocol::kTail, "tail", &TransportCaps::ordered_signal_per_queue,
     "signals ordered after earlier puts on their queue", true, "", nullptr},
    {Protocol::kFlag, "flag", &TransportCaps::flagged_puts,
     "flagged puts (a block's flag visible only after its bytes)", false,
     "recv_in_window needs rows stored contiguously, but the flag protocol delivers 512-byte blocks", "flag protocol"},
};

inline const PathRule& rule(Path p) noexcept { return kPaths[static_cast<int>(p)]; }
inline const ProtocolRule& rule(Protocol p) noexcept { return kProtocols[static_cast<int>(p)]; }

/// The base path of a config: ring, relay or direct (ring and relay together are refused).
inline Path base_path(const BufferConfig& c) noexcept {
  if (c.ring_rows > 0) return Path::kRing;
  if (c.dataplane.schedule.kind == ScheduleKind::kHierarchical) return Path::kRelay;
  return Path::kDirect;
}

/// Why a Buffer with this config cannot run on a transport with these caps ("" if it can).
inline std::string refuse_config(const BufferConfig& c, const TransportCaps& caps) {
  if (c.ring_rows > 0 && c.dataplane.schedule.kind == ScheduleKind::kHierarchical)
    return "ring_rows (bounded receive area) does not combine with the hierarchical schedule";
  if (c.dataplane.combine_order == CombineOrder::kNodeFirst && base_path(c) != Path::kRelay)
    return "combine order 'node-first' sums a token's partials at the relays of the hierarchical schedule, but the schedule is '" +
           to_string(c.dataplane.schedule) + "'";
  if (c.dataplane.combine_replies == CombineReplies::kSelections && base_path(c) != Path::kDirect)
    return std::string("combine replies 'selections' go straight to their sources, but this buffer's combine goes through ") +
           rule(base_path(c)).name;
  if (c.dataplane.combine_replies == CombineReplies::kSelections && c.dataplane.protocol == Protocol::kFlag)
    return "combine replies 'selections' land at (token, k) rows, which the flag protocol's blocks do not address (use explicit or tail)";
  const Protocol p = c.dataplane.protocol;
  const PathRule& path = rule(base_path(c));
  const ProtocolRule& proto = rule(p);
  if (!path.protocols[static_cast<int>(p)])
    return std::string(path.name) + " with protocol '" + proto.name + "' is not supported: " + path.why_not;
  if (proto.needs != nullptr && !(caps.*proto.needs))
    return std::string("protocol '") + proto.name + "' relies on " + proto.needs_text + ", which transport '" + caps.name +
           "' does not guarantee";
  return {};
}

/// Why a dispatch output of this layout (and as a view of the window or not) is refused on a
/// Buffer of this config ("" if it is fine); `invalid` tells an invalid argument (the layout
/// cannot be a view at all) from an unsupported combination.
inline std::string refuse_output(const BufferConfig& c, RecvLayout layout, bool in_window, bool& invalid) {
  invalid = false;
  if (!in_window) return {};
  if (layout != RecvLayout::kCompact) {
    invalid = true;
    return "recv_in_window needs the compact layout";
  }
  const PathRule& path = rule(base_path(c));
  if (!path.views)
    return std::string("recv_in_window needs a slot for every row, but this buffer has a bounded receive area (ring_rows = ") +
           std::to_string(c.ring_rows) + ")";
  const ProtocolRule& proto = rule(c.dataplane.protocol);
  if (!proto.views) return proto.why_no_views;
  return {};
}

/// Whether a per-call variant (rows first, pull) exists for this config at all; the call
/// still needs its own conditions (docs/engine.md: the previous call, views, the handle).
inline bool allows(Path variant, const BufferConfig& c, bool peer_window = false) noexcept {
  const PathRule& v = rule(variant);
  if (v.variant_of_direct && base_path(c) != Path::kDirect) return false;
  if (!v.with_pool && c.output_pool_bytes != 0) return false;
  if (v.needs_peer_window && !peer_window) return false;
  return v.protocols[static_cast<int>(c.dataplane.protocol)];
}

/// Whether a combine may push its replies before the header exchange (replies first) at all:
/// the rows-first row's rule, except that the output pool does not matter — replies land in
/// the sources' reply areas, never in an output block. The call still needs its own
/// conditions (CallState: right after the dispatch of its handle, no views) and, with a
/// pool, a small enough call (DataPlaneOptions::replies_first_max_bytes).
inline bool allows_replies_first(const BufferConfig& c) noexcept {
  return base_path(c) == Path::kDirect && rule(Path::kRowsFirst).protocols[static_cast<int>(c.dataplane.protocol)];
}

/// The path one dispatch takes (named once per call): rows first when the call state chose
/// it (`rows_first`: the previous call was a combine that freed every receive area and no
/// rank holds a view; CallState::begin_dispatch) and the table allows it, else the base path.
inline Path dispatch_path(const BufferConfig& c, bool rows_first) noexcept {
  return rows_first && allows(Path::kRowsFirst, c) ? Path::kRowsFirst : base_path(c);
}

/// The path one combine takes (named once per call): replies first when the call state chose
/// it (CallState::begin_combine; known before the exchange), pull when every rank's y lies
/// in its window (`all_y_in_window`, from the headers; each rank offers it only where
/// allows(kPull) holds), else the base path (direct = push, relay, ring).
inline Path combine_path(const BufferConfig& c, bool replies_first, bool all_y_in_window) noexcept {
  if (replies_first && allows_replies_first(c)) return Path::kRowsFirst;
  if (!replies_first && all_y_in_window && allows(Path::kPull, c, true)) return Path::kPull;
  return base_path(c);
}

/// Why a dispatch output of this layout on a Buffer of this config is a copy out of the
/// receive area rather than a block of the output pool the senders put into ("" = one copy
/// possible; the pool may still be exhausted at the call). A static string
/// (CallStats::output_why).
inline const char* why_copy(const BufferConfig& c, RecvLayout layout) noexcept {
  if (c.output_pool_bytes == 0) return "output pool off";
  if (const char* why = rule(base_path(c)).why_copy) return why;
  if (const char* why = rule(c.dataplane.protocol).why_copy) return why;
  // A relay forwards a compact row into the block as a direct sender would (the same slot);
  // an expanded row would go once per slot, at rows only the relayed record's metadata names.
  if (base_path(c) == Path::kRelay && layout == RecvLayout::kExpanded) return "hierarchical schedule, expanded layout";
  return "";  // both layouts land in output blocks (an expanded one takes a row per slot)
}

}  // namespace epx::spi
