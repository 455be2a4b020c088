// epx/sim/events.hpp — the discrete-event core: a binary-heap queue of typed events ordered
// by (time, sequence number). Events at the same time run in the order they were
// scheduled, so a run is deterministic (no dependence on heap internals or addresses).
//
//   EventQueue<std::variant<A, B>> q;
//   q.schedule(t, A{...});
//   q.run([&](Picoseconds now, auto& event) { ... may schedule more ... });
#pragma once

#include <cstdint>
#include <queue>
#include <utility>
#include <vector>

#include "epx/sim/units.hpp"

namespace epx::sim {

template <class Event>
class EventQueue {
 public:
  /// Schedules `event` at `time` (never before now(): that would break causality).
  void schedule(Picoseconds time, Event event) {
    if (time < now_) time = now_;
    heap_.push(Entry{time, next_seq_++, std::move(event)});
  }

  bool empty() const noexcept { return heap_.empty(); }
  std::size_t size() const noexcept { return heap_.size(); }
  Picoseconds now() const noexcept { return now_; }
  std::uint64_t processed() const noexcept { return processed_; }

  /// Removes the earliest event (ties: the earliest scheduled); false when empty.
  bool pop(Picoseconds& time, Event& event) {
    if (heap_.empty()) return false;
    // top() is const; the entry is copied out once (events are small PODs / variants).
    Entry e = heap_.top();
    heap_.pop();
    now_ = e.time;
    time = e.time;
    event = std::move(e.event);
    ++processed_;
    return true;
  }

  /// Pops and handles events until the queue is empty.
  template <class Handler>
  void run(Handler&& handle) {
    Picoseconds t;
    Event e;
    while (pop(t, e)) handle(t, e);
  }

 private:
  struct Entry {
    Picoseconds time;
    std::uint64_t seq;
    Event event;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const noexcept {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, Later> heap_;
  Picoseconds now_{0};
  std::uint64_t next_seq_ = 0;
  std::uint64_t processed_ = 0;
};

}  // namespace epx::sim
