// epx/spi/support.hpp — what the engine supports: data path x completion protocol x transport
// guarantee x output layout. The Buffer consults it at construction (refuse_config), per
// dispatch (refuse_output) and once per call for the path the call takes (dispatch_path /
// combine_path, from allows: whether a call may take the rows-first or pull path); the
// conformance and path unit tests enumerate it instead of re-deriving it.
//
// The rows are not written here: each path's unit declares its PathRule in its own file
// (src/ep/paths/), each completion protocol's unit its ProtocolRule (src/ep/protocols/), and
// registers it with the unit (paths/units.cpp, protocols/units.cpp). kPaths and kProtocols
// are the registered rows, in Path / Protocol order: the table as the units state it. A path
// or protocol written outside the library registers the same way, at run time (its unit and
// its row together: docs/engine.md, "Add a data path", "Add a completion protocol").
#pragma once

#include <cstddef>
#include <string>

#include "epx/buffer.hpp"
#include "epx/config.hpp"
#include "epx/transport.hpp"

namespace epx::spi {

/// How rows travel. A Buffer has one base path (direct, relay or ring, from its config);
/// rows first and pull are per-call variants of the direct path.
/// A path registered outside the library takes a value of its own after these (the registry
/// refuses a value or key already taken).
enum class Path : int {
  kDirect,    ///< every sender puts its rows at their planned slots (docs/engine.md)
  kRelay,     ///< hierarchical schedule: cross-server rows go through a same-lane relay
  kRing,      ///< bounded receive area (ring_rows): rows paced by credits
  kRowsFirst, ///< a call right after one of the other kind puts before the header exchange
  kPull,      ///< combine reads the experts' rows in place (mapped peers, zero-copy y)
};

struct PathRule {
  Path path;
  const char* name;
  /// Indexed by the built-in protocols (explicit, tail, flag); another protocol is taken
  /// where the one its row names (ProtocolRule::paths_as) is: takes().
  bool protocols[3];
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
  bool dispatch;         ///< a dispatch path (pull is combine only; its unit has no dispatch side)
  /// The configs whose base path this is; nullptr: a per-call variant, which the call names
  /// (dispatch_path / combine_path). base_path asks the last registered path first.
  bool (*base_of)(const BufferConfig&) = nullptr;
};

struct ProtocolRule {
  Protocol protocol;
  const char* name;
  bool TransportCaps::*needs;  ///< the guarantee it relies on (nullptr: none)
  const char* needs_text;      ///< ... in words, for the refusal
  bool views;                  ///< zero-copy output possible
  const char* why_no_views;
  const char* why_copy;        ///< why rows cannot land in the receiver's output block (nullptr: they can)
  /// The built-in protocol whose column of the path rows says which paths take this one (a
  /// built-in names itself): explicit or tail for one that completes rows by a signal after
  /// them, flag for one whose rows complete themselves.
  Protocol paths_as;
};

/// The registered rows in Path or Protocol order, for `for (const PathRule& r : kPaths)`.
template <class Row>
class RowIterator {
 public:
  explicit RowIterator(const Row* const* at) noexcept : at_(at) {}
  const Row& operator*() const noexcept { return **at_; }
  const Row* operator->() const noexcept { return *at_; }
  RowIterator& operator++() noexcept {
    ++at_;
    return *this;
  }
  bool operator==(const RowIterator& o) const noexcept { return at_ == o.at_; }

 private:
  const Row* const* at_;
};
struct PathRows {  // defined with the registry (src/ep/paths/units.cpp)
  RowIterator<PathRule> begin() const;
  RowIterator<PathRule> end() const;
  std::size_t size() const;
};
struct ProtocolRows {  // src/ep/protocols/units.cpp
  RowIterator<ProtocolRule> begin() const;
  RowIterator<ProtocolRule> end() const;
  std::size_t size() const;
};
inline constexpr PathRows kPaths{};
inline constexpr ProtocolRows kProtocols{};

/// A registered path's or protocol's row; nullptr if none is registered under that value.
const PathRule* find_rule(Path p) noexcept;
const ProtocolRule* find_rule(Protocol p) noexcept;
/// ... that must exist (ErrorCode::kInternal if not: a config the checks let through names it).
const PathRule& rule(Path p);
const ProtocolRule& rule(Protocol p);

/// Whether a path takes a protocol (the path row's column for the protocol's paths_as).
inline bool takes(const PathRule& path, Protocol p) { return path.protocols[static_cast<int>(rule(p).paths_as)]; }

/// The base path of a config: the one DataPlaneOptions::path names, else the last registered
/// path whose base_of holds (built in: ring when ring_rows > 0, relay with the hierarchical
/// schedule, direct otherwise). A name refuse_path refuses: kInvalidArgument.
Path base_path(const BufferConfig& c);

/// Why `name` cannot name a base path (DataPlaneOptions::path) whatever the config ("" if it
/// can: empty, or the key of a registered path that has a base_of); the refusal names the
/// value and the registered paths that can be named.
std::string refuse_path_name(const std::string& name);
/// ... and why the path the config names cannot be its base path ("" if it can; its base_of
/// must take the config: the relay needs the hierarchical schedule, the ring ring_rows).
std::string refuse_path(const BufferConfig& c);

/// Why a Buffer with this config cannot run on a transport with these caps ("" if it can).
inline std::string refuse_config(const BufferConfig& c, const TransportCaps& caps) {
  if (std::string why = refuse_path(c); !why.empty()) return why;
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
  if (find_rule(p) == nullptr) return "protocol " + std::to_string(static_cast<int>(p)) + " is not a registered completion protocol";
  const PathRule& path = rule(base_path(c));
  const ProtocolRule& proto = rule(p);
  if (!takes(path, p))
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
inline bool allows(Path variant, const BufferConfig& c, bool peer_window = false) {
  const PathRule& v = rule(variant);
  if (v.variant_of_direct && base_path(c) != Path::kDirect) return false;
  if (!v.with_pool && c.output_pool_bytes != 0) return false;
  if (v.needs_peer_window && !peer_window) return false;
  return takes(v, c.dataplane.protocol);
}

/// Whether a combine may push its replies before the header exchange (replies first) at all:
/// the rows-first row's rule, except that the output pool does not matter — replies land in
/// the sources' reply areas, never in an output block. The call still needs its own
/// conditions (CallState: right after the dispatch of its handle, no views) and, with a
/// pool, a small enough call (DataPlaneOptions::replies_first_max_bytes).
inline bool allows_replies_first(const BufferConfig& c) {
  return base_path(c) == Path::kDirect && takes(rule(Path::kRowsFirst), c.dataplane.protocol);
}

/// The path one dispatch takes (named once per call): rows first when the call state chose
/// it (`rows_first`: the previous call was a combine that freed every receive area and no
/// rank holds a view; CallState::begin_dispatch) and the table allows it, else the base path.
inline Path dispatch_path(const BufferConfig& c, bool rows_first) {
  return rows_first && allows(Path::kRowsFirst, c) ? Path::kRowsFirst : base_path(c);
}

/// The path one combine takes (named once per call): replies first when the call state chose
/// it (CallState::begin_combine; known before the exchange), pull when every rank's y lies
/// in its window (`all_y_in_window`, from the headers; each rank offers it only where
/// allows(kPull) holds), else the base path (direct = push, relay, ring).
inline Path combine_path(const BufferConfig& c, bool replies_first, bool all_y_in_window) {
  if (replies_first && allows_replies_first(c)) return Path::kRowsFirst;
  if (!replies_first && all_y_in_window && allows(Path::kPull, c, true)) return Path::kPull;
  return base_path(c);
}

/// Why a dispatch output of this layout on a Buffer of this config is a copy out of the
/// receive area rather than a block of the output pool the senders put into ("" = one copy
/// possible; the pool may still be exhausted at the call). A static string
/// (CallStats::output_why).
inline const char* why_copy(const BufferConfig& c, RecvLayout layout) {
  if (c.output_pool_bytes == 0) return "output pool off";
  if (const char* why = rule(base_path(c)).why_copy) return why;
  if (const char* why = rule(c.dataplane.protocol).why_copy) return why;
  // A relay forwards a compact row into the block as a direct sender would (the same slot);
  // an expanded row would go once per slot, at rows only the relayed record's metadata names.
  if (base_path(c) == Path::kRelay && layout == RecvLayout::kExpanded) return "hierarchical schedule, expanded layout";
  return "";  // both layouts land in output blocks (an expanded one takes a row per slot)
}

}  // namespace epx::spi
