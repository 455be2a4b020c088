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
  c.one_sided_get = false;  // the model has puts only: no in-place reads (peer_window) and no gets
  return c;
}

std::atomic<std::uint64_t> g_instances{0};

}  // namespace

struct SimRecorder {
  struct Stream {
    sim::StreamTrace trace;
    std::uint64_t last_dep = 0;  // the main wait its last op followed
    std::size_t joined = 0;      // worker: ops the rank thread's latest join waits for
    bool sealed = false;         // worker: a join follows its last op (no put merges into it)
    std::unordered_map<std::uint64_t, std::uint64_t> polled;  // key -> last value read_signal saw
  };
  std::uint64_t instance = ++g_instances;  // tells this recorder's thread-local cache entries apart
  std::mutex streams_mutex;
  std::vector<std::unique_ptr<Stream>> streams;
  std::atomic<std::uint32_t> call{0};
  std::atomic<std::uint64_t> main_waits{0};  // completed waits of the rank thread
  std::vector<std::string> call_names{"setup"};
  std::atomic<bool> saw_payload{false};
  unsigned endpoints = 0;  // endpoints opened on this rank (the rank thread only)

  Stream& stream();  // the calling thread's stream (creates it on first use)
  std::size_t index() const;  // the calling thread's stream index (after stream())
};

namespace {
// Per thread: the last (recorder, stream index) it used; avoids a lock per op.
struct StreamCache {
  std::uint64_t instance = 0;
  void* stream = nullptr;
  std::size_t index = 0;
};
thread_local StreamCache t_cache;
}  // namespace

SimRecorder::Stream& SimRecorder::stream() {
  if (t_cache.instance == instance) return *static_cast<Stream*>(t_cache.stream);
  std::lock_guard<std::mutex> lock(streams_mutex);
  streams.push_back(std::make_unique<Stream>());
  t_cache = {instance, streams.back().get(), streams.size() - 1};
  return *streams.back();
}

std::size_t SimRecorder::index() const { return t_cache.index; }

SimTransport::SimTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout, SimShared* shared,
                           const sim::SimTransportOptions& options)
    : MappedTransport(control, rank, timeout, sim_caps(options)),
      shared_(shared),
      options_(options),
      rec_(std::make_shared<SimRecorder>()) {
  rec_->streams.push_back(std::make_unique<SimRecorder::Stream>());  // stream 0: the rank thread
  t_cache = {rec_->instance, rec_->streams[0].get(), 0};
}

SimTransport::SimTransport(const SimTransport& parent, unsigned endpoint)
    : MappedTransport(parent.control_block(), parent.rank(), parent.timeout(), sim_caps(parent.options_)),
      shared_(parent.shared_),
      options_(parent.options_),
      rec_(parent.rec_),
      key_tag_(static_cast<std::uint64_t>(endpoint) << 40),
      endpoint_(true) {
  inherit_from(parent);
}

SimTransport::~SimTransport() {
  if (endpoint_) let_go();
}

std::unique_ptr<Transport> SimTransport::open_endpoint() {
  return std::unique_ptr<Transport>(new SimTransport(*this, ++rec_->endpoints));
}

void SimTransport::let_go() noexcept {
  if (mine_ == nullptr) return;
  std::lock_guard<std::mutex> lock(shared_->graveyard_mutex);
  shared_->graveyard.emplace_back(mine_, mine_bytes_);
  mine_ = nullptr;
}

void SimTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  const bool release = window_bytes == 0 && num_signals == 0;
  if (!release) bootstrap_barrier("allocate: enter");
  std::byte*& slot = control_->window_table()[rank()];
  std::size_t& mapped = shared_->mapped_bytes[static_cast<std::size_t>(rank())];
  if (endpoint_) {
    let_go();
  } else if (slot != nullptr) {  // the parent's own mapping (free_all unmaps the last one)
    munmap(slot, mapped);
    slot = nullptr;
  }
  clear_segments();
  payload_begin_ = payload_end_ = 0;
  if (release) return;
  const std::size_t bytes = (segment_bytes(window_bytes, num_signals) + 4095) / 4096 * 4096;
  // Anonymous pages read as zero; only touched pages take memory.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorCode::kCapacityExceeded,
                "rank " + std::to_string(rank()) + ": cannot map a window of " + std::to_string(bytes) + " bytes");
  std::byte* const parents = slot;
  slot = static_cast<std::byte*>(p);
  if (endpoint_)
    mine_ = slot, mine_bytes_ = bytes;
  else
    mapped = bytes;
  bootstrap_barrier("allocate: published");
  std::vector<std::byte*> bases(control_->window_table(), control_->window_table() + num_ranks());
  set_segments(bases, window_bytes, num_signals);
  bootstrap_barrier("allocate: mapped");
  if (endpoint_) slot = parents;  // the table entry is the parent's again (free_all unmaps it)
}

void SimTransport::free_all(ControlBlock* control, SimShared& shared) noexcept {
  for (int r = 0; r < control->num_ranks; ++r) {
    if (control->window_table()[r] != nullptr) munmap(control->window_table()[r], shared.mapped_bytes[static_cast<std::size_t>(r)]);
    control->window_table()[r] = nullptr;
  }
  std::lock_guard<std::mutex> lock(shared.graveyard_mutex);
  for (auto [p, bytes] : shared.graveyard) munmap(p, bytes);
  shared.graveyard.clear();
}

void SimTransport::record(sim::TraceOp op) {
  SimRecorder::Stream& st = rec_->stream();
  sim::StreamTrace& s = st.trace;
  const std::size_t index = rec_->index();
  op.call = rec_->call.load(std::memory_order_acquire);
  if (index != 0) {
    // A worker: its ops follow the rank thread's latest completed wait (the fork point).
    const std::uint64_t dep = rec_->main_waits.load(std::memory_order_acquire);
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
  op.key = key(offset + bytes);
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
  op.key = key(slot);
  op.value = value;
  record(op);
  MappedTransport::signal(peer, slot, value, queue);
}

// Waits the engine makes inside a worker task (the rank thread runs worker 0's share):
// they block that stream only and are not fork points of the other workers. wait_flag
// (flag protocol receive) and read_signal (ring) are only ever called inside a task; of
// the wait_signal calls, the relays' (hierarchical schedule: a source's rows, or a relay
// chunk in either direction, paths/relay_chunks.hpp) are.
namespace {
bool in_task_phase(const char* phase) noexcept {
  if (phase == nullptr) return false;
  for (const char* in_task : {"dispatch relay", "dispatch relay chunk", "combine relay chunk"})
    if (std::strcmp(phase, in_task) == 0) return true;
  return false;
}
}  // namespace

void SimTransport::count_main_wait() {
  SimRecorder::Stream& st = rec_->stream();
  if (rec_->index() != 0) return;
  st.trace.ops.back().wait_index = rec_->main_waits.load(std::memory_order_relaxed) + 1;
  rec_->main_waits.fetch_add(1, std::memory_order_release);
}

void SimTransport::wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) {
  MappedTransport::wait_signal(slot, at_least, where);
  if (in_barrier_) return;
  sim::TraceOp op;
  op.kind = sim::OpKind::kWaitSignal;
  op.peer = where.peer;
  op.key = key(slot);
  op.value = at_least;
  record(op);
  if (!in_task_phase(where.phase)) count_main_wait();
}

void SimTransport::workers_joined() {
  if (&rec_->stream() != rec_->streams[0].get()) return;  // only the rank thread joins
  const std::uint32_t call = rec_->call.load(std::memory_order_acquire);
  // The workers are idle (the pool's join ordered their records before this).
  std::lock_guard<std::mutex> lock(rec_->streams_mutex);
  sim::StreamTrace& main = rec_->streams[0]->trace;
  for (std::size_t k = 1; k < rec_->streams.size(); ++k) {
    SimRecorder::Stream& w = *rec_->streams[k];
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
  // stream has not seen before is recorded (a wait for it in the model's timing); the
  // timing treats a value left from an earlier call as already there.
  SimRecorder::Stream& st = rec_->stream();
  auto [it, fresh] = st.polled.try_emplace(key(slot), v);
  if (!fresh && it->second == v) return v;
  it->second = v;
  sim::TraceOp op;
  op.kind = sim::OpKind::kPollSignal;
  op.key = key(slot);
  op.value = v;
  record(op);
  return v;
}

void SimTransport::wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) {
  MappedTransport::wait_flag(offset, at_least, where);
  sim::TraceOp op;
  op.kind = sim::OpKind::kWaitFlag;
  op.peer = where.peer;
  op.key = key(offset);
  op.value = at_least;
  record(op);  // inside a worker task: not a fork point
}

void SimTransport::set_payload_region(std::size_t begin, std::size_t end) {
  payload_begin_ = std::min(begin, window_bytes());
  payload_end_ = std::min(end, window_bytes());
  if (payload_end_ > payload_begin_) rec_->saw_payload.store(true, std::memory_order_relaxed);
}

bool SimTransport::saw_payload_region() const noexcept { return rec_->saw_payload.load(std::memory_order_relaxed); }

std::vector<std::string> SimTransport::call_names() const { return rec_->call_names; }

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
  rec_->call_names.push_back(name);
  const auto index = static_cast<std::uint32_t>(rec_->call_names.size() - 1);
  rec_->call.store(index, std::memory_order_release);
  return static_cast<int>(index);
}

sim::RankTrace SimTransport::take_trace() {
  sim::RankTrace t;
  std::lock_guard<std::mutex> lock(rec_->streams_mutex);
  for (auto& s : rec_->streams) t.streams.push_back(std::move(s->trace));
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
