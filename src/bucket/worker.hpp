// epx's thread for a bucket buffer's asynchronous calls: started on first use, runs one
// call's data phase at a time (BucketCall::run_or_wait: whichever of it and the waiting
// thread comes first runs it).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "call.hpp"

namespace epx::detail {

class Worker {
 public:
  Worker() = default;
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() { stop(); }

  /// Hands `call` to the thread (starting it if needed).
  void post(std::shared_ptr<BucketCall> call);
  /// Ends the thread after the call it holds, if any. Idempotent.
  void stop() noexcept;

 private:
  void loop();

  std::mutex m_;
  std::condition_variable cv_;
  std::shared_ptr<BucketCall> next_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace epx::detail
