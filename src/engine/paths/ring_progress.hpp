// The rings' progress loop, shared by the dispatch and combine ring paths
// (paths/dispatch_ring.cpp, paths/combine_ring.cpp): both sides of a ring run in one loop,
// which spins briefly while nothing moves, then yields (with more ranks than cores a pure
// spin starves the peer it waits for), and times out naming what it waits for.
#pragma once

#include <sched.h>

#include <chrono>
#include <string>

#include "epx/error.hpp"

namespace epx::detail {

// Nothing moved this round: spin a little, then give the core away (with more ranks than
// cores a pure spin starves the peer we wait for). False once `timeout` has passed.
class Idle {
 public:
  explicit Idle(std::chrono::milliseconds timeout) : timeout_(timeout) { reset(); }
  void reset() {
    spins_ = 0;
    deadline_ = std::chrono::steady_clock::now() + timeout_;
  }
  bool step() {
    if (++spins_ < 256) return true;
    sched_yield();
    return std::chrono::steady_clock::now() < deadline_;
  }

 private:
  std::chrono::milliseconds timeout_;
  int spins_ = 0;
  std::chrono::steady_clock::time_point deadline_;
};

struct Progress {
  bool pending = false;  // something is left to send or receive
  bool moved = false;    // this pass sent or received something
};

// Runs `pass` until nothing is pending, idling (spin, then yield) while nothing moves; after
// the timeout without movement throws naming the phase and what `waiting()` lists.
template <class Pass, class Waiting>
void progress_until_done(std::chrono::milliseconds timeout, int rank, const char* phase, int blame, Pass pass, Waiting waiting) {
  Idle idle(timeout);
  while (true) {
    const Progress p = pass();
    if (!p.pending) return;
    if (p.moved) {
      idle.reset();
      continue;
    }
    if (!idle.step())
      throw Error(ErrorCode::kTimeout, "rank " + std::to_string(rank) + ": timed out in phase '" + phase + "' waiting for" + waiting(), blame);
  }
}

}  // namespace epx::detail
