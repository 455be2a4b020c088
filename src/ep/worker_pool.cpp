#include "worker_pool.hpp"

#include <chrono>

#include "epx/spi/backoff.hpp"

namespace epx::detail {

WorkerPool::WorkerPool(int workers) {
  for (int w = 1; w < workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
}

WorkerPool::~WorkerPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::run(const std::function<void(int)>& task) {
  if (threads_.empty()) {
    task(0);
    return;
  }
  task_ = &task;
  error_ = nullptr;
  pending_.store(static_cast<int>(threads_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  try {
    task(0);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
  // The wait policy for ~1 ms, then asleep until the last worker's notify: a worker still
  // in a transport wait (which may sleep) costs the caller no core meanwhile.
  for (spi::Backoff idle(std::chrono::milliseconds(1));;) {
    const int left = pending_.load(std::memory_order_acquire);
    if (left == 0) break;
    if (!idle.step()) pending_.wait(left, std::memory_order_acquire);
  }
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void WorkerPool::worker_loop(int w) {
  std::uint64_t seen = 0;
  for (;;) {
    // The wait policy for ~1 ms (spin, then yield), then sleep until the next task.
    for (spi::Backoff idle(std::chrono::milliseconds(1)); generation_.load(std::memory_order_acquire) == seen;)
      if (!idle.step()) generation_.wait(seen, std::memory_order_acquire);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    try {
      (*task_)(w);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace epx::detail
