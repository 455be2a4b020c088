#include "shmem/shmem_transport.hpp"

#include <shmem.h>

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "epx/error.hpp"
#include "epx/spi/copy.hpp"

// Open MPI's progress engine (libopen-pal): OpenSHMEM 1.4 has no call that only progresses,
// and shmem_ulong_test does not; liboshmem registers its UCX worker with it.
extern "C" int opal_progress(void);

namespace epx::detail {

// One OpenSHMEM runtime per process: started by the first shmem_bootstrap(), finalised when
// the last bootstrap / transport holding it is gone. After a failure (a wait that timed
// out) the collective calls of teardown (shmem_free, shmem_finalize) are skipped: they
// would wait for the peer that is gone, and the launcher ends the job anyway.
class ShmemRuntime {
 public:
  static std::shared_ptr<ShmemRuntime> acquire() {
    static std::mutex mu;
    static std::weak_ptr<ShmemRuntime> current;
    static bool started = false;
    std::lock_guard<std::mutex> lock(mu);
    if (auto live = current.lock()) return live;
    if (started)
      throw Error(ErrorCode::kUnsupported,
                  "shmem bootstrap: the OpenSHMEM runtime of this process was already finalised (it cannot start twice)");
    int provided = -1;
    if (shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided) != 0)
      throw Error(ErrorCode::kUnsupported, "shmem bootstrap: shmem_init_thread failed (was the process started by oshrun?)");
    started = true;
    auto rt = std::shared_ptr<ShmemRuntime>(new ShmemRuntime());
    if (provided < SHMEM_THREAD_MULTIPLE) {
      shmem_finalize();
      throw Error(ErrorCode::kUnsupported, "shmem bootstrap: the OpenSHMEM runtime offers thread level " +
                                               std::to_string(provided) + ", epx's workers need SHMEM_THREAD_MULTIPLE");
    }
    current = rt;
    return rt;
  }
  ~ShmemRuntime() {
    if (!failed()) shmem_finalize();
  }
  static bool failed() noexcept { return failed_.load(std::memory_order_acquire); }
  static void mark_failed() noexcept { failed_.store(true, std::memory_order_release); }

 private:
  ShmemRuntime() = default;
  static inline std::atomic<bool> failed_{false};
};

namespace {

class ShmemBootstrap final : public Bootstrap {
 public:
  explicit ShmemBootstrap(std::shared_ptr<ShmemRuntime> rt)
      : rt_(std::move(rt)), rank_(shmem_my_pe()), size_(shmem_n_pes()) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const char* name() const noexcept override { return "shmem"; }
  void barrier() override { shmem_barrier_all(); }

  // Each rank puts its blob into every PE's symmetric buffer; barrier_all completes the puts.
  void allgather(const void* in, void* out, std::size_t bytes) override {
    if (bytes == 0) return shmem_barrier_all();
    const std::size_t slot = (bytes + 7) / 8 * 8;
    auto* buf = static_cast<std::byte*>(shmem_malloc(slot * static_cast<std::size_t>(size_)));  // collective
    if (buf == nullptr)
      throw Error(ErrorCode::kCapacityExceeded, "rank " + std::to_string(rank_) + ": shmem bootstrap: shmem_malloc(" +
                                                    std::to_string(slot * static_cast<std::size_t>(size_)) +
                                                    " bytes) for an all-gather failed (symmetric heap full?)");
    for (int p = 0; p < size_; ++p) shmem_putmem(buf + slot * static_cast<std::size_t>(rank_), in, bytes, p);
    shmem_barrier_all();
    for (int p = 0; p < size_; ++p)
      std::memcpy(static_cast<std::byte*>(out) + bytes * static_cast<std::size_t>(p), buf + slot * static_cast<std::size_t>(p), bytes);
    shmem_free(buf);  // collective (a barrier): nobody still reads or writes buf
  }

 private:
  std::shared_ptr<ShmemRuntime> rt_;
  int rank_;
  int size_;
};

constexpr std::size_t kPage = 4096;
std::size_t round_page(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

ShmemTransport::ShmemTransport(std::shared_ptr<ShmemRuntime> runtime, const NodeMap& nodes,
                               std::chrono::milliseconds timeout)
    : runtime_(std::move(runtime)),
      rank_(shmem_my_pe()),
      num_ranks_(shmem_n_pes()),
      node_of_rank_(nodes.node_of_rank),
      timeout_(timeout),
      puts_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      put_bytes_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      payload_bytes_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(num_ranks_)]),
      outstanding_(new std::atomic<bool>[static_cast<std::size_t>(num_ranks_)]) {
  // Which peers' heaps shmem_ptr maps here (a probe block; the answer is per peer, not per block).
  auto* probe = static_cast<std::byte*>(shmem_malloc(kPage));
  if (probe == nullptr)
    throw Error(ErrorCode::kCapacityExceeded, "rank " + std::to_string(rank_) + ": shmem: shmem_malloc of a probe page failed");
  mapped_.assign(static_cast<std::size_t>(num_ranks_), false);
  for (int p = 0; p < num_ranks_; ++p) mapped_[static_cast<std::size_t>(p)] = p == rank_ || shmem_ptr(probe, p) != nullptr;
  shmem_free(probe);
  const bool all_mapped = std::all_of(mapped_.begin(), mapped_.end(), [](bool m) { return m; });
  caps_.name = "shmem";
  caps_.peer_memory_mapped = all_mapped;
  caps_.ordered_signal_per_queue = true;  // shmem_fence before the signal's atomic set
  caps_.put_completes_on_return = all_mapped;
  caps_.max_queues = 64;                  // queues are labels here: quiet completes all of them
  caps_.flagged_puts = true;              // bytes, shmem_fence, atomic set of the flag
  for (int p = 0; p < num_ranks_; ++p) reset_counters(p), outstanding_[static_cast<std::size_t>(p)] = false;
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

ShmemTransport::~ShmemTransport() {
  release_heap();
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
  f();
  std::lock_guard<std::mutex> lock(watch_mu_);
  blocking_.erase(it);
}

void ShmemTransport::watchdog_loop() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!stop_watch_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    for (const Blocking& b : blocking_)
      if (now - b.since > timeout_) watchdog_fire(b);
  }
}

void ShmemTransport::watchdog_fire(const Blocking& b) {
  ShmemRuntime::mark_failed();
  std::string peers;
  for (int p = 0; p < num_ranks_; ++p)
    if (b.peer == p || (b.peer < 0 && outstanding_[static_cast<std::size_t>(p)].load())) {
      const bool same = node_of_rank_[static_cast<std::size_t>(p)] == node_of_rank_[static_cast<std::size_t>(rank_)];
      peers += (peers.empty() ? "rank " : ", rank ") + std::to_string(p) + " (node " +
               std::to_string(node_of_rank_[static_cast<std::size_t>(p)]) + (same ? ", this node)" : ", another machine)");
    }
  const std::string msg = "epx: rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) +
                          " ms in phase '" + last_phase_.load() + "' waiting for " + (peers.empty() ? "the other ranks" : peers) +
                          " to complete puts (" + b.call +
                          " blocks in the OpenSHMEM runtime, which cannot be interrupted: ending this process)\n";
  std::fwrite(msg.data(), 1, msg.size(), stderr);
  std::fflush(stderr);
  std::_Exit(1);
}

void ShmemTransport::release_heap() noexcept {
  if (base_ != nullptr && !ShmemRuntime::failed()) {
    shmem_quiet();
    shmem_free(base_);  // collective
  }
  base_ = nullptr;
  peer_base_.clear();
}

void ShmemTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  release_heap();
  signal_offset_ = round_page(window_bytes);
  const std::size_t bytes = signal_offset_ + (num_signals + static_cast<std::size_t>(num_ranks_)) * sizeof(std::uint64_t);
  base_ = static_cast<std::byte*>(shmem_malloc(bytes));  // collective, the same size on every PE
  if (base_ == nullptr)
    throw Error(ErrorCode::kCapacityExceeded,
                "rank " + std::to_string(rank_) + ": shmem: shmem_malloc(" + std::to_string(bytes) +
                    " bytes) failed: the symmetric heap is too small (raise it with SHMEM_SYMMETRIC_SIZE, e.g. "
                    "oshrun -x SHMEM_SYMMETRIC_SIZE=4G)");
  std::memset(base_, 0, bytes);  // zeroed and pre-faulted
  peer_base_.assign(static_cast<std::size_t>(num_ranks_), nullptr);
  for (int p = 0; p < num_ranks_; ++p)
    if (mapped_[static_cast<std::size_t>(p)])
      peer_base_[static_cast<std::size_t>(p)] = p == rank_ ? base_ : static_cast<std::byte*>(shmem_ptr(base_, p));
  window_bytes_ = window_bytes;
  num_signals_ = num_signals;
  barrier_epoch_ = 0;
  payload_begin_ = payload_end_ = 0;
  for (int p = 0; p < num_ranks_; ++p) reset_counters(p);
  shmem_barrier_all();  // every PE zeroed its block before anyone writes into it
}

std::uint64_t* ShmemTransport::signal_word(std::byte* base, std::size_t slot) const noexcept {
  return reinterpret_cast<std::uint64_t*>(base + signal_offset_) + slot;
}

void ShmemTransport::reset_counters(int peer) noexcept {
  const auto p = static_cast<std::size_t>(peer);
  puts_[p] = 0, put_bytes_[p] = 0, payload_bytes_[p] = 0;
}

void ShmemTransport::count(int peer, std::size_t offset, std::size_t bytes) noexcept {
  const auto p = static_cast<std::size_t>(peer);
  puts_[p].fetch_add(1, std::memory_order_relaxed);
  put_bytes_[p].fetch_add(bytes, std::memory_order_relaxed);
  if (offset >= payload_begin_ && offset < payload_end_) payload_bytes_[p].fetch_add(bytes, std::memory_order_relaxed);
}

void ShmemTransport::put(int peer, std::size_t offset, const void* src, std::size_t bytes, int) {
  count(peer, offset, bytes);
  if (std::byte* dst = peer_base_[static_cast<std::size_t>(peer)]) return bulk_copy(dst + offset, src, bytes);
  outstanding_[static_cast<std::size_t>(peer)].store(true, std::memory_order_relaxed);
  shmem_putmem_nbi(base_ + offset, src, bytes, peer);
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
  shmem_ulong_p(reinterpret_cast<unsigned long*>(base_ + offset), static_cast<unsigned long>(value), peer);
}

void ShmemTransport::signal(int peer, std::size_t slot, std::uint64_t value, int) {
  ordered_set(peer, signal_offset_ + slot * sizeof(std::uint64_t), value);
}

void ShmemTransport::put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                                 int queue) {
  put(peer, offset, src, bytes, queue);
  ordered_set(peer, offset + bytes, flag);
}

std::uint64_t ShmemTransport::read_signal(std::size_t slot) noexcept {
  return std::atomic_ref<std::uint64_t>(*signal_word(base_, slot)).load(std::memory_order_acquire);
}

void ShmemTransport::wait_word(std::uint64_t* word, std::uint64_t at_least, const WaitPoint& where) {
  last_phase_.store(where.phase, std::memory_order_relaxed);
  std::atomic_ref<std::uint64_t> w(*word);
  if (w.load(std::memory_order_acquire) >= at_least) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (unsigned i = 0;; ++i) {
    // Over UCX's TCP transport a peer's put lands only while this PE progresses.
    opal_progress();
    if (w.load(std::memory_order_acquire) >= at_least) break;
    if (i < 64) {
      _mm_pause();
      continue;
    }
    sched_yield();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= deadline) fail_timeout(where);
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
  guarded("shmem_quiet", -1, [] { shmem_quiet(); });
}

void ShmemTransport::barrier(const char* phase) {
  ++barrier_epoch_;
  const std::size_t base = num_signals_;
  for (int p = 0; p < num_ranks_; ++p) signal(p, base + static_cast<std::size_t>(rank_), barrier_epoch_, 0);
  for (int p = 0; p < num_ranks_; ++p) wait_signal(base + static_cast<std::size_t>(p), barrier_epoch_, WaitPoint{phase, p});
}

void ShmemTransport::fail_timeout(const WaitPoint& where) {
  ShmemRuntime::mark_failed();
  std::string who = "the other ranks";
  if (where.peer >= 0 && where.peer < num_ranks_) {
    const int node = node_of_rank_[static_cast<std::size_t>(where.peer)];
    const bool same = node == node_of_rank_[static_cast<std::size_t>(rank_)];
    who = "rank " + std::to_string(where.peer) + " (node " + std::to_string(node) +
          (same ? ", this node" : ", another machine") + ")";
  }
  throw Error(ErrorCode::kTimeout,
              "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) +
                  " ms in phase '" + where.phase + "' waiting for " + who + " (shmem transport)",
              where.peer);
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

std::unique_ptr<Transport> connect_shmem(Bootstrap& bootstrap, const ConnectOptions& options) {
  auto rt = ShmemRuntime::acquire();
  const int me = shmem_my_pe(), n = shmem_n_pes();
  if (bootstrap.rank() != me || bootstrap.size() != n)
    throw Error(ErrorCode::kInvalidArgument, "connect(shmem): the '" + std::string(bootstrap.name()) + "' bootstrap has rank " +
                                                 std::to_string(bootstrap.rank()) + " of " + std::to_string(bootstrap.size()) +
                                                 ", the OpenSHMEM runtime PE " + std::to_string(me) + " of " +
                                                 std::to_string(n) + " (use epx::shmem_bootstrap())");
  const NodeMap nodes = discover_nodes(bootstrap);
  return std::make_unique<ShmemTransport>(std::move(rt), nodes, options.timeout);
}

}  // namespace epx::detail

namespace epx {

bool shmem_available() noexcept { return true; }

std::unique_ptr<Bootstrap> shmem_bootstrap() {
  return std::make_unique<detail::ShmemBootstrap>(detail::ShmemRuntime::acquire());
}

std::vector<ShmemPeerInfo> shmem_peer_info(const Transport& transport) {
  const auto* t = dynamic_cast<const detail::ShmemTransport*>(&transport);
  if (t == nullptr)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("shmem_peer_info: transport '") + transport.caps().name + "' is not the shmem transport");
  return t->peer_info();
}

}  // namespace epx
