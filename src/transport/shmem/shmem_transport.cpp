// The shmem transport's data path (shmem_transport.hpp): its blocks of the symmetric heap,
// puts, gets, signals, waits, quiet and barrier. The runtime, the bootstrap and connect are
// in shmem_runtime.cpp; the watchdog, the SIGTERM line and the errors naming a peer in
// shmem_faults.cpp; losing PEs in shmem_elastic.cpp.
#include "shmem/shmem_transport.hpp"

#include <shmem.h>

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"
#include "epx/spi/copy.hpp"
#include "epx/spi/resources.hpp"
#include "shmem/shmem_elastic.hpp"
#include "shmem/shmem_runtime.hpp"

// Open MPI's progress engine (libopen-pal): OpenSHMEM 1.4 has no call that only progresses,
// and shmem_ulong_test does not; liboshmem registers its UCX worker with it.
extern "C" int opal_progress(void);

namespace epx::detail {

namespace {

constexpr std::size_t kPage = 4096;
// Pauses a network wait takes before it yields (spi::Backoff): each look also progresses UCX
// (opal_progress), so a look costs more than a mapped transport's and it spins less.
constexpr int kNetworkSpins = 64;
constexpr std::size_t kProgressEveryBytes = std::size_t{256} << 10;  // of copies to mapped peers, when some peer is not
std::size_t round_page(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

ShmemTransport::ShmemTransport(std::shared_ptr<ShmemRuntime> runtime, const NodeMap& nodes,
                               std::chrono::milliseconds timeout, std::size_t heap_bytes)
    : runtime_(std::move(runtime)),
      heap_bytes_(heap_bytes),
      rank_(shmem_my_pe()),
      num_ranks_(shmem_n_pes()),
      node_of_rank_(nodes.node_of_rank),
      timeout_(timeout),
      puts_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      put_bytes_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      payload_bytes_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      outstanding_(new std::atomic<bool>[static_cast<std::size_t>(num_ranks_)]),
      unprobed_(new std::atomic<bool>[static_cast<std::size_t>(num_ranks_)]) {
  // Which peers' heaps shmem_ptr maps here (a probe block; the answer is per peer, not per block).
  auto* probe = static_cast<std::byte*>(shmem_malloc(kPage));
  if (probe == nullptr)
    throw Error(ErrorCode::kCapacityExceeded, "rank " + std::to_string(rank_) + ": shmem: shmem_malloc of a probe page failed");
  mapped_.assign(static_cast<std::size_t>(num_ranks_), false);
  for (int p = 0; p < num_ranks_; ++p) mapped_[static_cast<std::size_t>(p)] = p == rank_ || shmem_ptr(probe, p) != nullptr;
  shmem_free(probe);
  if (!ShmemRuntime::lost()) runtime_->set_pes(node_of_rank_, mapped_);  // for groups over any PEs (shmem_join.cpp)
  pe_.resize(static_cast<std::size_t>(num_ranks_));
  for (int p = 0; p < num_ranks_; ++p) pe_[static_cast<std::size_t>(p)] = p;
  control_ = runtime_->control();
  const bool all_mapped = std::all_of(mapped_.begin(), mapped_.end(), [](bool m) { return m; });
  caps_.name = "shmem";
  caps_.peer_memory_mapped = all_mapped;
  caps_.ordered_signal_per_queue = true;  // shmem_fence before the signal's atomic set
  caps_.put_completes_on_return = all_mapped;
  caps_.max_queues = 64;                  // queues are labels here: quiet completes all of them
  caps_.flagged_puts = true;              // bytes, shmem_fence, atomic set of the flag
  caps_.one_sided_get = true;             // shmem_getmem_nbi, completed by shmem_quiet
  for (int p = 0; p < num_ranks_; ++p) reset_counters(p), outstanding_[static_cast<std::size_t>(p)] = false, unprobed_[static_cast<std::size_t>(p)] = false;
  install_term_note();
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

ShmemTransport::ShmemTransport(ShmemTransport& parent, int)
    : runtime_(parent.runtime_),
      control_(parent.control_),
      pe_(parent.pe_),
      lineage_(parent.lineage_),
      group_(parent.group_),  // retired with its group
      heap_bytes_(parent.heap_bytes_),
      parent_(&parent),
      rank_(parent.rank_),
      num_ranks_(parent.num_ranks_),
      node_of_rank_(parent.node_of_rank_),
      timeout_(parent.timeout_),
      caps_(parent.caps_),
      mapped_(parent.mapped_),
      puts_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      put_bytes_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      payload_bytes_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      outstanding_(new std::atomic<bool>[static_cast<std::size_t>(num_ranks_)]),
      unprobed_(new std::atomic<bool>[static_cast<std::size_t>(num_ranks_)]) {
  for (int p = 0; p < num_ranks_; ++p) reset_counters(p), outstanding_[static_cast<std::size_t>(p)] = false, unprobed_[static_cast<std::size_t>(p)] = false;
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

std::unique_ptr<Transport> ShmemTransport::open_endpoint() {
  require_live("open_endpoint");
  return std::unique_ptr<Transport>(new ShmemTransport(*this, 0));
}

ShmemTransport& ShmemTransport::term_root() noexcept {
  ShmemTransport* t = this;
  while (t->parent_ != nullptr) t = t->parent_;
  return *t;
}

// On this transport (its watchdog) and on the root (the SIGTERM line: shmem_quiet completes
// every endpoint's puts).
void ShmemTransport::mark_outstanding(int peer) noexcept {
  const auto p = static_cast<std::size_t>(peer);
  outstanding_[p].store(true, std::memory_order_relaxed);
  term_root().outstanding_[p].store(true, std::memory_order_relaxed);
}

void ShmemTransport::note(const char* phase, int peer) noexcept {
  last_phase_.store(phase, std::memory_order_relaxed);
  last_peer_.store(peer, std::memory_order_relaxed);
  if (parent_ != nullptr) parent_->note(phase, peer);
}

ShmemTransport::~ShmemTransport() {
  remove_term_note();
  if (parent_ == nullptr) release_heap();
  else if (base_ != nullptr) {
    // An endpoint's block stays in the heap (a free is collective; the buffer's destroy()
    // frees it where every rank does), free for a group rebuilt after a loss.
    runtime_->orphan_block(base_);
    runtime_->heap_in_use() -= block_bytes_;
  }
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stop_watch_ = true;
  }
  watch_cv_.notify_all();
  watchdog_.join();
}

template <class F>
void ShmemTransport::guarded(const char* call, int peer, F&& f) {
  std::list<Blocking>::iterator it;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    it = blocking_.insert(blocking_.end(), Blocking{std::chrono::steady_clock::now(), call, peer});
  }
  ShmemTransport& term = term_root();  // the SIGTERM line reads the transport it was installed on
  term.blocked_call_.store(call, std::memory_order_relaxed);
  term.blocked_peer_.store(peer, std::memory_order_relaxed);
  term.blocked_.fetch_add(1, std::memory_order_relaxed);
  // Also when f throws (a probe that sees a member gone): the watchdog must not fire later for
  // a call that has ended.
  struct Unblock {
    ShmemTransport& self;
    ShmemTransport& term;
    std::list<Blocking>::iterator it;
    ~Unblock() {
      term.blocked_.fetch_sub(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(self.watch_mu_);
      self.blocking_.erase(it);
    }
  } unblock{*this, term, it};
  f();
}

void ShmemTransport::release_heap() noexcept {
  // A rank that ends on an error of its own (not a peer loss) after a member died has not
  // marked the runtime failed: the collective free would wait for the dead PE until the
  // launcher's timeout. Such a member ends the teardown's collective calls too.
  if (base_ != nullptr && !ShmemRuntime::failed() && !ShmemRuntime::lost() && member_known_gone()) ShmemRuntime::mark_failed();
  if (base_ != nullptr && !ShmemRuntime::failed() && !ShmemRuntime::lost()) {
    shmem_quiet();
    shmem_free(base_);  // collective
    runtime_->unregister_block(base_);
  } else if (base_ != nullptr) {
    runtime_->orphan_block(base_);  // kept: a group rebuilt over the survivors reuses it
  }
  if (base_ != nullptr) runtime_->heap_in_use() -= block_bytes_;
  base_ = nullptr;
  block_bytes_ = 0;
  peer_base_.clear();
}

void ShmemTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  if (window_bytes == 0 && num_signals == 0) return release_heap();
  require_live("allocate");
  release_heap();
  make_block(window_bytes, num_signals);
}

void ShmemTransport::make_block(std::size_t window_bytes, std::size_t num_signals) {
  signal_offset_ = round_page(window_bytes);
  // The signals, the barrier's P slots, and the beacon word that quiet_timed reads (1).
  const std::size_t bytes = signal_offset_ + (num_signals + static_cast<std::size_t>(num_ranks_) + 1) * sizeof(std::uint64_t);
  if (ShmemRuntime::lost()) {
    reuse_block(bytes);  // zeroed, the same block on every member, which all reached it
  } else {
    check_heap(bytes);
    base_ = static_cast<std::byte*>(shmem_malloc(bytes));  // collective, the same size on every PE
    if (base_ == nullptr)
      throw Error(ErrorCode::kCapacityExceeded, "rank " + std::to_string(rank_) + ": shmem: shmem_malloc(" +
                                                    format_bytes(bytes) + ") failed: " + heap_advice(bytes));
    block_bytes_ = bytes;
    runtime_->register_block(base_, bytes);
    runtime_->heap_in_use() += bytes;
    std::memset(base_, 0, bytes);  // zeroed and pre-faulted
  }
  *signal_word(base_, num_signals + static_cast<std::size_t>(num_ranks_)) = 1;  // the beacon
  peer_base_.assign(static_cast<std::size_t>(num_ranks_), nullptr);
  for (int p = 0; p < num_ranks_; ++p)
    if (mapped_[static_cast<std::size_t>(p)])
      peer_base_[static_cast<std::size_t>(p)] = p == rank_ ? base_ : static_cast<std::byte*>(shmem_ptr(base_, pe(p)));
  window_bytes_ = window_bytes;
  num_signals_ = num_signals;
  barrier_epoch_ = 0;
  payload_begin_ = payload_end_ = 0;
  // Counters run from the transport's construction (peer_info: take differences).
  if (ShmemRuntime::lost()) control_barrier("allocate");  // every member zeroed its block before anyone writes into it
  else shmem_barrier_all();
}

// Every PE allocates the same blocks and knows the same (agreed) heap, so a block that does
// not fit is refused on every PE alike, before the collective shmem_malloc: a PE whose
// shmem_malloc alone failed would leave the others in its barrier with no deadline.
void ShmemTransport::check_heap(std::size_t bytes) const {
  constexpr std::size_t kSlack = std::size_t{8} << 20;  // the runtime's own blocks (probe, all-gathers) and headers
  if (heap_bytes_ == 0) return;                         // the launcher's heap value did not parse: shmem_malloc decides
  const std::size_t in_use = runtime_->heap_in_use().load();
  if (in_use + bytes + kSlack <= heap_bytes_) return;
  throw Error(ErrorCode::kCapacityExceeded,
              "rank " + std::to_string(rank_) + ": shmem: a window of " + format_bytes(bytes) +
                  " does not fit in the symmetric heap: " + heap_advice(bytes));
}

std::string ShmemTransport::heap_advice(std::size_t bytes) const {
  const std::size_t in_use = runtime_->heap_in_use().load();
  const std::size_t need = in_use + bytes + (std::size_t{64} << 20);
  return "the heap is " + (heap_bytes_ ? format_bytes(heap_bytes_) : std::string("of unknown size")) + " per PE (" +
         runtime_->heap_from() + (heap_bytes_ ? "; the smallest of every PE's" : "") + "), epx's windows hold " +
         format_bytes(in_use) + " of it. Give it at least " + format_bytes(need) +
         ": epx::ShmemOptions::heap_bytes, or oshrun -x SMA_SYMMETRIC_SIZE=" + std::to_string(need >> 20) +
         "M (Open MPI 4.1 reads SMA_SYMMETRIC_SIZE or SHMEM_SYMMETRIC_HEAP_SIZE, not SHMEM_SYMMETRIC_SIZE)";
}

std::uint64_t* ShmemTransport::signal_word(std::byte* base, std::size_t slot) const noexcept {
  return reinterpret_cast<std::uint64_t*>(base + signal_offset_) + slot;
}

void ShmemTransport::reset_counters(int peer) noexcept {
  const auto p = static_cast<std::size_t>(peer);
  puts_[p] = 0, put_bytes_[p] = 0, payload_bytes_[p] = 0;
}

void ShmemTransport::count(int peer, std::size_t offset, std::size_t bytes) noexcept {
  const bool payload = offset >= payload_begin_ && offset < payload_end_;
  for (ShmemTransport* t = this; t != nullptr; t = t->parent_) {  // an endpoint counts on its transport too
    const auto p = static_cast<std::size_t>(peer);
    t->puts_[p].fetch_add(1, std::memory_order_relaxed);
    t->put_bytes_[p].fetch_add(bytes, std::memory_order_relaxed);
    if (payload) t->payload_bytes_[p].fetch_add(bytes, std::memory_order_relaxed);
  }
}

void ShmemTransport::put(int peer, std::size_t offset, const void* src, std::size_t bytes, int) {
  require_live("put");
  count(peer, offset, bytes);
  if (std::byte* dst = peer_base_[static_cast<std::size_t>(peer)]) {
    bulk_copy(dst + offset, src, bytes);
    // Over UCX's TCP transport the network puts (this PE's in flight, and the other
    // machines' into this one) move only while this PE progresses: now and then during a
    // stretch of local copies too, not only in the waits.
    thread_local std::size_t copied = 0;
    if (!caps_.peer_memory_mapped && (copied += bytes) >= kProgressEveryBytes) {
      copied = 0;
      opal_progress();
    }
    return;
  }
  mark_outstanding(peer);
  unprobed_[static_cast<std::size_t>(peer)].store(true, std::memory_order_relaxed);
  shmem_putmem_nbi(base_ + offset, src, bytes, pe(peer));
}

void ShmemTransport::get(int peer, std::size_t offset, void* dst, std::size_t bytes, int) {
  require_live("get");
  if (const std::byte* src = peer_base_[static_cast<std::size_t>(peer)]) return static_cast<void>(std::memcpy(dst, src + offset, bytes));
  // A get from a dead PE is refused by UCX (liboshmem prints "Internal error", the call
  // returns nothing) and a later quiet completes it with the destination unwritten: where
  // survivors heal, fail naming a member already announced dead instead of issuing.
  if (control_ && launcher_keeps_survivors() && member_gone(peer)) check_members(WaitPoint{"get (a row from a peer)", peer});
  mark_outstanding(peer);
  unprobed_[static_cast<std::size_t>(peer)].store(true, std::memory_order_relaxed);
  gets_out_.store(true, std::memory_order_relaxed);
  shmem_getmem_nbi(dst, base_ + offset, bytes, pe(peer));
}

void ShmemTransport::ordered_set(int peer, std::size_t offset, std::uint64_t value) {
  if (std::byte* dst = peer_base_[static_cast<std::size_t>(peer)]) {
    // Earlier puts to a mapped peer were copies (bulk_copy ends with a store fence).
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(dst + offset)).store(value, std::memory_order_release);
    return;
  }
  guarded("shmem_fence", peer, [] { shmem_fence(); });  // earlier puts to `peer` are delivered before what follows
  // One aligned 8-byte put (UCX writes it with one store at the target). Measured across two
  // namespaces: ~0.5 ms per signal round trip, against 2.5-5 ms with shmem_ulong_atomic_set
  // (a fetching swap in Open MPI 4.1's spml ucx: the initiator waits for the reply).
  static_assert(sizeof(unsigned long) == sizeof(std::uint64_t));
  shmem_ulong_p(reinterpret_cast<unsigned long*>(base_ + offset), static_cast<unsigned long>(value), pe(peer));
}

void ShmemTransport::signal(int peer, std::size_t slot, std::uint64_t value, int) {
  require_live("signal");
  ordered_set(peer, signal_offset_ + slot * sizeof(std::uint64_t), value);
}

void ShmemTransport::put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                                 int queue) {
  put(peer, offset, src, bytes, queue);
  ordered_set(peer, offset + bytes, flag);
}

std::uint64_t ShmemTransport::read_signal(std::size_t slot) noexcept {
  // A caller polling signals in a loop of its own (the EP rings' credits and tails) waits for
  // network peers whose puts and signals land only while this PE progresses (UCX over TCP
  // emulates them with active messages); without this the rings of two machines stall.
  if (!caps_.peer_memory_mapped) opal_progress();
  return std::atomic_ref<std::uint64_t>(*signal_word(base_, slot)).load(std::memory_order_acquire);
}

void ShmemTransport::wait_word(std::uint64_t* word, std::uint64_t at_least, const WaitPoint& where) {
  require_live("wait");
  note(where.phase, where.peer);
  std::atomic_ref<std::uint64_t> w(*word);
  if (w.load(std::memory_order_acquire) >= at_least) return;
  struct Waiting {  // for the SIGTERM line: a thread is inside this wait (also when it throws)
    std::atomic<int>& n;
    explicit Waiting(std::atomic<int>& c) : n(c) { n.fetch_add(1, std::memory_order_relaxed); }
    ~Waiting() { n.fetch_sub(1, std::memory_order_relaxed); }
  } waiting{term_root().waiting_};  // an endpoint's (a worker's) wait too: the line reads the root
  spi::Backoff backoff(timeout_, kNetworkSpins);
  const bool watch = control_ && launcher_keeps_survivors();
  auto next_look = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  for (;;) {
    // Over UCX's TCP transport a peer's put lands only while this PE progresses.
    opal_progress();
    if (w.load(std::memory_order_acquire) >= at_least) break;
    if (!backoff.step()) fail_timeout(where);
    if (watch && backoff.yielding() && std::chrono::steady_clock::now() >= next_look) {
      check_members(where);
      next_look = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

void ShmemTransport::wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) {
  wait_word(signal_word(base_, slot), at_least, where);
}

void ShmemTransport::wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) {
  wait_word(reinterpret_cast<std::uint64_t*>(base_ + offset), at_least, where);
}

const std::byte* ShmemTransport::peer_window(int peer) const noexcept {
  // The engine's pull reads every peer in place, so only when shmem_ptr maps all of them.
  return caps_.peer_memory_mapped && !peer_base_.empty() ? peer_base_[static_cast<std::size_t>(peer)] : nullptr;
}

void ShmemTransport::quiet(int) {
  // Gets outstanding where survivors heal: a get from a PE that died completes in shmem_quiet
  // without its bytes (UCX fails the request; nothing tells the caller). So first the probe
  // of quiet_timed (a beacon get after the gets: it lands only from a live PE) stops at an
  // announced death, and a probe that never lands within the timeout is a failure naming
  // the peer; after the quiet a death announced meanwhile fails the call too.
  const bool gets = gets_out_.exchange(false, std::memory_order_relaxed) && control_ && launcher_keeps_survivors();
  if (gets) {
    thread_local std::vector<std::uint64_t> laps;
    laps.assign(static_cast<std::size_t>(num_ranks_), 0);
    const int unlanded = probe_peers(laps.data(), "shmem_quiet (gets outstanding)");
    check_members(WaitPoint{"shmem_quiet (gets outstanding)", unlanded});
    if (unlanded >= 0) fail_timeout(WaitPoint{"shmem_quiet (gets outstanding)", unlanded});
  }
  guarded("shmem_quiet", -1, [] { shmem_quiet(); });
  if (gets) check_members(WaitPoint{"shmem_quiet (gets outstanding)", -1});
}

// shmem_quiet completes every peer's puts at once (the network's slowest link decides). To
// tell the peers apart: after a fence, an 8-byte get of each network peer's beacon word
// (1) that this thread put to since its last probe; a get lands after the puts before it
// (UCX sends both on the peer's one ordered lane; OpenSHMEM promises this only of puts, so
// it is an estimate), and each landing is a peer's lap. The quiet that follows completes
// everything, as quiet() does. Cost: one small get per such peer, overlapped with the quiet.
void ShmemTransport::quiet_timed(int queue, std::uint64_t* lap_ns) {
  probe_peers(lap_ns, "shmem_quiet (timing probe)");
  quiet(queue);
}

int ShmemTransport::probe_peers(std::uint64_t* lap_ns, const char* phase) {
  thread_local std::vector<std::uint64_t> landed;
  thread_local std::vector<int> pending;
  pending.clear();
  if (base_ != nullptr && !ShmemRuntime::failed()) {
    landed.assign(static_cast<std::size_t>(num_ranks_), 0);
    const std::size_t beacon = signal_offset_ + (num_signals_ + static_cast<std::size_t>(num_ranks_)) * sizeof(std::uint64_t);
    for (int p = 0; p < num_ranks_; ++p)
      if (peer_base_[static_cast<std::size_t>(p)] == nullptr &&
          unprobed_[static_cast<std::size_t>(p)].exchange(false, std::memory_order_relaxed)) {
        if (pending.empty()) guarded("shmem_fence", -1, [] { shmem_fence(); });
        shmem_getmem_nbi(&landed[static_cast<std::size_t>(p)], base_ + beacon, sizeof(std::uint64_t), pe(p));
        pending.push_back(p);
      }
  }
  auto since = std::chrono::steady_clock::now();
  const auto deadline = since + timeout_;
  // A probe of a dead PE never lands: where survivors heal, look for announced deaths, so a
  // survivor reaches the agreement within milliseconds instead of a timeout after the others
  // (which then took it for lost and agreed without it).
  const bool watch = control_ && launcher_keeps_survivors();
  auto next_look = since + std::chrono::milliseconds(20);
  if (!pending.empty())
    guarded("shmem_quiet", -1, [&] {  // the watchdog ends a rank whose peer never answers, as in shmem_quiet
      // A timing probe, not a wait: each landing is stamped at the first look that sees it, so
      // the first looks take no pause (spi::Backoff's pauses made the quiet 4-machine runs of
      // check_diagnose flag rank 0's combine points in 7 of 10 runs, against 0 of 10 without).
      for (unsigned i = 0; !pending.empty(); ++i) {
        opal_progress();
        const auto now = std::chrono::steady_clock::now();
        std::erase_if(pending, [&](int p) {
          if (std::atomic_ref<std::uint64_t>(landed[static_cast<std::size_t>(p)]).load(std::memory_order_acquire) == 0)
            return false;
          lap_ns[p] += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - since).count());
          since = now;
          return true;
        });
        if (now >= deadline) break;
        if (watch && now >= next_look) {
          check_members(WaitPoint{phase, -1});
          next_look = now + std::chrono::milliseconds(20);
        }
        if (i >= 64) sched_yield();
      }
    });
  return pending.empty() ? -1 : pending.front();
}

void ShmemTransport::barrier(const char* phase) {
  require_live("barrier");
  // A transport whose buffers each opened an endpoint has no block of its own until its first
  // barrier: then one with the barrier's slots only (collective, as the barrier is).
  if (base_ == nullptr) make_block(0, 0);
  ++barrier_epoch_;
  const std::size_t base = num_signals_;
  for (int p = 0; p < num_ranks_; ++p) signal(p, base + static_cast<std::size_t>(rank_), barrier_epoch_, 0);
  for (int p = 0; p < num_ranks_; ++p) wait_signal(base + static_cast<std::size_t>(p), barrier_epoch_, WaitPoint{phase, p});
}

std::vector<ShmemPeerInfo> ShmemTransport::peer_info() const {
  std::vector<ShmemPeerInfo> v(static_cast<std::size_t>(num_ranks_));
  for (int p = 0; p < num_ranks_; ++p) {
    auto& i = v[static_cast<std::size_t>(p)];
    i.peer = p;
    i.node = node_of_rank_[static_cast<std::size_t>(p)];
    i.mapped = mapped_[static_cast<std::size_t>(p)];
    i.puts = puts_[static_cast<std::size_t>(p)].load(std::memory_order_relaxed);
    i.put_bytes = put_bytes_[static_cast<std::size_t>(p)].load(std::memory_order_relaxed);
    i.payload_bytes = payload_bytes_[static_cast<std::size_t>(p)].load(std::memory_order_relaxed);
  }
  return v;
}

}  // namespace epx::detail

namespace epx {

std::vector<ShmemPeerInfo> shmem_peer_info(const Transport& transport) {
  const auto* t = dynamic_cast<const detail::ShmemTransport*>(&transport);
  if (t == nullptr)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("shmem_peer_info: transport '") + transport.caps().name + "' is not the shmem transport");
  return t->peer_info();
}

}  // namespace epx
