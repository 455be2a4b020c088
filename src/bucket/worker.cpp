#include "worker.hpp"

namespace epx::detail {

void Worker::post(std::shared_ptr<BucketCall> call) {
  {
    std::lock_guard<std::mutex> lock(m_);
    next_ = std::move(call);
    if (!thread_.joinable()) {
      stopping_ = false;
      thread_ = std::thread([this] { loop(); });
    }
  }
  cv_.notify_one();
}

void Worker::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(m_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Worker::loop() {
  std::unique_lock<std::mutex> lock(m_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || next_ != nullptr; });
    if (next_) {
      std::shared_ptr<BucketCall> call = std::move(next_);
      lock.unlock();
      call->run_or_wait();
      lock.lock();
      continue;
    }
    if (stopping_) return;
  }
}

}  // namespace epx::detail
