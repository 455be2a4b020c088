// Ranks a test starts itself (a connect()-ed group that no launcher started, and processes
// that join it later): ForkHub is their rendezvous — the bootstrap's all-gather (and a shm
// group connected over it), a few flags and a short text (a door's name) — in an anonymous
// shared mapping made before the forks;
// ForkedRanks starts each process running a body, waits for it, and kills and reaps every one
// not waited for when it goes out of scope, so a test that stops early (a failed ASSERT)
// leaves no process behind.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"

namespace epx::testing {

class ForkHub {
 public:
  static constexpr int kMaxRanks = 8;
  static constexpr std::size_t kBytes = 512;  // a rank's all-gather contribution at most
  static constexpr int kFlags = 4;

  /// A hub for `ranks` bootstrapped ranks (processes that join later use only flags and text).
  explicit ForkHub(int ranks) : ranks_(ranks) {
    if (ranks < 1 || ranks > kMaxRanks) throw std::invalid_argument("the test's hub takes 1 to 8 ranks");
    void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) throw std::runtime_error("the test's hub: mmap failed");
    s_ = new (mem) Shared();
  }
  ~ForkHub() { munmap(s_, sizeof(Shared)); }
  ForkHub(const ForkHub&) = delete;
  ForkHub& operator=(const ForkHub&) = delete;

  /// Rank r's all-gather for a FunctionBootstrap (called in that rank's process).
  FunctionBootstrap::AllgatherFn allgather(int r) {
    return [this, r](const void* in, void* out, std::size_t bytes) {
      if (bytes > kBytes) throw std::runtime_error("the test's bootstrap hub takes 512 bytes a rank");
      std::memcpy(s_->data[r], in, bytes);
      barrier();
      for (int q = 0; q < ranks_; ++q) std::memcpy(static_cast<char*>(out) + q * bytes, s_->data[q], bytes);
      barrier();  // nobody overwrites its slot before every rank has read it
    };
  }

  /// Rank r's transport of a connect()-ed shm group bootstrapped over this hub (called in
  /// that rank's process; the bootstrap lives as long as the hub, in that process).
  std::unique_ptr<Transport> connect_shm(int r, std::chrono::milliseconds timeout) {
    bootstrap_ = std::make_unique<FunctionBootstrap>(r, ranks_, allgather(r), "test-fork");
    ConnectOptions o;
    o.kind = ConnectKind::kShm;
    o.timeout = timeout;
    return connect(*bootstrap_, o);
  }

  /// Returns when all `ranks` processes have called it (60 s at most, then throws).
  void barrier() {
    const std::uint32_t g = s_->generation.load(std::memory_order_acquire);
    if (s_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(ranks_)) {
      s_->arrived.store(0, std::memory_order_relaxed);
      s_->generation.fetch_add(1, std::memory_order_release);
      return;
    }
    wait_until([&] { return s_->generation.load(std::memory_order_acquire) != g; },
               "the test's bootstrap hub timed out", std::chrono::microseconds(200));
  }

  void set_flag(int i) { s_->flags[i].store(1, std::memory_order_release); }
  /// Waits (60 s at most) for flag i; `never` is the error's text if it does not come.
  void wait_flag(int i, const char* never) {
    wait_until([&] { return s_->flags[i].load(std::memory_order_acquire) != 0; }, never,
               std::chrono::milliseconds(1));
  }

  /// A short text for the other processes (set it before setting the flag that announces it).
  void set_text(const std::string& t) { std::snprintf(s_->text, sizeof s_->text, "%s", t.c_str()); }
  std::string text() const { return s_->text; }

 private:
  struct Shared {
    std::atomic<std::uint32_t> arrived{0}, generation{0};
    std::atomic<std::uint32_t> flags[kFlags] = {};
    char text[128] = {};
    char data[kMaxRanks][kBytes];
  };

  template <class Done, class Pause>
  static void wait_until(Done done, const char* never, Pause pause) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error(never);
      std::this_thread::sleep_for(pause);
    }
  }

  Shared* s_ = nullptr;
  int ranks_;
  std::unique_ptr<FunctionBootstrap> bootstrap_;
};

class ForkedRanks {
 public:
  ForkedRanks() = default;
  ForkedRanks(const ForkedRanks&) = delete;
  ForkedRanks& operator=(const ForkedRanks&) = delete;
  /// Every process not waited for is killed and reaped.
  ~ForkedRanks() {
    for (pid_t pid : running_) ::kill(pid, SIGKILL);
    for (pid_t pid : running_) ::waitpid(pid, nullptr, 0);
  }

  /// Runs body() in a forked process that exits 0 if it returned, 1 if it threw (the error on
  /// stderr, after `who: ` if given); returns its pid.
  template <class Body>
  pid_t start(Body body, const std::string& who = "") {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("the test could not fork");
    if (pid != 0) {
      running_.push_back(pid);
      return pid;
    }
    int code = 0;
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s%s%s\n", who.c_str(), who.empty() ? "" : ": ", e.what());
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }

  /// Waits for the process `pid` to end: its wait status.
  int wait(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    running_.erase(std::remove(running_.begin(), running_.end(), pid), running_.end());
    return status;
  }

  static bool exited_0(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  static bool killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

 private:
  std::vector<pid_t> running_;
};

}  // namespace epx::testing
