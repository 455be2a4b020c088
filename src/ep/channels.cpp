// A worker's side of the data plane: which queue each channel (this worker's visit to one
// peer) uses and how rows are merged into puts. How the peer learns they have landed is the
// completion protocol's unit (protocol.hpp, protocols/: explicit, tail, flag), which the
// Sender calls at its put, channel-end, signal and finish points, and whose receive side
// await_rows runs.
#include <algorithm>
#include <chrono>

#include "engine.hpp"
#include "protocol.hpp"

namespace epx {

using detail::Region;

void Buffer::Impl::count_put(WorkerStats& ws, int peer, std::size_t bytes, int queue) const noexcept {
  if (peer == rank) {
    ++ws.local_puts;
    ws.local_bytes += bytes;
  } else {
    ++ws.puts;
    ws.put_bytes += bytes;
  }
  ++ws.queue_puts[static_cast<std::size_t>(queue)];
  ws.queue_bytes[static_cast<std::size_t>(queue)] += bytes;
}

Buffer::Impl::Sender::Sender(Impl& m, int worker, std::size_t first_signal, const std::vector<std::uint64_t>& channel_bytes,
                             const std::vector<int>& peers)
    : m_(m),
      proto_(detail::protocol_unit(m.config.dataplane.protocol)),
      peers_(peers),
      signal_slot_(first_signal),
      queue_of_(static_cast<std::size_t>(m.P), 0),
      stats_(m.config.collect_stats ? &m.stats.workers[static_cast<std::size_t>(worker)] : nullptr),
      worker_(worker) {
  const DataPlaneOptions& o = m.config.dataplane;
  if (o.queues > 1) {
    // Channels in visiting order; each gets its queue from the split rule.
    std::vector<std::uint64_t> bytes;
    bytes.reserve(peers.size());
    for (int d : peers) bytes.push_back(channel_bytes[static_cast<std::size_t>(d)]);
    const std::vector<int> queues = assign_queues(o.queue_split, o.queues, bytes);
    for (std::size_t i = 0; i < peers.size(); ++i) queue_of_[static_cast<std::size_t>(peers[i])] = queues[i];
  }
  stage_.assign(static_cast<std::size_t>(o.queues) * proto_.stage_bytes(), std::byte{0});
}

std::byte* Buffer::Impl::Sender::stage(int q) noexcept {
  return stage_.data() + static_cast<std::size_t>(q) * proto_.stage_bytes();
}

void Buffer::Impl::Sender::put(int d, std::size_t offset, const void* src, std::size_t bytes) {
  const int q = queue_of_[static_cast<std::size_t>(d)];
  m_.transport.put(d, offset, src, bytes, q);
  count(d, bytes, q);
}

void Buffer::Impl::Sender::put_rows(int d, Region region, std::int64_t row, const void* src, std::int64_t n,
                                    std::size_t row_bytes) {
  if (n <= 0 || row_bytes == 0) return;
  proto_.put_rows(*this, d, region, row, static_cast<const std::byte*>(src), n, row_bytes);
}

void Buffer::Impl::Sender::put_run(int d, std::size_t first, const std::byte* src, std::int64_t n, std::size_t row_bytes) {
  const std::size_t limit = m_.config.dataplane.aggregate_bytes;
  const std::int64_t per_put = std::max<std::int64_t>(1, static_cast<std::int64_t>(limit / row_bytes));
  for (std::int64_t i = 0; i < n; i += per_put) {
    const std::int64_t rows = std::min(per_put, n - i);
    put(d, first + static_cast<std::size_t>(i) * row_bytes, src + static_cast<std::size_t>(i) * row_bytes,
        static_cast<std::size_t>(rows) * row_bytes);
  }
}

void Buffer::Impl::Sender::put_landed(int d, const detail::Landing& at, Region region, std::int64_t row, const void* src,
                                      std::int64_t n, std::size_t row_bytes) {
  if (!at.block) return put_rows(d, region, row, src, n, row_bytes);
  if (n <= 0 || row_bytes == 0) return;
  put_run(d, detail::Geometry::landed_row(at, region, row, row_bytes), static_cast<const std::byte*>(src), n, row_bytes);
}

void Buffer::Impl::Sender::end_channel(int d) { proto_.end_channel(*this, d); }

void Buffer::Impl::Sender::signal(int d, std::size_t slot, std::uint64_t value) {
  const int q = queue_of_[static_cast<std::size_t>(d)];
  proto_.before_signal(*this, q);
  m_.transport.signal(d, slot, value, q);
}

void Buffer::Impl::Sender::finish() {
  flush();
  proto_.finish(*this);
}

void Buffer::Impl::Sender::flush() {
  const DataPlaneOptions& o = m_.config.dataplane;
  // Every protocol ends with quiet: the caller may reuse its input once the call returns.
  for (int q = 0; q < o.queues; ++q) {
    const auto start = std::chrono::steady_clock::now();
    // Worker 0's first quiet names the peers it waited for (all quiets end together on a
    // transport whose quiet is global; PeerWaits, docs/diagnose.md).
    if (worker_ == 0 && q == 0 && m_.config.record_waits) {
      m_.transport.quiet_timed(q, m_.call_laps.data());
    } else {
      m_.transport.quiet(q);
    }
    if (stats_)
      stats_->queue_wait_us[static_cast<std::size_t>(q)] +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
}

void Buffer::Impl::await_rows(CompletionSlot slot, const char* phase, const std::vector<std::int64_t>& begin,
                              std::initializer_list<RowGroup> groups, const SourceLanded* landed) {
  detail::protocol_unit(config.dataplane.protocol).await_rows(*this, slot, phase, begin, groups, landed);
}

}  // namespace epx

namespace epx::detail {

void CompletionProtocol::put_rows(Sender& s, int d, Region region, std::int64_t row, const std::byte* src, std::int64_t n,
                                  std::size_t row_bytes) const {
  s.put_run(d, s.impl().geo.row(region, row, row_bytes), src, n, row_bytes);
}

void CompletionProtocol::await_rows(Buffer::Impl& m, Buffer::Impl::CompletionSlot slot, const char* phase,
                                    const std::vector<std::int64_t>&, std::initializer_list<Buffer::Impl::RowGroup>,
                                    const Buffer::Impl::SourceLanded* landed) const {
  Buffer::Impl::PhaseTimer timer(m, 0, Phase::kWaitData);
  Buffer::Impl::WaitClock::time_point since = Buffer::Impl::WaitClock::now();
  for (int i = 0; i < m.P; ++i) {
    const int s = m.wait_source(i);
    for (int w = 0; w < m.W; ++w) m.transport.wait_signal((m.geo.*slot)(s, w), m.epoch, {phase, s});
    since = m.lap_wait(0, s, since);
    if (landed == nullptr) continue;
    (*landed)(s);  // work instead of waiting: a waiter that yields still spends its share of the core
    since = Buffer::Impl::WaitClock::now();  // (not charged to the next source's wait)
  }
}

}  // namespace epx::detail
