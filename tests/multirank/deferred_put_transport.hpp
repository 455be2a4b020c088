// A transport whose puts complete late, the way they do on an RDMA NIC or OpenSHMEM, over
// a real transport underneath. The mapped transports (threads, shm) complete every put on
// return, so an engine that forgets a quiet, reuses a put's source too early or reads rows
// before the signal that orders them still passes on them; here it gets wrong bits.
//
//   * put / put_flagged only record the put (source pointer, not a copy): the source is
//     read when the put is delivered, so the engine must keep it intact until quiet;
//   * a thread's puts on a queue are delivered at its quiet(queue), before its signal on
//     that queue when signals are ordered, and otherwise only when the thread blocks: a
//     wait that is not already satisfied, or a barrier (a NIC progresses meanwhile);
//   * delivery is in reverse issue order, so nothing may rely on the order of two puts;
//   * peers' memory is not mapped (no peer_window: combine pushes, never pulls).
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "epx/spi/support.hpp"
#include "multirank_support.hpp"

namespace epx::testing {

class DeferredPutTransport final : public ForwardingTransport {
 public:
  /// `ordered_signals`: a signal orders the thread's earlier puts on its queue (else the
  /// engine must quiet first). `flagged_puts`: offers data-as-flag blocks.
  DeferredPutTransport(Transport& t, bool ordered_signals, bool flagged_puts) : ForwardingTransport(t), t_(t) {
    caps_ = t.caps();
    caps_.name = "deferred";
    caps_.peer_memory_mapped = false;
    caps_.put_completes_on_return = false;
    caps_.ordered_signal_per_queue = ordered_signals;
    caps_.flagged_puts = flagged_puts;
  }
  /// The guarantee protocol `p`'s row relies on (spi::ProtocolRule::needs), and no other:
  /// the weakest deferred transport that runs it.
  DeferredPutTransport(Transport& t, Protocol p)
      : DeferredPutTransport(t, spi::rule(p).needs == &TransportCaps::ordered_signal_per_queue,
                             spi::rule(p).needs == &TransportCaps::flagged_puts) {}
  const TransportCaps& caps() const noexcept override { return caps_; }
  const std::byte* peer_window(int) const noexcept override { return nullptr; }

  void put(int peer, std::size_t off, const void* src, std::size_t bytes, int q) override {
    record({peer, off, src, bytes, false, 0}, q);
  }
  void put_flagged(int peer, std::size_t off, const void* src, std::size_t bytes, std::uint64_t flag, int q) override {
    record({peer, off, src, bytes, true, flag}, q);
  }
  void signal(int peer, std::size_t slot, std::uint64_t v, int q) override {
    if (caps_.ordered_signal_per_queue) deliver(q);
    t_.signal(peer, slot, v, q);
  }
  void quiet(int q) override {
    deliver(q);
    t_.quiet(q);
  }
  void wait_signal(std::size_t slot, std::uint64_t v, const WaitPoint& w) override {
    if (t_.read_signal(slot) >= v) return;
    deliver_all();
    t_.wait_signal(slot, v, w);
  }
  void wait_flag(std::size_t off, std::uint64_t v, const WaitPoint& w) override {
    std::atomic_ref<std::uint64_t> flag(*reinterpret_cast<std::uint64_t*>(t_.window() + off));
    if (flag.load(std::memory_order_acquire) >= v) return;
    deliver_all();
    t_.wait_flag(off, v, w);
  }
  void barrier(const char* phase) override {
    deliver_all();
    t_.barrier(phase);
  }
  /// Puts delivered so far on this rank (every thread).
  std::uint64_t delivered() const noexcept { return delivered_.load(); }

 private:
  struct Pending {
    int peer;
    std::size_t offset;
    const void* src;
    std::size_t bytes;
    bool flagged;
    std::uint64_t flag;
  };
  using Queues = std::map<int, std::vector<Pending>>;  // queue -> puts in issue order

  Queues& mine() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_[std::this_thread::get_id()];
  }
  void record(const Pending& p, int q) { mine()[q].push_back(p); }
  void deliver(int q) {
    std::vector<Pending>& list = mine()[q];
    for (auto it = list.rbegin(); it != list.rend(); ++it) {
      if (it->flagged)
        t_.put_flagged(it->peer, it->offset, it->src, it->bytes, it->flag, q);
      else
        t_.put(it->peer, it->offset, it->src, it->bytes, q);
    }
    delivered_ += list.size();
    list.clear();
  }
  void deliver_all() {
    for (auto& [q, list] : mine())
      if (!list.empty()) deliver(q);
  }

  Transport& t_;
  TransportCaps caps_;
  std::mutex mutex_;  // guards the map, not the lists: each thread touches only its own
  std::map<std::thread::id, Queues> pending_;
  std::atomic<std::uint64_t> delivered_{0};
};

/// Where a conformance case runs: a transport kind, or threads under a DeferredPutTransport.
struct TestTransport {
  TransportKind kind = TransportKind::kThreads;
  bool deferred = false;
  std::string name() const { return deferred ? "deferred" : to_string(kind); }
};
inline void PrintTo(const TestTransport& t, std::ostream* os) { *os << t.name(); }
inline const std::vector<TestTransport> kConformanceTransports = {
    {TransportKind::kThreads}, {TransportKind::kShm}, {TransportKind::kSim}, {TransportKind::kThreads, true}};

/// launch() on `where`; a deferred transport orders signals after puts only if asked (the
/// tail protocol needs it; without it the explicit protocol's quiets are what count).
template <class RankFn>
void launch_on(const TestTransport& where, LaunchOptions lo, RankFn&& fn, bool ordered_signals = false) {
  lo.transport = where.kind;
  if (!where.deferred) return launch(lo, fn);
  launch(lo, [&](Transport& t) {
    DeferredPutTransport deferred(t, ordered_signals, true);
    fn(deferred);
  });
}

}  // namespace epx::testing
