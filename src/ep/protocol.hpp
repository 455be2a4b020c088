// A completion protocol (epx/dataplane.hpp's Protocol) as one unit: how a worker's puts to
// a peer complete there — its send side, run by every worker's Sender on every data path —
// and how the receiver knows the rows have landed (await_rows). One unit per file in
// protocols/, beside its row of the support table (spi::ProtocolRule: what it relies on,
// which paths take it, whether views work); protocols/units.cpp registers them and
// protocol_unit() names the configured one. The window space one needs (flag blocks) is
// Geometry's.
//   explicit  puts; quiet every queue; one signal per peer and worker      (explicit.cpp)
//   tail      puts; right after a peer's last put, its ordered signal      (tail.cpp)
//   flag      every 480 payload bytes carry their own epoch flag; no signal (flag.cpp)
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "engine.hpp"

namespace epx::detail {

using Sender = Buffer::Impl::Sender;

class CompletionProtocol {
 public:
  virtual ~CompletionProtocol() = default;

  /// Rows [row, row + n) of `region` at peer d from `src` (consecutive rows of
  /// `row_bytes`). Default: plain puts of at most aggregate_bytes (Sender::put_run).
  virtual void put_rows(Sender& s, int d, Region region, std::int64_t row, const std::byte* src, std::int64_t n,
                        std::size_t row_bytes) const;
  /// This worker has put everything for peer d of this call.
  virtual void end_channel(Sender& /*s*/, int /*d*/) const {}
  /// Before a progress signal on queue q, which must be seen after q's puts before it.
  virtual void before_signal(Sender& /*s*/, int /*q*/) const {}
  /// After every queue is quiet: whatever completes the call's puts at the peers.
  virtual void finish(Sender& /*s*/) const {}
  /// Bytes of staging per queue a Sender keeps for this protocol (flag: the padded block).
  virtual std::size_t stage_bytes() const noexcept { return 0; }
  /// Receive side: until every row of `groups` has landed here (rows [0, begin[P]); row r
  /// from the rank s with begin[s] <= r < begin[s + 1]). Default: every source's and
  /// worker's signal `slot` of this epoch, calling `landed` (if any) with each source as
  /// soon as its signals are in (flag: never; the caller handles the sources not named).
  virtual void await_rows(Buffer::Impl& m, Buffer::Impl::CompletionSlot slot, const char* phase,
                          const std::vector<std::int64_t>& begin, std::initializer_list<Buffer::Impl::RowGroup> groups,
                          const Buffer::Impl::SourceLanded* landed) const;
};

/// A completion protocol as the engine knows it: its row of the support table and its unit,
/// both defined in the protocol's own file; protocols/units.cpp registers the built-in ones.
struct ProtocolUnit {
  const spi::ProtocolRule& rule;
  const CompletionProtocol& unit;
};

/// Registers a protocol (it must outlive the registration): its row joins spi::kProtocols,
/// and a config naming its Protocol value runs it. Refuses (kInvalidArgument) a value or name
/// already registered. As for paths: register before building the Buffers that use it,
/// remove after destroying them (every call reads the table without a lock).
void add_protocol(const ProtocolUnit& protocol);
void remove_protocol(Protocol p);

/// A protocol registered for a scope.
class RegisteredProtocol {
 public:
  explicit RegisteredProtocol(const ProtocolUnit& protocol) : protocol_(protocol.rule.protocol) { add_protocol(protocol); }
  ~RegisteredProtocol() { remove_protocol(protocol_); }
  RegisteredProtocol(const RegisteredProtocol&) = delete;
  RegisteredProtocol& operator=(const RegisteredProtocol&) = delete;

 private:
  Protocol protocol_;
};

/// The unit of a registered `p` (kInternal if none: the config check refuses such a config).
const CompletionProtocol& protocol_unit(Protocol p);
const ProtocolUnit& explicit_protocol();  // protocols/explicit.cpp
const ProtocolUnit& tail_protocol();      // protocols/tail.cpp
const ProtocolUnit& flag_protocol();      // protocols/flag.cpp

}  // namespace epx::detail
