// The workers of one rank (the SM / vector-core analogue): W threads, the calling thread
// being worker 0, running one fork-join task at a time. Idle workers spin briefly, then
// yield, then sleep on a futex, so a rank between calls costs no CPU; the caller waits for
// the workers' end of a task the same way.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace epx::detail {

class WorkerPool {
 public:
  explicit WorkerPool(int workers);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const noexcept { return static_cast<int>(threads_.size()) + 1; }

  /// Runs task(w) for every w in [0, size()) — w = 0 on the calling thread — and returns
  /// when all finished; rethrows the first exception a worker threw.
  void run(const std::function<void(int)>& task);

 private:
  void worker_loop(int w);

  std::vector<std::thread> threads_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* task_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

/// [begin, end) of part `i` of `n` near-equal parts of [0, total).
inline std::pair<std::int64_t, std::int64_t> split_range(std::int64_t total, int i, int n) noexcept {
  return {total * i / n, total * (i + 1) / n};
}

}  // namespace epx::detail
