// Per-call statistics: phase timers and the bookkeeping around them; the always-on waits
// per peer (PeerWaits, the diagnosis' raw numbers).
#include "engine.hpp"
#include "epx/spi/backoff.hpp"

namespace epx {

const char* to_string(Phase p) noexcept {
  switch (p) {
    case Phase::kPlan: return "plan";
    case Phase::kNotify: return "notify";
    case Phase::kPutIssue: return "put_issue";
    case Phase::kWaitData: return "wait_data";
    case Phase::kBarrier: return "barrier";
    case Phase::kEpilogue: return "epilogue";
  }
  return "unknown";
}

const char* to_string(OutputKind k) noexcept {
  switch (k) {
    case OutputKind::kNone: return "none";
    case OutputKind::kOneCopy: return "one_copy";
    case OutputKind::kCopy: return "copy";
    case OutputKind::kView: return "view";
  }
  return "unknown";
}

Buffer::Impl::PhaseTimer::PhaseTimer(Impl& m, int worker, Phase phase)
    : slot_(m.config.collect_stats
                ? &m.stats.workers[static_cast<std::size_t>(worker)].phase_us[static_cast<std::size_t>(phase)]
                : nullptr) {
  if (slot_ != nullptr) start_ = std::chrono::steady_clock::now();
}

Buffer::Impl::PhaseTimer::~PhaseTimer() {
  if (slot_ != nullptr)
    *slot_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
}

const char* to_string(WaitOp op) noexcept { return op == WaitOp::kCombine ? "combine" : "dispatch"; }

PeerWaits::PeerWaits(int num_ranks)
    : num_ranks_(num_ranks),
      values_(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(kNumWaitOps * (num_ranks + 1)))) {}

std::uint64_t PeerWaits::calls(WaitOp op) const noexcept { return at(op, 0).load(std::memory_order_relaxed); }

// A seqlock with one writer: the sequence is odd while add_call writes; a reader retries
// until it read every value between two equal, even sequence numbers. Release stores of the
// values (after the odd sequence) and acquire loads (before the second look at it) order
// them without fences (which ThreadSanitizer does not support); on x86 they are plain moves.
void PeerWaits::add_call(WaitOp op, const std::uint64_t* wait_ns) noexcept {
  const std::uint64_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  for (int i = 0; i <= num_ranks_; ++i) {
    std::atomic<std::uint64_t>& v = at(op, i);
    v.store(v.load(std::memory_order_relaxed) + (i == 0 ? 1 : wait_ns[i - 1]), std::memory_order_release);
  }
  seq_.store(s + 2, std::memory_order_release);
}

PeerWaits::Totals PeerWaits::totals(WaitOp op) const {
  Totals t;
  t.wait_ns.resize(static_cast<std::size_t>(num_ranks_));
  spi::Backoff writer_busy(0);  // a write is rare and short: yield to it at once
  for (;;) {
    const std::uint64_t s = seq_.load(std::memory_order_acquire);
    if ((s & 1) == 0) {
      t.calls = at(op, 0).load(std::memory_order_acquire);
      for (int i = 0; i < num_ranks_; ++i) t.wait_ns[static_cast<std::size_t>(i)] = at(op, i + 1).load(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == s) return t;
    }
    writer_busy.step();
  }
}

std::shared_ptr<const PeerWaits> Buffer::peer_waits() const noexcept { return impl_->waits; }

Buffer::Impl::WaitClock::time_point Buffer::Impl::lap_wait(int w, int s, WaitClock::time_point since) noexcept {
  if (!config.record_waits) return since;
  const WaitClock::time_point now = WaitClock::now();
  call_waits[static_cast<std::size_t>(w) * static_cast<std::size_t>(P) + static_cast<std::size_t>(s)] +=
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - since).count());
  return now;
}

// Always on: this call's waits start at 0, its wait loops at a source that rotates per call.
void Buffer::Impl::begin_waits(bool combine) {
  wait_op = combine ? WaitOp::kCombine : WaitOp::kDispatch;
  wait_first = static_cast<int>((static_cast<std::uint64_t>(rank) + waits->calls(wait_op)) % static_cast<std::uint64_t>(P));
  call_waits.assign(static_cast<std::size_t>(W) * static_cast<std::size_t>(P), 0);
  call_laps.assign(static_cast<std::size_t>(P), 0);
  call_held.assign(static_cast<std::size_t>(P), 0);
  laps_announced = 0;
}

// The call's waits per source (summed over its workers) into the Buffer's PeerWaits, with
// the end-of-call quiet's laps (this rank held by its puts to each peer). A source that was
// held by the network in its previous call came late for that reason (it announced
// held_ns in its header): that much of the wait for it is not charged to it again — it is
// already in the laps of the links that held it (docs/diagnose.md). What this rank waited
// for held sources held it too: it goes into held_ns with the laps not yet announced (the
// ones after this call's header), for the next header.
void Buffer::Impl::end_waits() {
  if (!config.record_waits) return;
  const auto p = static_cast<std::size_t>(P);
  for (std::size_t w = 1; w < static_cast<std::size_t>(W); ++w)
    for (std::size_t s = 0; s < p; ++s) call_waits[s] += call_waits[w * p + s];
  std::uint64_t held = 0;
  for (std::size_t s = 0; s < p; ++s) {
    const std::uint64_t held_by_s = std::min(call_waits[s], call_held[s]);
    call_waits[s] += call_laps[s] - held_by_s;
    held += call_laps[s] + held_by_s;
  }
  held_ns = held - std::min(held, laps_announced);  // the laps before my header went out in it
  waits->add_call(wait_op, call_waits.data());
}

void Buffer::Impl::begin_stats(bool combine, bool cached) {
  begin_waits(combine);
  stats.output = OutputKind::kNone;
  stats.output_why = "";
  stats.path = "";
  stats.epilogue_copy_bytes = 0;
  if (!config.collect_stats) return;
  stats.combine = combine;
  stats.cached = cached;
  stats.total_us = 0;
  stats.workers.assign(static_cast<std::size_t>(W), WorkerStats{});
  call_start = std::chrono::steady_clock::now();
}

void Buffer::Impl::end_stats() {
  end_waits();
  if (!config.collect_stats) return;
  stats.total_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - call_start).count();
}

}  // namespace epx
