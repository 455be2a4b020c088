#include "sim/sim_transport.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "epx/error.hpp"

namespace epx::detail {

namespace {

TransportCaps sim_caps(const sim::SimTransportOptions& o) {
  TransportCaps c = mapped_caps("sim");
  c.put_overhead_ns = o.put_overhead_ns;
  c.put_gbps = o.put_gbps;
  return c;
}

std::atomic<std::uint64_t> g_instances{0};

// Per thread: the last (transport instance, stream index) it used; avoids a lock per op.
struct StreamCache {
  std::uint64_t instance = 0;
  void* stream = nullptr;
  std::size_t index = 0;
};
thread_local StreamCache t_cache;

}  // namespace

SimTransport::SimTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout, SimShared* shared,
                           const sim::SimTransportOptions& options)
    : MappedTransport(control, rank, timeout, sim_caps(options)),
      shared_(shared),
      options_(options),
      instance_(++g_instances) {
  streams_.push_back(std::make_unique<Stream>());  // stream 0: the rank thread
  t_cache = {instance_, streams_[0].get(), 0};
}

void SimTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  bootstrap_barrier("allocate: enter");
  std::byte*& mine = control_->window_table()[rank()];
  std::size_t& mapped = shared_->mapped_bytes[static_cast<std::size_t>(rank())];
  if (mine != nullptr) munmap(mine, mapped);
  const std::size_t bytes = (segment_bytes(window_bytes, num_signals) + 4095) / 4096 * 4096;
  // Anonymous pages read as zero; only touched pages take memory.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorCode::kCapacityExceeded,
                "rank " + std::to_string(rank()) + ": cannot map a window of " + std::to_string(bytes) + " bytes");
  mine = static_cast<std::byte*>(p);
  mapped = bytes;
  payload_begin_ = payload_end_ = 0;
  bootstrap_barrier("allocate: published");
  std::vector<std::byte*> bases(control_->window_table(), control_->window_table() + num_ranks());
  set_segments(bases, window_bytes, num_signals);
  bootstrap_barrier("allocate: mapped");
}

void SimTransport::free_all(ControlBlock* control, const SimShared& shared) noexcept {
  for (int r = 0; r < control->num_ranks; ++r) {
    if (control->window_table()[r] != nullptr) munmap(control->window_table()[r], shared.mapped_bytes[static_cast<std::size_t>(r)]);
    control->window_table()[r] = nullptr;
  }
}

SimTransport::Stream& SimTransport::stream() {
  if (t_cache.instance == instance_) return *static_cast<Stream*>(t_cache.stream);
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.push_back(std::make_unique<Stream>());
  t_cache = {instance_, streams_.back().get(), streams_.size() - 1};
  return *streams_.back();
}

void SimTransport::record(sim::TraceOp op) {
  Stream& st = stream();
  sim::StreamTrace& s = st.trace;
  const std::size_t index = t_cache.index;
  op.call = call_.load(std::memory_order_acquire);
  if (index != 0) {
    // A worker: its ops follow the rank thread's latest completed wait (the fork point).
    const std::uint64_t dep = main_waits_.load(std::memory_order_acquire);
    if (dep != st.last_dep || s.ops.empty() || s.ops.back().call != op.call) {
      st.last_dep = dep;
      sim::TraceOp d;
      d.kind = sim::OpKind::kAfterMainWait;
      d.call = op.call;
      d.key = dep;
      s.ops.push_back(d);
    }
  }
  const bool sealed = std::exchange(st.sealed, false);
  if (op.kind == sim::OpKind::kPut && !s.ops.empty() && !sealed) {
    sim::TraceOp& last = s.ops.back();
    if (last.kind == sim::OpKind::kPut && last.peer == op.peer && last.queue == op.queue && last.call == op.call) {
      last.count += op.count;
      last.bytes += op.bytes;
      last.payload_bytes += op.payload_bytes;
      return;
    }
  }
  s.ops.push_back(op);
}

void SimTransport::record_put(int peer, std::size_t offset, std::size_t bytes, int queue) {
  sim::TraceOp op;
  op.kind = sim::OpKind::kPut;
  op.peer = peer;
  op.queue = static_cast<std::int16_t>(queue);
  op.count = 1;
  op.bytes = bytes;
  op.payload_bytes = in_payload(offset, bytes) ? bytes : 0;
  record(op);
}

void SimTransport::put(int peer, std::size_t offset, const void* src, std::size_t bytes, int queue) {
  record_put(peer, offset, bytes, queue);
  if (moves_payload() || !in_payload(offset, bytes)) MappedTransport::put(peer, offset, src, bytes, queue);
}

void SimTransport::put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                               int queue) {
  sim::TraceOp op;
  op.kind = sim::OpKind::kPutFlagged;
  op.peer = peer;
  op.queue = static_cast<std::int16_t>(queue);
  op.count = 1;
  op.bytes = bytes + sizeof(std::uint64_t);
  op.payload_bytes = in_payload(offset, bytes) ? bytes : 0;
  op.key = offset + bytes;
  op.value = flag;
  record(op);
  if (moves_payload() || !in_payload(offset, bytes))
    MappedTransport::put_flagged(peer, offset, src, bytes, flag, queue);
  else
    MappedTransport::put_flagged(peer, offset + bytes, src, 0, flag, queue);  // the flag alone
}

void SimTransport::signal(int peer, std::size_t slot, std::uint64_t value, int queue) {
  sim::TraceOp op;
  op.kind = sim::OpKind::kSignal;
  op.peer = peer;
  op.queue = static_cast<std::int16_t>(queue);
  op.key = slot;
  op.value = value;
  record(op);
  MappedTransport::signal(peer, slot, value, queue);
}

// Waits the engine makes inside a worker task (the rank thread runs worker 0's share):
// they block that stream only and are not fork points of the other workers. wait_flag
// (flag protocol receive) and read_signal (ring) are only ever called inside a task; of
// the wait_signal calls, the relay's (hierarchical schedule) is.
namespace {
bool in_task_phase(const char* phase) noexcept {
  return phase != nullptr && std::strcmp(phase, "dispatch relay") == 0;
}
}  // namespace

void SimTransport::count_main_wait() {
  if (t_cache.index != 0) return;
  stream().trace.ops.back().wait_index = main_waits_.load(std::memory_order_relaxed) + 1;
  main_waits_.fetch_add(1, std::memory_order_release);
}

void SimTransport::wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) {
  MappedTransport::wait_signal(slot, at_least, where);
  if (in_barrier_) return;
  sim::TraceOp op;
  op.kind = sim::OpKind::kWaitSignal;
  op.peer = where.peer;
  op.key = slot;
  op.value = at_least;
  record(op);
  if (!in_task_phase(where.phase)) count_main_wait();
}

void SimTransport::workers_joined() {
  if (&stream() != streams_[0].get()) return;  // only the rank thread joins
  const std::uint32_t call = call_.load(std::memory_order_acquire);
  // The workers are idle (the pool's join ordered their records before this).
  std::lock_guard<std::mutex> lock(streams_mutex_);
  sim::StreamTrace& main = streams_[0]->trace;
  for (std::size_t k = 1; k < streams_.size(); ++k) {
    Stream& w = *streams_[k];
    const std::size_t n = w.trace.ops.size();
    if (n == w.joined) continue;  // nothing new since the last join
    w.joined = n;
    w.sealed = true;
    sim::TraceOp op;
    op.kind = sim::OpKind::kJoin;
    op.call = call;
    op.peer = static_cast<std::int32_t>(k);
    op.key = n;
    main.ops.push_back(op);
  }
}

std::uint64_t SimTransport::read_signal(std::size_t slot) noexcept {
  const std::uint64_t v = MappedTransport::read_signal(slot);
  if (in_barrier_ || v == 0) return v;
  // A poll loop: what it observed is what its next decisions depend on. Only a value this
  // stream has not seen before is recorded (a wait for it in the replay); the replay
  // treats a value left from an earlier call as already there.
  Stream& st = stream();
  auto [it, fresh] = st.polled.try_emplace(slot, v);
  if (!fresh && it->second == v) return v;
  it->second = v;
  sim::TraceOp op;
  op.kind = sim::OpKind::kPollSignal;
  op.key = slot;
  op.value = v;
  record(op);
  return v;
}

void SimTransport::wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) {
  MappedTransport::wait_flag(offset, at_least, where);
  sim::TraceOp op;
  op.kind = sim::OpKind::kWaitFlag;
  op.peer = where.peer;
  op.key = offset;
  op.value = at_least;
  record(op);  // inside a worker task: not a fork point
}

void SimTransport::set_payload_region(std::size_t begin, std::size_t end) {
  payload_begin_ = std::min(begin, window_bytes());
  payload_end_ = std::min(end, window_bytes());
}

void SimTransport::quiet(int queue) {
  sim::TraceOp op;
  op.kind = sim::OpKind::kQuiet;
  op.queue = static_cast<std::int16_t>(queue);
  record(op);
  MappedTransport::quiet(queue);
}

void SimTransport::barrier(const char* phase) {
  in_barrier_ = true;
  try {
    MappedTransport::barrier(phase);
  } catch (...) {
    in_barrier_ = false;
    throw;
  }
  in_barrier_ = false;
  sim::TraceOp op;
  op.kind = sim::OpKind::kBarrier;
  record(op);
  count_main_wait();
}

int SimTransport::begin_call(const std::string& name) {
  call_names_.push_back(name);
  const auto index = static_cast<std::uint32_t>(call_names_.size() - 1);
  call_.store(index, std::memory_order_release);
  return static_cast<int>(index);
}

sim::RankTrace SimTransport::take_trace() {
  sim::RankTrace t;
  std::lock_guard<std::mutex> lock(streams_mutex_);
  for (auto& s : streams_) t.streams.push_back(std::move(s->trace));
  return t;
}

}  // namespace epx::detail

namespace epx::sim {

const char* to_string(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::kPut: return "put";
    case OpKind::kPutFlagged: return "put_flagged";
    case OpKind::kSignal: return "signal";
    case OpKind::kWaitSignal: return "wait_signal";
    case OpKind::kWaitFlag: return "wait_flag";
    case OpKind::kQuiet: return "quiet";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kAfterMainWait: return "after_main_wait";
    case OpKind::kJoin: return "join";
    case OpKind::kPollSignal: return "poll_signal";
  }
  return "?";
}

int sim_begin_call(Transport& transport, const std::string& name) {
  if (auto* s = dynamic_cast<detail::SimTransport*>(&transport)) return s->begin_call(name);
  return -1;
}

bool sim_saw_payload_region(const Transport& transport) noexcept {
  const auto* s = dynamic_cast<const detail::SimTransport*>(&transport);
  return s != nullptr && s->saw_payload_region();
}

PutTable summarize_puts(const Trace& trace, int call, int max_queues) {
  const auto P = static_cast<std::size_t>(trace.num_ranks);
  PutTable t(P, std::vector<std::vector<PutSummary>>(P, std::vector<PutSummary>(static_cast<std::size_t>(max_queues))));
  for (std::size_t r = 0; r < trace.ranks.size(); ++r)
    for (const StreamTrace& s : trace.ranks[r].streams)
      for (const TraceOp& op : s.ops) {
        if (op.kind != OpKind::kPut && op.kind != OpKind::kPutFlagged) continue;
        if (call >= 0 && op.call != static_cast<std::uint32_t>(call)) continue;
        PutSummary& e = t[r][static_cast<std::size_t>(op.peer)][static_cast<std::size_t>(op.queue)];
        e.puts += op.count;
        e.bytes += op.kind == OpKind::kPutFlagged ? op.bytes - sizeof(std::uint64_t) : op.bytes;
      }
  return t;
}

}  // namespace epx::sim
