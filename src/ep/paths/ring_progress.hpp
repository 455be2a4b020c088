// The rings' progress loop, shared by the dispatch and combine ring paths
// (paths/dispatch_ring.cpp, paths/combine_ring.cpp): both sides of a ring run in one loop,
// which idles by epx's one wait policy while nothing moves (spi::Backoff: spin briefly, then
// yield; with more ranks than cores a pure spin starves the peer it waits for), and times out
// naming what it waits for.
#pragma once

#include <chrono>
#include <string>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"

namespace epx::detail {

struct Progress {
  bool pending = false;  // something is left to send or receive
  bool moved = false;    // this pass sent or received something
};

// Runs `pass` until nothing is pending, idling (spin, then yield) while nothing moves; after
// the timeout without movement throws naming the phase and what `waiting()` lists.
template <class Pass, class Waiting>
void progress_until_done(std::chrono::milliseconds timeout, int rank, const char* phase, int blame, Pass pass, Waiting waiting) {
  spi::Backoff idle(timeout);
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
