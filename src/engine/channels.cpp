// A worker's side of the data plane: which queue each channel (this worker's visit to one
// peer) uses, how rows are merged into puts, and how the peer learns they have landed —
// the completion protocol (epx/dataplane.hpp says what each relies on):
//   explicit  puts; quiet every queue; one signal per peer
//   tail      puts; right after a peer's last put, its ordered signal on the same queue
//   flag      every 480 payload bytes carry their own epoch flag; no signal at all
#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine.hpp"

namespace epx {

using detail::Region;
using detail::kFlagBlock;
using detail::kFlagPayload;

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
      peers_(peers),
      signal_slot_(first_signal),
      queue_of_(static_cast<std::size_t>(m.P), 0),
      stats_(m.config.collect_stats ? &m.stats.workers[static_cast<std::size_t>(worker)] : nullptr) {
  const DataPlaneOptions& o = m.config.dataplane;
  if (o.queues > 1) {
    // Channels in visiting order; each gets its queue from the split rule.
    std::vector<std::uint64_t> bytes;
    bytes.reserve(peers.size());
    for (int d : peers) bytes.push_back(channel_bytes[static_cast<std::size_t>(d)]);
    const std::vector<int> queues = assign_queues(o.queue_split, o.queues, bytes);
    for (std::size_t i = 0; i < peers.size(); ++i) queue_of_[static_cast<std::size_t>(peers[i])] = queues[i];
  }
  if (m.flag_protocol()) stage_.assign(static_cast<std::size_t>(o.queues) * kFlagPayload, std::byte{0});
}

void Buffer::Impl::Sender::put(int d, std::size_t offset, const void* src, std::size_t bytes) {
  const int q = queue_of_[static_cast<std::size_t>(d)];
  m_.transport.put(d, offset, src, bytes, q);
  if (stats_) m_.count_put(*stats_, d, bytes, q);
}

void Buffer::Impl::Sender::put_rows(int d, Region region, std::int64_t row, const void* src, std::int64_t n,
                                    std::size_t row_bytes) {
  const auto* from = static_cast<const std::byte*>(src);
  if (n <= 0 || row_bytes == 0) return;
  if (!m_.flag_protocol()) {
    put_run(d, m_.geo.row(region, row, row_bytes), from, n, row_bytes);
    return;
  }
  const int q = queue_of_[static_cast<std::size_t>(d)];
  const bool reuse_needs_quiet = !m_.transport.caps().put_completes_on_return;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::byte* r = from + static_cast<std::size_t>(i) * row_bytes;
    std::size_t block = m_.geo.flag_block(region, row + i);
    for (std::size_t done = 0; done < row_bytes; done += kFlagPayload, block += kFlagBlock) {
      const std::size_t bytes = std::min(kFlagPayload, row_bytes - done);
      const std::byte* payload = r + done;
      if (bytes < kFlagPayload) {  // the flag sits at a fixed place: pad the last block
        // In q's own stage block: a quiet of q is what makes its previous put's source free.
        std::byte* stage = stage_.data() + static_cast<std::size_t>(q) * kFlagPayload;
        if (reuse_needs_quiet) m_.transport.quiet(q);
        std::memcpy(stage, payload, bytes);
        std::memset(stage + bytes, 0, kFlagPayload - bytes);
        payload = stage;
      }
      m_.transport.put_flagged(d, block, payload, kFlagPayload, m_.epoch, q);
      if (stats_) m_.count_put(*stats_, d, kFlagPayload + sizeof(std::uint64_t), q);
    }
  }
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

void Buffer::Impl::Sender::end_channel(int d) {
  if (m_.config.dataplane.protocol != Protocol::kTail || signal_slot_ == kNoSignal) return;
  m_.transport.signal(d, signal_slot_, m_.epoch, queue_of_[static_cast<std::size_t>(d)]);
}

void Buffer::Impl::Sender::signal(int d, std::size_t slot, std::uint64_t value) {
  const int q = queue_of_[static_cast<std::size_t>(d)];
  if (m_.config.dataplane.protocol == Protocol::kExplicit) m_.transport.quiet(q);
  m_.transport.signal(d, slot, value, q);
}

void Buffer::Impl::Sender::finish() {
  flush();
  if (m_.config.dataplane.protocol != Protocol::kExplicit || signal_slot_ == kNoSignal) return;
  for (int d : peers_) m_.transport.signal(d, signal_slot_, m_.epoch, queue_of_[static_cast<std::size_t>(d)]);
}

void Buffer::Impl::Sender::flush() {
  const DataPlaneOptions& o = m_.config.dataplane;
  // Every protocol ends with quiet: the caller may reuse its input once the call returns.
  for (int q = 0; q < o.queues; ++q) {
    const auto start = std::chrono::steady_clock::now();
    m_.transport.quiet(q);
    if (stats_)
      stats_->queue_wait_us[static_cast<std::size_t>(q)] +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
}

void Buffer::Impl::receive_flagged(Region region, std::int64_t r0, std::int64_t r1, std::size_t row_bytes,
                                   const std::int32_t* source_of, const char* phase) {
  const bool copy = moves_payload || region == Region::kMeta;
  std::byte* window_base = transport.window();
  for (std::int64_t r = r0; r < r1; ++r) {
    std::byte* to = window_base + geo.row(region, r, row_bytes);
    std::size_t block = geo.flag_block(region, r);
    for (std::size_t done = 0; done < row_bytes; done += kFlagPayload, block += kFlagBlock) {
      transport.wait_flag(block + kFlagPayload, epoch, {phase, source_of[r]});
      if (copy)
        std::memcpy(to + done, window_base + block,
                    std::min(kFlagPayload, row_bytes - done));
    }
  }
}

void Buffer::Impl::await_rows(CompletionSlot slot, const char* phase, const std::vector<std::int64_t>& begin,
                              std::initializer_list<RowGroup> groups) {
  if (!flag_protocol()) {  // explicit, tail: one signal per source and worker
    PhaseTimer timer(*this, 0, Phase::kWaitData);
    for (int s = 0; s < P; ++s)
      for (int w = 0; w < W; ++w) transport.wait_signal((geo.*slot)(s, w), epoch, {phase, s});
    return;
  }
  // Flag: every block carries its own epoch; the workers unpack a range of rows each.
  const std::int64_t n = begin.back();
  std::vector<std::int32_t> source_of(static_cast<std::size_t>(n));
  for (int s = 0; s < P; ++s)
    std::fill(source_of.begin() + begin[static_cast<std::size_t>(s)], source_of.begin() + begin[static_cast<std::size_t>(s) + 1], s);
  run_workers([&](int w) {
    PhaseTimer timer(*this, w, Phase::kWaitData);
    const auto [r0, r1] = detail::split_range(n, w, W);
    for (const RowGroup& g : groups)
      if (g.row_bytes > 0) receive_flagged(g.region, r0, r1, g.row_bytes, source_of.data(), phase);
  });
}

}  // namespace epx
