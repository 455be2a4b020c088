#include "worker_pool.hpp"

#include "epx/spi/cpu_relax.hpp"
#include <sched.h>

#include <chrono>

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
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 256)
      epx::spi::cpu_relax();
    else
      sched_yield();
  }
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void WorkerPool::worker_loop(int w) {
  std::uint64_t seen = 0;
  for (;;) {
    // Spin, then yield for ~1 ms, then sleep until the next task.
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    for (int spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
      if (spins < 256) {
        epx::spi::cpu_relax();
      } else if (std::chrono::steady_clock::now() < until) {
        sched_yield();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    try {
      (*task_)(w);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace epx::detail
