// One asynchronous dispatch or combine (Buffer::dispatch_async / combine_async): the
// call's front half ran on the caller's thread; a thread of its own issues the puts (the
// Buffer's worker pool, as in a synchronous call, with this thread as worker 0) and, with
// Completion::kBackground, runs the back half right after; with kAtFinish the back half
// runs in finish(). A step the thread has not begun when the caller waits (a busy machine
// may not have run it yet) is run by the caller instead: each step is claimed once, by
// whoever comes first. The Buffer's call state knows the call while it is pending.
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
      if (!claim(kIssued)) return;  // the caller came first and took the puts
      run(kPutting);
      if (completion_ == Completion::kBackground && claim(kPut)) run(kBacking);
    });
  }
  bool finished() const noexcept { return finished_; }
  bool ready() const noexcept {
    const int s = stage_.load(std::memory_order_acquire);
    return finished_ || s == kDone || (completion_ == Completion::kAtFinish && s == kPut) ||
           abandoned_.load(std::memory_order_acquire);  // the Buffer is gone: finish() throws at once
  }
  /// Waits up to `timeout` for ready(). A step epx's thread has not begun yet (on a busy
  /// machine it may not have run at all) runs here instead, before the wait.
  bool wait_for(std::chrono::milliseconds timeout) {
    help();
    std::unique_lock<std::mutex> lock(mutex_);
    return done_cv_.wait_for(lock, timeout, [&] { return ready(); });
  }
  /// Joins the thread (running here what it has not begun), runs the back half if it is due
  /// here, and rethrows the call's error.
  void finish() {
    if (finished_) throw Error(ErrorCode::kInvalidArgument, "finish(): this asynchronous call was already finished");
    if (calls_ != nullptr) help();
    join();
    finished_ = true;
    if (calls_ != nullptr && claim(kPut)) run(kBacking);  // kAtFinish (or the thread's back half was taken)
    if (!error_ && calls_ == nullptr)
      error_ = std::make_exception_ptr(Error(ErrorCode::kBadHandle, "the Buffer was destroyed before this asynchronous call finished"));
    if (calls_ != nullptr) calls_->end_async();
    calls_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }
  /// The Buffer goes away: waits for the thread; what it had not begun never runs, and
  /// finish() throws.
  void abandon() noexcept {
    abandoned_.store(true, std::memory_order_release);  // nothing more is claimed
    join();
    if (calls_ != nullptr) calls_->end_async();
    calls_ = nullptr;
  }

 protected:
  virtual void puts() = 0;  ///< on the call's thread
  virtual void back() = 0;  ///< on the call's thread (kBackground) or in finish() (kAtFinish)

 private:
  // The steps, each run by whoever claims it first: the call's thread or the caller.
  enum Stage : int { kIssued, kPutting, kPut, kBacking, kDone };
  bool claim(int from) noexcept {
    return !abandoned_.load(std::memory_order_acquire) && stage_.compare_exchange_strong(from, from + 1, std::memory_order_acq_rel);
  }
  /// Runs the claimed step `running` (kPutting: puts, kBacking: back) and publishes its end.
  void run(int running) {
    try {
      if (running == kPutting) puts();
      else back();
    } catch (...) {
      error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    stage_.store(error_ || running == kBacking ? kDone : kPut, std::memory_order_release);
    done_cv_.notify_all();
  }
  /// The caller's turn: the puts if nobody began them, and (kBackground) the back half.
  void help() {
    if (claim(kIssued)) run(kPutting);
    if (completion_ == Completion::kBackground && claim(kPut)) run(kBacking);
  }
  void join() noexcept {
    if (thread_.joinable()) thread_.join();
  }
  CallState* calls_ = nullptr;
  Completion completion_ = Completion::kBackground;
  std::thread thread_;
  std::atomic<int> stage_{kIssued};
  std::atomic<bool> abandoned_{false};
  std::mutex mutex_;
  std::condition_variable done_cv_;
  std::exception_ptr error_;
  bool finished_ = false;
};

}  // namespace epx::detail
