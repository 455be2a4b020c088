// A completion protocol (epx/dataplane.hpp's Protocol) as one unit: how a worker's puts to
// a peer complete there — its send side, run by every worker's Sender on every data path —
// and how the receiver knows the rows have landed (await_rows). One unit per file in
// protocols/; protocol_unit() names the configured one. The support table
// (epx/spi/support.hpp, kProtocols) says what each relies on and which paths take it; the
// window space one needs (flag blocks) is Geometry's.
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

/// The unit of `p` (one static instance each).
const CompletionProtocol& protocol_unit(Protocol p);
const CompletionProtocol& explicit_unit();
const CompletionProtocol& tail_unit();
const CompletionProtocol& flag_unit();

}  // namespace epx::detail
