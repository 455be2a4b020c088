// The flag completion protocol (Protocol::kFlag, data as flag): every row goes as blocks of
// kFlagPayload bytes, each followed by the call's epoch in its flag word (put_flagged: the
// flag becomes visible only after the block's bytes); no signal at all. The receiver polls
// each block's flag and unpacks the payload into the plain row (Geometry::flag_block says
// where a row's blocks lie). A row's last, partial block is padded in the queue's own
// staging block: a quiet of that queue is what frees its previous put's source.
#include <algorithm>
#include <cstring>

#include "../protocol.hpp"

namespace epx::detail {
namespace {

// One worker's wait for its rows, per source (PeerWaits): the time until each stretch of a
// source's rows was unpacked is that source's.
struct SourceLaps {
  Buffer::Impl& m;
  int worker;
  int source = -1;
  Buffer::Impl::WaitClock::time_point since = Buffer::Impl::WaitClock::now();
  void at(int s) {
    if (s == source) return;
    if (source >= 0) since = m.lap_wait(worker, source, since);
    source = s;
  }
  ~SourceLaps() { at(-1); }
};

// Waits for every block of rows [r0, r1) of `region` (rows from `source_of`) and unpacks
// them into the region (a flagged meta/data/scales/reply row becomes a plain one). The rows
// go from `first` on (r0 <= first <= r1), then from r0: this call's first source first.
void receive_flagged(Buffer::Impl& m, Region region, std::int64_t r0, std::int64_t r1, std::int64_t first,
                     std::size_t row_bytes, const std::int32_t* source_of, const char* phase, SourceLaps& laps) {
  const bool copy = m.payload.carried(region);
  std::byte* window_base = m.transport.window();
  for (std::int64_t i = 0; i < r1 - r0; ++i) {
    const std::int64_t r = first + i < r1 ? first + i : first + i - (r1 - r0);
    laps.at(source_of[r]);
    std::byte* to = window_base + m.geo.row(region, r, row_bytes);
    std::size_t block = m.geo.flag_block(region, r);
    for (std::size_t done = 0; done < row_bytes; done += kFlagPayload, block += kFlagBlock) {
      m.transport.wait_flag(block + kFlagPayload, m.epoch, {phase, source_of[r]});
      if (copy) std::memcpy(to + done, window_base + block, std::min(kFlagPayload, row_bytes - done));
    }
  }
}

class Flag final : public CompletionProtocol {
 public:
  std::size_t stage_bytes() const noexcept override { return kFlagPayload; }

  void put_rows(Sender& s, int d, Region region, std::int64_t row, const std::byte* from, std::int64_t n,
                std::size_t row_bytes) const override {
    Buffer::Impl& m = s.impl();
    const int q = s.queue_of(d);
    const bool reuse_needs_quiet = !m.transport.caps().put_completes_on_return;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::byte* r = from + static_cast<std::size_t>(i) * row_bytes;
      std::size_t block = m.geo.flag_block(region, row + i);
      for (std::size_t done = 0; done < row_bytes; done += kFlagPayload, block += kFlagBlock) {
        const std::size_t bytes = std::min(kFlagPayload, row_bytes - done);
        const std::byte* payload = r + done;
        if (bytes < kFlagPayload) {  // the flag sits at a fixed place: pad the last block
          std::byte* stage = s.stage(q);
          if (reuse_needs_quiet) m.transport.quiet(q);
          std::memcpy(stage, payload, bytes);
          std::memset(stage + bytes, 0, kFlagPayload - bytes);
          payload = stage;
        }
        m.transport.put_flagged(d, block, payload, kFlagPayload, m.epoch, q);
        s.count(d, kFlagPayload + sizeof(std::uint64_t), q);
      }
    }
  }

  void await_rows(Buffer::Impl& m, Buffer::Impl::CompletionSlot, const char* phase, const std::vector<std::int64_t>& begin,
                  std::initializer_list<Buffer::Impl::RowGroup> groups, const Buffer::Impl::SourceLanded*) const override {
    // Every block carries its own epoch; the workers unpack a range of rows each.
    const std::int64_t n = begin.back();
    std::vector<std::int32_t> source_of(static_cast<std::size_t>(n));
    for (int s = 0; s < m.P; ++s)
      std::fill(source_of.begin() + begin[static_cast<std::size_t>(s)], source_of.begin() + begin[static_cast<std::size_t>(s) + 1], s);
    const std::int64_t first_row = begin[static_cast<std::size_t>(m.wait_source(0))];
    m.run_workers([&](int w) {
      Buffer::Impl::PhaseTimer timer(m, w, Phase::kWaitData);
      const auto [r0, r1] = split_range(n, w, m.W);
      const std::int64_t first = std::clamp(first_row, r0, r1);
      SourceLaps laps{m, w};
      for (const Buffer::Impl::RowGroup& g : groups)
        if (g.row_bytes > 0) receive_flagged(m, g.region, r0, r1, first, g.row_bytes, source_of.data(), phase, laps);
    });
  }
};

// Relies on flagged puts; only the direct path takes it (its rows complete themselves);
// no views (rows arrive in blocks), no output blocks.
constexpr spi::ProtocolRule kFlagRow{Protocol::kFlag, "flag", &TransportCaps::flagged_puts,
                                     "flagged puts (a block's flag visible only after its bytes)", false,
                                     "recv_in_window needs rows stored contiguously, but the flag protocol delivers 512-byte blocks",
                                     "flag protocol", Protocol::kFlag};

}  // namespace

const ProtocolUnit& flag_protocol() {
  static const Flag unit;
  static const ProtocolUnit protocol{kFlagRow, unit};
  return protocol;
}

}  // namespace epx::detail
