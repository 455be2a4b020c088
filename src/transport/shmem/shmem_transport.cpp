#include "shmem/shmem_transport.hpp"

#include <shmem.h>

#include "epx/spi/backoff.hpp"
#include <sched.h>
#include <signal.h>
#include <unistd.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>

#include "epx/error.hpp"
#include "epx/spi/copy.hpp"
#include "epx/spi/resources.hpp"
#include "shmem/shmem_settings.hpp"
#include "shmem/shmem_runtime.hpp"
#include "shmem/shmem_elastic.hpp"

// Open MPI's progress engine (libopen-pal): OpenSHMEM 1.4 has no call that only progresses,
// and shmem_ulong_test does not; liboshmem registers its UCX worker with it.
extern "C" int opal_progress(void);

namespace epx::detail {

// One OpenSHMEM runtime per process: started by the first shmem_bootstrap(), finalised when
// the last bootstrap / transport holding it is gone. After a failure (a wait that timed
// out) or a loss the collective calls of teardown (shmem_free, shmem_finalize) are skipped:
// they would wait for the peer that is gone (after a loss the survivors end the job
// themselves: shmem_elastic.cpp).
std::mutex& ShmemRuntime::mu() {
  static std::mutex m;
  return m;
}
std::weak_ptr<ShmemRuntime>& ShmemRuntime::current() {
  static std::weak_ptr<ShmemRuntime> c;
  return c;
}

std::shared_ptr<ShmemRuntime> ShmemRuntime::acquire(const ShmemOptions& options) {
  std::lock_guard<std::mutex> lock(mu());
  if (auto live = current().lock()) return live;
  if (started_)
    throw Error(ErrorCode::kUnsupported,
                "shmem bootstrap: the OpenSHMEM runtime of this process was already finalised (it cannot start twice)");
  // What epx needs from Open MPI, where the launcher has not set it (shmem_settings.hpp):
  // read by shmem_init_thread, so set before it.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const std::uint64_t memory = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : UINT64_MAX;
  ShmemSettings settings = decide_shmem_settings(options.heap_bytes, [](const char* n) { return std::getenv(n); }, memory);
  for (const auto& [name, value] : settings.set) setenv(name.c_str(), value.c_str(), 1);
  int provided = -1;
  if (shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided) != 0)
    throw Error(ErrorCode::kUnsupported, "shmem bootstrap: shmem_init_thread failed (was the process started by oshrun?)");
  started_ = true;
  auto rt = std::shared_ptr<ShmemRuntime>(new ShmemRuntime(std::move(settings)));
  if (provided < SHMEM_THREAD_MULTIPLE) {
    shmem_finalize();
    throw Error(ErrorCode::kUnsupported, "shmem bootstrap: the OpenSHMEM runtime offers thread level " +
                                             std::to_string(provided) + ", epx's workers need SHMEM_THREAD_MULTIPLE");
  }
  current() = rt;
  return rt;
}

ShmemRuntimeInfo ShmemRuntime::info() {
  std::lock_guard<std::mutex> lock(mu());
  auto live = current().lock();
  if (!live) throw Error(ErrorCode::kUnsupported, "shmem_runtime_info: no OpenSHMEM runtime runs in this process (call shmem_bootstrap() first)");
  ShmemRuntimeInfo i;
  i.heap_bytes = live->settings_.heap_bytes;
  i.heap_from = live->settings_.heap_from;
  for (const auto& [name, value] : live->settings_.set) i.set_by_epx.push_back(name + "=" + value);
  return i;
}

ShmemRuntime::~ShmemRuntime() {
  if (!failed() && !lost()) shmem_finalize();
}

void ShmemRuntime::register_block(std::byte* base, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  blocks_[base] = Block{bytes, false};
}

void ShmemRuntime::unregister_block(std::byte* base) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  blocks_.erase(base);
}

void ShmemRuntime::orphan_block(std::byte* base) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  auto it = blocks_.find(base);
  if (it == blocks_.end()) return;
  it->second.orphan = true;
  // One piece with an orphaned neighbour that touches it (the pieces reuse_block split).
  if (auto next = std::next(it); next != blocks_.end() && next->second.orphan && it->first + it->second.bytes == next->first) {
    it->second.bytes += next->second.bytes;
    blocks_.erase(next);
  }
  if (it != blocks_.begin())
    if (auto prev = std::prev(it); prev->second.orphan && prev->first + prev->second.bytes == it->first) {
      prev->second.bytes += it->second.bytes;
      blocks_.erase(it);
    }
}

std::byte* ShmemRuntime::reuse_block(std::size_t bytes, std::size_t* got) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  auto best = blocks_.end();
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
    if (it->second.orphan && it->second.bytes >= bytes && (best == blocks_.end() || it->second.bytes < best->second.bytes))
      best = it;
  if (best == blocks_.end()) return nullptr;
  best->second.orphan = false;
  // A block much bigger than asked is split: the rest stays free for the next window.
  constexpr std::size_t kPiece = std::size_t{64} << 10;
  const std::size_t take = (bytes + 4095) / 4096 * 4096;
  if (best->second.bytes >= take + kPiece) {
    blocks_[best->first + take] = Block{best->second.bytes - take, true};
    best->second.bytes = take;
  }
  *got = best->second.bytes;
  return best->first;
}

std::string ShmemRuntime::orphans() const {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  std::string s;
  int n = 0;
  for (const auto& [base, b] : blocks_)
    if (b.orphan) s += (n++ ? ", " : "") + format_bytes(b.bytes);
  return n == 0 ? std::string("none") : std::to_string(n) + ": " + s;
}

std::shared_ptr<ShmemControl> ShmemRuntime::control() const {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  return control_;
}

void ShmemRuntime::set_control(std::shared_ptr<ShmemControl> c) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  control_ = std::move(c);
}

namespace {

class ShmemBootstrap final : public Bootstrap {
 public:
  explicit ShmemBootstrap(std::shared_ptr<ShmemRuntime> rt)
      : rt_(std::move(rt)), rank_(shmem_my_pe()), size_(shmem_n_pes()) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const char* name() const noexcept override { return "shmem"; }
  void barrier() override {
    refuse_after_loss("barrier");
    shmem_barrier_all();
  }

  // Each rank puts its blob into every PE's symmetric buffer; barrier_all completes the puts.
  void allgather(const void* in, void* out, std::size_t bytes) override {
    refuse_after_loss("allgather");
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
  // Both are calls over every PE, which cannot complete once a PE died.
  void refuse_after_loss(const char* call) const {
    if (ShmemRuntime::lost())
      throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": shmem bootstrap: " + call +
                                               " runs over every PE of the job, and PEs were lost (a group was rebuilt "
                                               "without them): use the rebuilt group",
                  rank_);
  }
  std::shared_ptr<ShmemRuntime> rt_;
  int rank_;
  int size_;
};

// The transport whose rank the SIGTERM line describes (the one that installed the handler),
// and the disposition it replaced.
std::atomic<const ShmemTransport*> g_term_transport{nullptr};
struct sigaction g_old_term {};

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
  f();
  term.blocked_.fetch_sub(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(watch_mu_);
  blocking_.erase(it);
}

// Where the launcher lets survivors live, a shmem_quiet with puts to a PE that just died
// returns only once UCX's keepalive declares that endpoint dead (UCX_KEEPALIVE_INTERVAL; at
// load ~25 on 2 cores more than 6 s was seen with 1 s): twice the timeout lets a survivor
// heal instead of being ended, at the price of a cut link ending it later.
std::chrono::milliseconds ShmemTransport::watch_limit() const noexcept {
  return launcher_keeps_survivors() ? 2 * timeout_ : timeout_;
}

void ShmemTransport::watchdog_loop() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!stop_watch_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    for (const Blocking& b : blocking_)
      if (now - b.since > watch_limit()) watchdog_fire(b);
  }
}

void ShmemTransport::watchdog_fire(const Blocking& b) {
  ShmemRuntime::mark_failed();
  std::string peers;
  for (int p = 0; p < num_ranks_; ++p)
    if (b.peer == p || (b.peer < 0 && outstanding_[static_cast<std::size_t>(p)].load()))
      peers += (peers.empty() ? "" : ", ") + describe_peer(p);
  const std::string msg = "epx: rank " + std::to_string(rank_) + ": timed out after " + std::to_string(watch_limit().count()) +
                          " ms in phase '" + last_phase_.load() + "' waiting for " + (peers.empty() ? "the other ranks" : peers) +
                          " to complete puts (" + b.call +
                          " blocks in the OpenSHMEM runtime, which cannot be interrupted: ending this process)\n";
  std::fwrite(msg.data(), 1, msg.size(), stderr);
  std::fflush(stderr);
  // Where the launcher lets survivors live (they may heal), Open MPI ends the job only when
  // told: a process that just vanishes leaves it waiting for the dead PE. Ask it to abort
  // (from another thread: this one may not come back), and vanish a second later anyway.
  if (launcher_keeps_survivors()) {
    std::thread([] { shmem_global_exit(1); }).detach();
    const timespec pause{1, 0};
    nanosleep(&pause, nullptr);
  }
  std::_Exit(1);
}

std::string ShmemTransport::describe_peer(int peer) const {
  if (peer < 0 || peer >= num_ranks_) return "the other ranks";
  const int node = node_of_rank_[static_cast<std::size_t>(peer)];
  const bool same = node == node_of_rank_[static_cast<std::size_t>(rank_)];
  return "rank " + std::to_string(peer) + " (node " + std::to_string(node) + (same ? ", this node)" : ", another machine)");
}

// Replaces SIGTERM's default action or liboshmem's handler, which does nothing (Open MPI
// 4.1's oshmem_shmem_init.c installs it "to replace other unpredictable handlers", so a
// rank ignores the SIGTERM its daemon sends and dies of the SIGKILL that follows
// odls_base_sigkill_timeout later, silently); any other handler (the application's) is left
// alone. One transport at a time: the first one made.
bool ShmemTransport::replaceable_term_action(const struct sigaction& old) {
  if ((old.sa_flags & SA_SIGINFO) != 0) return false;
  if (old.sa_handler == SIG_DFL) return true;
  if (old.sa_handler == SIG_IGN) return false;
  Dl_info info{};
  return dladdr(reinterpret_cast<void*>(old.sa_handler), &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "liboshmem") != nullptr;
}

void ShmemTransport::install_term_note() {
  term_head_ = "epx: rank " + std::to_string(rank_) + " (node " + std::to_string(node_of_rank_[static_cast<std::size_t>(rank_)]) +
               ") ended by the launcher (SIGTERM) in phase '";
  term_while_ = "' while waiting for ";
  term_after_ = "' (not in a wait; the last one was for ";
  term_peer_.clear();
  for (int p = -1; p < num_ranks_; ++p) term_peer_.push_back(describe_peer(p));
  const ShmemTransport* none = nullptr;
  if (!g_term_transport.compare_exchange_strong(none, this)) return;
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) != 0 || !replaceable_term_action(old)) {
    g_term_transport.store(nullptr);
    return;
  }
  struct sigaction sa {};
  sa.sa_handler = &ShmemTransport::on_term;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;  // the handler's raise() then ends the process at once
  g_old_term = old;
  sigaction(SIGTERM, &sa, nullptr);
}

void ShmemTransport::remove_term_note() noexcept {
  if (g_term_transport.load() != this) return;
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_term_transport.store(nullptr);
}

// Async-signal-safe: reads atomics and strings built before the handler was installed,
// copies them with memcpy into a stack buffer, one write(2), then the default action.
void ShmemTransport::on_term(int sig) noexcept {
  const int saved_errno = errno;
  if (const ShmemTransport* t = g_term_transport.load(std::memory_order_acquire)) {
    char buf[1024];
    std::size_t n = 0;
    const auto add = [&](const char* s, std::size_t len) {
      len = std::min(len, sizeof buf - 1 - n);  // room for the newline
      std::memcpy(buf + n, s, len);
      n += len;
    };
    const auto add_str = [&](const char* s) {
      std::size_t len = 0;
      while (s != nullptr && s[len] != '\0' && len < 200) ++len;
      add(s, len);
    };
    const auto add_peer = [&](int peer) {
      if (peer < -1 || peer >= t->num_ranks_) peer = -1;
      const std::string& who = t->term_peer_[static_cast<std::size_t>(peer + 1)];
      add(who.data(), who.size());
    };
    add(t->term_head_.data(), t->term_head_.size());
    add_str(t->last_phase_.load(std::memory_order_relaxed));
    if (t->waiting_.load(std::memory_order_relaxed) > 0) {
      add(t->term_while_.data(), t->term_while_.size());
      add_peer(t->last_peer_.load(std::memory_order_relaxed));
    } else if (t->blocked_.load(std::memory_order_relaxed) > 0) {  // where the watchdog would end it after the timeout
      add("' in ", 5);
      add_str(t->blocked_call_.load(std::memory_order_relaxed));
      add(" completing puts to ", 20);
      const int peer = t->blocked_peer_.load(std::memory_order_relaxed);
      bool any = false;
      for (int p = 0; p < t->num_ranks_; ++p)
        if (peer == p || (peer < 0 && t->outstanding_[static_cast<std::size_t>(p)].load(std::memory_order_relaxed))) {
          if (any) add(", ", 2);
          add_peer(p), any = true;
        }
      if (!any) add_peer(-1);
    } else {
      add(t->term_after_.data(), t->term_after_.size());
      add_peer(t->last_peer_.load(std::memory_order_relaxed));
      add(")", 1);
    }
    buf[n++] = '\n';
    [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, buf, n);
  }
  // The daemon forwards the line only if it reads the pipe before it sees this process end
  // (measured: without a pause, 1 of 6 daemon-kill runs lost a rank's line). Well inside
  // the SIGKILL that follows after odls_base_sigkill_timeout (1 s).
  const timespec pause{0, 200'000'000};
  nanosleep(&pause, nullptr);
  errno = saved_errno;
  ::signal(sig, SIG_DFL);  // SA_RESETHAND did too; liboshmem's handler is not put back: the rank ends
  raise(sig);
}

void ShmemTransport::release_heap() noexcept {
  if (base_ != nullptr && !ShmemRuntime::failed()) {
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
  mark_outstanding(peer);
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

// Where survivors may heal: a member whose process a PE of its machine saw gone (announced
// in the control words, or seen here) dooms the call; say so at once instead of after the
// timeout, naming it, so the survivors agree and rebuild within milliseconds of the death.
void ShmemTransport::check_members(const WaitPoint& where) {
  ShmemControl& c = *control_;
  for (int p = 0; p < num_ranks_; ++p) {
    if (p == rank_) continue;
    const int q = pe(p);
    if (c.load(c.gone(q)) == 0) {
      if (!c.seen_dead(q)) continue;
      // Every other member learns it (nothing more to the dead PE: a put UCX cannot deliver
      // stays in flight until its keepalive declares the endpoint dead, holding up every
      // shmem_quiet of this PE meanwhile).
      for (int x = 0; x < num_ranks_; ++x)
        if (x != p && c.load(c.gone(pe(x))) == 0) c.set(pe(x), c.gone(q), 1);
    }
    ShmemRuntime::mark_failed();
    throw Error(ErrorCode::kPeerFailed,
                "rank " + std::to_string(rank_) + ": " + describe_peer(p) + " died (its process is gone, seen on its machine) " +
                    "while this rank waited in phase '" + where.phase + "'" +
                    (where.peer >= 0 && where.peer != p ? " for " + describe_peer(where.peer) : std::string()) +
                    " (shmem transport)",
                p);
  }
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

// shmem_quiet completes every peer's puts at once (the network's slowest link decides). To
// tell the peers apart: after a fence, an 8-byte get of each network peer's beacon word
// (1) that this thread put to since its last probe; a get lands after the puts before it
// (UCX sends both on the peer's one ordered lane; OpenSHMEM promises this only of puts, so
// it is an estimate), and each landing is a peer's lap. The quiet that follows completes
// everything, as quiet() does. Cost: one small get per such peer, overlapped with the quiet.
void ShmemTransport::quiet_timed(int queue, std::uint64_t* lap_ns) {
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
        if (i >= 64) sched_yield();
      }
    });
  quiet(queue);
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

void ShmemTransport::fail_timeout(const WaitPoint& where) {
  ShmemRuntime::mark_failed();
  const std::string who = describe_peer(where.peer);
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

namespace {

// EPX_SHMEM_ELASTIC_RESERVE=SIZE (the heap's syntax: 512M, 2G): a block of the heap kept
// free from the start for the windows of groups rebuilt after a loss, which can take no new
// block (shmem_malloc would wait for the dead PEs) and otherwise only reuse the old group's.
// Its pages cost memory only once such a window touches them. The same on every PE (checked).
void reserve_for_rebuilds(Bootstrap& bootstrap, ShmemRuntime& rt, std::size_t heap) {
  const char* text = std::getenv("EPX_SHMEM_ELASTIC_RESERVE");
  const int me = shmem_my_pe(), n = shmem_n_pes();
  std::uint64_t want = 0;
  if (text != nullptr && *text != '\0') {
    want = parse_heap_size(text);
    if (want == 0) want = UINT64_MAX;  // not a size: every PE learns it below
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
  bootstrap.allgather(&want, all.data(), sizeof want);
  const std::string who = "rank " + std::to_string(me) + ": shmem: EPX_SHMEM_ELASTIC_RESERVE";
  for (int p = 0; p < n; ++p) {
    if (all[static_cast<std::size_t>(p)] == UINT64_MAX)
      throw Error(ErrorCode::kInvalidArgument, who + " of rank " + std::to_string(p) +
                                                   " is not a size (a number, optionally followed by K, M, G or T)", p);
    if (all[static_cast<std::size_t>(p)] != want)
      throw Error(ErrorCode::kInvalidArgument, who + " differs between the ranks (" + std::to_string(want) + " bytes here, " +
                                                   std::to_string(all[static_cast<std::size_t>(p)]) + " on rank " +
                                                   std::to_string(p) + "): give every rank the same (oshrun -x)", p);
  }
  if (want == 0) return;
  constexpr std::size_t kSlack = std::size_t{8} << 20;
  if (heap != 0 && rt.heap_in_use().load() + want + kSlack > heap)
    throw Error(ErrorCode::kCapacityExceeded, who + "=" + text + " does not fit in the symmetric heap of " + format_bytes(heap) +
                                                  " per PE (" + rt.heap_from() + ")", me);
  auto* block = static_cast<std::byte*>(shmem_malloc(want));  // collective; untouched
  if (block == nullptr)
    throw Error(ErrorCode::kCapacityExceeded, who + ": shmem_malloc(" + format_bytes(want) + ") failed (" + rt.heap_from() + ")", me);
  rt.register_block(block, want);
  rt.orphan_block(block);  // free, for reuse_block only (which runs only after a loss)
  rt.heap_in_use() += want;  // the heap left for the windows before a loss
}

}  // namespace

std::unique_ptr<Transport> connect_shmem(Bootstrap& bootstrap, const ConnectOptions& options) {
  auto rt = ShmemRuntime::acquire();
  const int me = shmem_my_pe(), n = shmem_n_pes();
  if (bootstrap.rank() != me || bootstrap.size() != n)
    throw Error(ErrorCode::kInvalidArgument, "connect(shmem): the '" + std::string(bootstrap.name()) + "' bootstrap has rank " +
                                                 std::to_string(bootstrap.rank()) + " of " + std::to_string(bootstrap.size()) +
                                                 ", the OpenSHMEM runtime PE " + std::to_string(me) + " of " +
                                                 std::to_string(n) + " (use epx::shmem_bootstrap())");
  if (ShmemRuntime::lost())
    throw Error(ErrorCode::kUnsupported, "connect(shmem): PEs of this job were lost (a group was rebuilt without them), and a "
                                         "connect runs over every PE: use the rebuilt group");
  const NodeMap nodes = discover_nodes(bootstrap);
  // The heap every PE can count on: the smallest (nodes with less memory get a smaller
  // default); 0 if any PE does not know its own.
  std::uint64_t mine = rt->heap_bytes();
  std::vector<std::uint64_t> heaps(static_cast<std::size_t>(n));
  bootstrap.allgather(&mine, heaps.data(), sizeof mine);
  const std::uint64_t agreed = *std::min_element(heaps.begin(), heaps.end());
  // The elastic words, once per process, while every PE lives (shmem_malloc is collective:
  // every PE's first connect makes them), and the reserve for groups rebuilt after a loss.
  if (!rt->control()) {
    rt->set_control(std::make_shared<ShmemControl>(me, n));
    reserve_for_rebuilds(bootstrap, *rt, static_cast<std::size_t>(agreed));
  }
  return std::make_unique<ShmemTransport>(std::move(rt), nodes, options.timeout, static_cast<std::size_t>(agreed));
}

}  // namespace epx::detail

namespace epx {

bool shmem_available() noexcept { return true; }

std::unique_ptr<Bootstrap> shmem_bootstrap(const ShmemOptions& options) {
  return std::make_unique<detail::ShmemBootstrap>(detail::ShmemRuntime::acquire(options));
}

ShmemRuntimeInfo shmem_runtime_info() { return detail::ShmemRuntime::info(); }

std::vector<ShmemPeerInfo> shmem_peer_info(const Transport& transport) {
  const auto* t = dynamic_cast<const detail::ShmemTransport*>(&transport);
  if (t == nullptr)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("shmem_peer_info: transport '") + transport.caps().name + "' is not the shmem transport");
  return t->peer_info();
}

}  // namespace epx
