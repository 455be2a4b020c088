// Per-call statistics: phase timers and the bookkeeping around them.
#include "engine.hpp"

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

void Buffer::Impl::begin_stats(bool combine, bool cached) {
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
  if (!config.collect_stats) return;
  stats.total_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - call_start).count();
}

}  // namespace epx
