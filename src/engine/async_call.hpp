// One asynchronous dispatch or combine (Buffer::dispatch_async / combine_async): the
// call's front half ran on the caller's thread; a thread of its own issues the puts (the
// Buffer's worker pool, as in a synchronous call, with this thread as worker 0) and, with
// Completion::kBackground, runs the back half right after; with kAtFinish the back half
// runs in finish(). The Buffer's call state knows it while it is pending (call_state.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <exception>
#include <thread>
#include <variant>

#include "call_state.hpp"
#include "epx/buffer.hpp"

namespace epx::detail {

class AsyncCall {
 public:
  virtual ~AsyncCall() { join(); }
  AsyncCall() = default;
  AsyncCall(const AsyncCall&) = delete;
  AsyncCall& operator=(const AsyncCall&) = delete;

  /// The call's result (DispatchResult or CombineResult), filled in by the halves.
  std::variant<std::monostate, DispatchResult, CombineResult> result;

  /// After the front half: registers with `calls` as the pending call and starts the thread.
  void start(CallState& calls, std::string name, Completion completion) {
    calls_ = &calls;
    completion_ = completion;
    calls.begin_async(this, std::move(name));
    thread_ = std::thread([this] {
      try {
        puts();
        if (completion_ == Completion::kBackground) back();
      } catch (...) {
        error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      thread_done_.store(true, std::memory_order_release);
      done_cv_.notify_all();
    });
  }
  bool finished() const noexcept { return finished_; }
  bool ready() const noexcept { return finished_ || thread_done_.load(std::memory_order_acquire); }
  /// Waits up to `timeout` for ready().
  bool wait_for(std::chrono::milliseconds timeout) {
    if (ready()) return true;
    std::unique_lock<std::mutex> lock(mutex_);
    return done_cv_.wait_for(lock, timeout, [&] { return thread_done_.load(std::memory_order_acquire); });
  }
  /// Joins the thread, runs the back half if it is due here, and rethrows the call's error.
  void finish() {
    if (finished_) throw Error(ErrorCode::kInvalidArgument, "finish(): this asynchronous call was already finished");
    join();
    finished_ = true;
    if (!error_ && completion_ == Completion::kAtFinish && calls_ != nullptr) {
      try {
        back();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    if (!error_ && calls_ == nullptr)
      error_ = std::make_exception_ptr(Error(ErrorCode::kBadHandle, "the Buffer was destroyed before this asynchronous call finished"));
    if (calls_ != nullptr) calls_->end_async();
    calls_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }
  /// The Buffer goes away: waits for the thread; the back half (if still due) never runs,
  /// and finish() throws.
  void abandon() noexcept {
    join();
    if (calls_ != nullptr) calls_->end_async();
    calls_ = nullptr;
  }

 protected:
  virtual void puts() = 0;  ///< on the call's thread
  virtual void back() = 0;  ///< on the call's thread (kBackground) or in finish() (kAtFinish)

 private:
  void join() noexcept {
    if (thread_.joinable()) thread_.join();
  }
  CallState* calls_ = nullptr;
  Completion completion_ = Completion::kBackground;
  std::thread thread_;
  std::atomic<bool> thread_done_{false};
  std::mutex mutex_;
  std::condition_variable done_cv_;
  std::exception_ptr error_;
  bool finished_ = false;
};

}  // namespace epx::detail
