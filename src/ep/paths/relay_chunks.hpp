// Relay chunks (DataPlaneOptions::relay_chunk_bytes; Impl::relay_chunk_rows > 0), shared by
// the hierarchical dispatch (paths/dispatch_relay.cpp) and combine (paths/combine_relay.cpp).
// The rows a relay relays for each of its sources are cut into chunks of relay_chunk_rows,
// counted from the source's first row in the relay's area (chunk c of every source at once,
// so a relay's forwarding feeds all its sources' destinations evenly). The senders of a
// chunk's rows send them in their round c and then signal it: worker w's ordered signal
// epoch << 32 | (c + 1) in its slot Geometry::relay_chunk_signal(sender, w) at the relay;
// the relay forwards chunk c once every sender's every worker has signalled at least that.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "../path.hpp"

namespace epx::detail {

inline std::int64_t chunks_of(std::int64_t rows, std::int64_t per) { return (rows + per - 1) / per; }
inline std::uint64_t chunk_value(const PathContext& m, std::int64_t chunks) { return m.call.epoch << 32 | static_cast<std::uint64_t>(chunks); }

/// The chunks of a relay whose relayed rows per source begin at `begin` ([P + 1]).
inline std::int64_t relay_chunks(const std::vector<std::int64_t>& begin, std::int64_t per) {
  std::int64_t n = 0;
  for (std::size_t s = 0; s + 1 < begin.size(); ++s) n = std::max(n, chunks_of(begin[s + 1] - begin[s], per));
  return n;
}

/// Source s's rows of chunk c in a relay's area, [first, end) (empty past its last chunk).
inline std::pair<std::int64_t, std::int64_t> chunk_range(const std::vector<std::int64_t>& begin, int s, std::int64_t c, std::int64_t per) {
  const std::int64_t first = begin[static_cast<std::size_t>(s)] + c * per;
  return {first, std::min(begin[static_cast<std::size_t>(s) + 1], first + per)};
}

/// Round c of `rounds`: its share of rows [first, end) that go to my own server's ranks.
inline std::pair<std::int64_t, std::int64_t> round_share(std::int64_t first, std::int64_t end, std::int64_t c, std::int64_t rounds) {
  const std::int64_t n = end - first;
  return {first + n * c / rounds, first + n * (c + 1) / rounds};
}

/// The relay chunks worker w owns (c = w, w + W, ... below `total`), forwarded in order as
/// the rounds allow.
class OwnChunks {
 public:
  OwnChunks(std::int64_t total, int w, int W) : next_(w), total_(total), step_(W) {}
  /// Forwards (forward(c)) every owned chunk up to round `last` not forwarded yet.
  template <class Forward>
  void upto(std::int64_t last, Forward&& forward) {
    for (; next_ < total_ && next_ <= last; next_ += step_) forward(next_);
  }

 private:
  std::int64_t next_, total_, step_;
};

/// A relay forwards chunk c (its worker c mod W does) once the senders have sent round c +
/// kRelayLag: a round of slack, so a relay's wait rarely stalls its own sending.
constexpr std::int64_t kRelayLag = 1;

/// Worker w has sent its rows of chunk c to `relay` on queue q: the chunk's ordered signal
/// (a quiet first where the transport does not order signals after puts).
inline void signal_chunk(PathContext& m, int relay, int q, int w, std::int64_t c) {
  if (!m.setup.transport.caps().ordered_signal_per_queue) m.setup.transport.quiet(q);
  m.setup.transport.signal(relay, m.setup.geo.relay_chunk_signal(m.setup.rank, w), chunk_value(m, c + 1), q);
}

/// At a relay: until every worker of `sender` has signalled chunk c.
inline void wait_chunk(PathContext& m, int sender, std::int64_t c, const char* phase) {
  for (int sw = 0; sw < m.setup.W; ++sw) m.setup.transport.wait_signal(m.setup.geo.relay_chunk_signal(sender, sw), chunk_value(m, c + 1), {phase, sender});
}

}  // namespace epx::detail
