#include "ucx/ucx_transport.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"
#include "epx/spi/copy.hpp"
#include "epx/spi/resources.hpp"
#include "process_identity.hpp"

namespace epx::detail {
namespace {

constexpr std::size_t kPage = 4096;
// Pauses a wait takes before it yields (spi::Backoff): each look also progresses the worker,
// so a look costs more than a mapped transport's and it spins less (as the shmem transport).
constexpr int kNetworkSpins = 64;
// How often a yielding wait calls ConnectOptions::wait_hook (the Python binding's Ctrl-C).
constexpr auto kHookEvery = std::chrono::milliseconds(50);
// How long a teardown after a failure tries to complete this rank's puts (a cut link: all of it).
constexpr std::chrono::milliseconds kBrokenTeardown{2000};
constexpr std::size_t kProgressEveryBytes = std::size_t{256} << 10;  // of copies to mapped peers, when some peer is remote
std::size_t round_page(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }

std::string status_text(ucs_status_t s) { return ucs_status_string(s); }

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace

// What a transport and its endpoints share: the UCP context, the worker, one UCP endpoint
// per peer, who the peers are, and which of them failed.
class UcxGroup {
 public:
  UcxGroup(Bootstrap& boot, const ConnectOptions& options);
  ~UcxGroup();
  UcxGroup(const UcxGroup&) = delete;
  UcxGroup& operator=(const UcxGroup&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const TransportCaps& caps() const noexcept { return caps_; }
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  ucp_context_h context() const noexcept { return context_; }
  /// EPX_UCX_MAP_PEERS=0: same-machine peers through UCX's transports, not mapped copies.
  bool map_peers() const noexcept { return map_peers_; }
  bool has_remote_peers() const noexcept { return remote_peers_; }
  bool same_node(int peer) const noexcept {
    return node_of_rank_[static_cast<std::size_t>(peer)] == node_of_rank_[static_cast<std::size_t>(rank_)];
  }
  ucp_ep_h ep(int peer) noexcept {
    touched_[static_cast<std::size_t>(peer)].store(true, std::memory_order_relaxed);
    return eps_[static_cast<std::size_t>(peer)];
  }
  void progress() noexcept { ucp_worker_progress(worker_); }
  void fence(int peer);
  /// Where this rank waits now, for the messages of calls that name no phase (puts, quiet).
  /// Copied: a WaitPoint's phase need not outlive its wait.
  void note(const char* phase) noexcept;
  /// A released block unmapped only when the group ends (after a failure).
  void keep_mapped(ucp_mem_h memh) noexcept {
    std::lock_guard<std::mutex> lock(kept_mu_);
    try {
      kept_.push_back(memh);
    } catch (...) {
      // No memory to remember it: the block stays mapped until the process ends.
    }
  }
  std::string phase() const;

  /// A non-blocking call's result: a request is handed back to UCX (completion is learned
  /// by the next flush); an error means the peer's endpoint failed.
  void settle(ucs_status_ptr_t r, int peer, const char* what);
  /// Every operation this worker issued to a peer it talked to is complete at the target.
  void flush(std::uint64_t* lap_ns, bool teardown = false);
  /// Between looks of a wait: the awaited peer's endpoint failed, or the caller's hook.
  void check_waiting(const WaitPoint& where, bool yielding);
  [[noreturn]] void fail_timeout(const WaitPoint& where) const;
  bool broken() const noexcept { return broken_.load(std::memory_order_relaxed); }
  /// Collective: every rank's `mine`, with the worker progressed meanwhile (a peer may still
  /// be completing puts into this rank, which over TCP needs this rank's progress).
  std::vector<std::string> exchange(const std::string& mine);
  /// "rank 3 (node 1 'host-b', another machine)"; -1: "the other ranks".
  std::string describe(int peer) const;

 private:
  struct PeerState {
    UcxGroup* group = nullptr;
    int peer = -1;
  };
  struct Pending {
    int peer;
    void* request;
  };
  void await_flushes(std::vector<Pending>& pending, std::uint64_t* lap_ns, bool teardown);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void make_context();
  void make_worker();
  std::vector<std::string> start_worker();
  void connect_endpoints(const std::vector<std::string>& addresses);
  void close_endpoints() noexcept;
  [[noreturn]] void fail_peer(int peer, ucs_status_t status, const char* what) const;
  /// A same-machine peer this rank waits for (whose endpoint reports nothing: no peer error
  /// handling) died: kPeerFailed. Every 20 ms at most, while a wait yields.
  void check_alive(const WaitPoint& where);

  Bootstrap& boot_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::function<void()> hook_;
  TransportCaps caps_;
  std::vector<int> node_of_rank_;
  std::vector<std::string> hosts_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;                       // [P], nullptr for this rank (puts to it are copies)
  std::unique_ptr<PeerState[]> peer_state_;         // [P] the error handler's argument
  std::unique_ptr<std::atomic<int>[]> failed_;      // [P] ucs_status_t of a failed endpoint, else 0
  std::unique_ptr<std::atomic<bool>[]> touched_;    // [P] an operation ever went to this peer
  bool map_peers_ = true, remote_peers_ = false;
  std::vector<ProcessIdentity> lives_;              // [P] each rank's process, for the same-machine liveness check
  std::atomic<std::int64_t> next_life_check_{0};    // steady-clock ns of the next one (one thread of the rank at a time)
  std::unique_ptr<std::atomic<std::int64_t>[]> suspect_since_;  // [P] steady-clock ns a peer was first seen dead (0: alive)
  std::atomic<const char*> phase_ptr_{nullptr};  // the last noted pointer: the same one is not copied again
  mutable std::mutex phase_mu_;
  std::string phase_ = "setup";
  std::mutex kept_mu_;
  std::vector<ucp_mem_h> kept_;  // blocks released after a failure, unmapped by the destructor
  // A wait or flush failed: teardown's flushes wait kBrokenTeardown at most.
  mutable std::atomic<bool> broken_{false};
};

UcxGroup::UcxGroup(Bootstrap& boot, const ConnectOptions& options)
    : boot_(boot), rank_(boot.rank()), size_(boot.size()), timeout_(options.timeout), hook_(options.wait_hook) {
  const auto P = static_cast<std::size_t>(size_);
  node_of_rank_ = discover_nodes(boot).node_of_rank;
  for (int p = 0; p < size_; ++p) remote_peers_ = remote_peers_ || !same_node(p);
  const char* map = std::getenv("EPX_UCX_MAP_PEERS");
  map_peers_ = map == nullptr || std::string(map) != "0";
  hosts_ = allgather_strings(boot, hostname());
  const ProcessIdentity mine = ProcessIdentity::self();
  lives_.resize(P);
  suspect_since_.reset(new std::atomic<std::int64_t>[P]);
  for (std::size_t p = 0; p < P; ++p) suspect_since_[p] = 0;
  boot.allgather(&mine, lives_.data(), sizeof mine);
  peer_state_.reset(new PeerState[P]);
  failed_.reset(new std::atomic<int>[P]);
  touched_.reset(new std::atomic<bool>[P]);
  for (std::size_t p = 0; p < P; ++p) peer_state_[p] = {this, static_cast<int>(p)}, failed_[p] = 0, touched_[p] = false;
  caps_.name = "ucx";
  caps_.ordered_signal_per_queue = true;  // ucp_worker_fence before the signal's put
  caps_.max_queues = 64;                  // queues are labels here: a flush completes all of them
  caps_.flagged_puts = true;              // bytes, fence, the flag's put
  caps_.one_sided_get = true;             // ucp_get_nbx, completed by the flush
  try {
    connect_endpoints(start_worker());
  } catch (...) {
    close_endpoints();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
    throw;
  }
}

UcxGroup::~UcxGroup() {
  try {
    flush(nullptr, true);  // this rank's last signals and puts reach their peers before the connections close
  } catch (const Error&) {
    // A peer that is gone cannot receive them anyway.
  }
  close_endpoints();
  for (ucp_mem_h m : kept_) ucp_mem_unmap(context_, m);
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

void UcxGroup::make_context() {
  // UCX's TCP transport with bigger segments than its defaults (8K to send, 64K to receive),
  // where the user set none: epx's puts across machines are runs of whole rows. Measured
  // between two namespaces (veth), 4 MiB in 1 MiB puts + quiet: 0.7-0.76 GB/s instead of
  // 0.21-0.26, an 8-byte put + signal one way (ping-pong / 2) 68-75 us instead of 90-115 (the
  // shmem transport sets the same). Through the environment, not overwriting: UCX reads its
  // transports' settings there, and ucp_config_modify warns of them as unknown keys.
  setenv("UCX_TCP_TX_SEG_SIZE", "64K", 0);
  setenv("UCX_TCP_RX_SEG_SIZE", "512K", 0);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": ucx: ucp_config_read failed: " + status_text(s));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_RMA;
  params.mt_workers_shared = 0;
  params.estimated_num_eps = static_cast<std::size_t>(size_);
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    context_ = nullptr;
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": ucx: ucp_init failed: " + status_text(s) +
                                             " (UCX_TLS / UCX_NET_DEVICES name no usable transport?)");
  }
}

void UcxGroup::make_worker() {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;  // the engine's workers put and quiet from several threads
  ucs_status_t s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) {
    worker_ = nullptr;
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": ucx: ucp_worker_create failed: " + status_text(s));
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  if (ucp_worker_query(worker_, &attr) != UCS_OK || attr.thread_mode != UCS_THREAD_MODE_MULTI)
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) +
                                             ": ucx: the worker is not thread-safe (UCS_THREAD_MODE_MULTI), which epx's "
                                             "workers need: this UCX was built without --enable-mt");
}

// Every rank publishes its worker's address ("+" address), or "!" + why it has none: a rank
// whose UCX cannot start fails every rank with its message instead of leaving them waiting
// in the bootstrap. Returns every rank's address.
std::vector<std::string> UcxGroup::start_worker() {
  std::string mine;
  try {
    make_context();
    make_worker();
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    const ucs_status_t s = ucp_worker_get_address(worker_, &address, &length);
    if (s != UCS_OK) throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank_) + ": ucx: ucp_worker_get_address failed: " + status_text(s));
    mine = "+" + std::string(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
  } catch (const Error& e) {
    mine = "!" + std::to_string(static_cast<int>(e.code())) + " " + e.what();
  }
  std::vector<std::string> all = allgather_strings(boot_, mine);
  for (int p = 0; p < size_; ++p) {
    const std::string& a = all[static_cast<std::size_t>(p)];
    if (!a.empty() && a[0] == '+') continue;
    const auto space = a.find(' ');
    const int code = a.size() > 1 ? std::atoi(a.c_str() + 1) : static_cast<int>(ErrorCode::kInternal);
    throw Error(static_cast<ErrorCode>(code), space == std::string::npos ? a : a.substr(space + 1), p);
  }
  for (std::string& a : all) a.erase(0, 1);
  return all;
}

// Each rank makes an endpoint to every other. The connections are wired up lazily, by the
// first operation (both sides progress then). Error handling: PEER (a lost peer fails its
// endpoint instead of aborting the process) to other machines; NONE to this machine's ranks,
// because UCX 1.13 offers its shared-memory transports only without it: with PEER a
// same-machine put went over TCP loopback (measured, 2 ranks: 0.3 GB/s and 75 us per put +
// signal, against 6.4 GB/s and 18 us over sysv/posix). A same-machine peer that dies is seen
// through /proc instead (check_alive).
void UcxGroup::connect_endpoints(const std::vector<std::string>& all) {
  ucs_status_t s = UCS_OK;
  eps_.assign(static_cast<std::size_t>(size_), nullptr);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(all[static_cast<std::size_t>(p)].data());
    ep.err_mode = same_node(p) ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxGroup::on_error;
    ep.err_handler.arg = &peer_state_[static_cast<std::size_t>(p)];
    s = ucp_ep_create(worker_, &ep, &eps_[static_cast<std::size_t>(p)]);
    if (s != UCS_OK) {
      eps_[static_cast<std::size_t>(p)] = nullptr;
      throw Error(ErrorCode::kPeerFailed, "rank " + std::to_string(rank_) + ": ucx: cannot make an endpoint to " + describe(p) +
                                              ": " + status_text(s) + " (no common transport: see UCX_TLS / UCX_NET_DEVICES)", p);
    }
  }
}

// Forced: the flush before it delivered what this rank sent; a peer still connected sees the
// connection close (its endpoint to this rank fails, which matters only if it waits for this
// rank again).
void UcxGroup::close_endpoints() noexcept {
  for (ucp_ep_h& ep : eps_) {
    if (ep == nullptr) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(r)) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
      ucp_request_free(r);
    }
    ep = nullptr;
  }
}

void UcxGroup::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* st = static_cast<PeerState*>(arg);
  int ok = 0;
  st->group->failed_[static_cast<std::size_t>(st->peer)].compare_exchange_strong(ok, static_cast<int>(status));
}

void UcxGroup::note(const char* phase) noexcept {
  if (phase == nullptr || phase_ptr_.exchange(phase, std::memory_order_relaxed) == phase) return;
  try {
    std::lock_guard<std::mutex> lock(phase_mu_);
    phase_ = *phase != '\0' ? phase : "(unnamed)";
  } catch (...) {
    // Out of memory for a phase name: the messages keep the previous one.
  }
}

std::string UcxGroup::phase() const {
  std::lock_guard<std::mutex> lock(phase_mu_);
  return phase_;
}

void UcxGroup::fence(int) {
  // Worker-wide (every thread's earlier operations, to every peer): a superset of what the
  // ordered signal needs, and UCX offers no cheaper per-endpoint fence.
  const ucs_status_t s = ucp_worker_fence(worker_);
  if (s != UCS_OK) throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank_) + ": ucx: ucp_worker_fence failed: " + status_text(s));
}

void UcxGroup::settle(ucs_status_ptr_t r, int peer, const char* what) {
  if (r == nullptr) return;
  if (UCS_PTR_IS_ERR(r)) fail_peer(peer, UCS_PTR_STATUS(r), what);
  ucp_request_free(r);  // completes internally; the next flush waits for it
}

void UcxGroup::fail_peer(int peer, ucs_status_t status, const char* what) const {
  broken_.store(true, std::memory_order_relaxed);
  throw Error(ErrorCode::kPeerFailed,
              "rank " + std::to_string(rank_) + ": ucx: " + what + " " + describe(peer) + " failed in phase '" + phase() +
                  "': " + status_text(status) +
                  " (the peer ended or died, or the link to its machine is down)",
              peer);
}

std::string UcxGroup::describe(int peer) const {
  if (peer < 0 || peer >= size_) return "the other ranks";
  const auto p = static_cast<std::size_t>(peer);
  const bool same = same_node(peer);
  return "rank " + std::to_string(peer) + " (node " + std::to_string(node_of_rank_[p]) + " '" + hosts_[p] + "', " +
         (same ? "this machine)" : "another machine)");
}

// One flush request per peer this worker talked to; each completion is that peer's lap.
// `teardown`: peers whose endpoint failed are skipped and errors end nothing (a peer that
// ended first closed its connections; the others must still get this rank's last signals).
// After a failure too (the group's, with every block still mapped), for at most
// kBrokenTeardown: a put this rank leaves unacknowledged when it closes its connections ends
// its target inside UCX 1.13 (ucp_put_handler's "Fatal: unexpected error" when the
// acknowledgement cannot be sent), measured in the killed-rank test as a survivor's abort in
// 1 of ~15 runs without this flush.
void UcxGroup::flush(std::uint64_t* lap_ns, bool teardown) {
  std::vector<Pending> pending;
  ucp_request_param_t prm{};
  for (int p = 0; p < size_; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (p == rank_ || !touched_[up].load(std::memory_order_relaxed)) continue;
    if (teardown && failed_[up].load(std::memory_order_relaxed) != 0) continue;
    ucs_status_ptr_t r = ucp_ep_flush_nbx(eps_[up], &prm);
    if (UCS_PTR_IS_ERR(r) && !teardown) {
      for (const Pending& q : pending) ucp_request_free(q.request);
      fail_peer(p, UCS_PTR_STATUS(r), "completing puts to");
    }
    if (UCS_PTR_IS_PTR(r)) pending.push_back({p, r});
  }
  if (!pending.empty()) await_flushes(pending, lap_ns, teardown);
}

void UcxGroup::await_flushes(std::vector<Pending>& pending, std::uint64_t* lap_ns, bool teardown) {
  auto since = std::chrono::steady_clock::now();
  const auto deadline = since + (teardown && broken() ? std::min<std::chrono::milliseconds>(timeout_, kBrokenTeardown) : timeout_);
  for (unsigned i = 0; !pending.empty(); ++i) {
    ucp_worker_progress(worker_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      const ucs_status_t s = ucp_request_check_status(it->request);
      if (s == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(it->request);
      const int peer = it->peer;
      it = pending.erase(it);
      if (s != UCS_OK && !teardown) {
        for (const Pending& q : pending) ucp_request_free(q.request);
        fail_peer(peer, s, "completing puts to");
      }
      if (lap_ns != nullptr) lap_ns[peer] += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - since).count());
      since = now;
    }
    if (pending.empty()) return;
    if (now >= deadline) {
      std::string who;
      for (const Pending& q : pending) who += (who.empty() ? "" : ", ") + describe(q.peer), ucp_request_free(q.request);
      broken_.store(true, std::memory_order_relaxed);
      if (teardown) return;
      throw Error(ErrorCode::kTimeout,
                  "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) + " ms in phase '" +
                      phase() + "' completing puts to " + who +
                      " (ucx transport: the peer stopped progressing, or the link to its machine is down)",
                  pending.front().peer);
    }
    if (i >= 64) sched_yield();
  }
}

void UcxGroup::check_waiting(const WaitPoint& where, bool yielding) {
  if (where.peer >= 0 && where.peer < size_) {
    const int s = failed_[static_cast<std::size_t>(where.peer)].load(std::memory_order_relaxed);
    if (s != 0) note(where.phase), fail_peer(where.peer, static_cast<ucs_status_t>(s), "the wait for");
  }
  if (!yielding) return;
  check_alive(where);
  if (!hook_) return;
  thread_local auto last = std::chrono::steady_clock::time_point{};
  const auto now = std::chrono::steady_clock::now();
  if (now - last < kHookEvery) return;
  last = now;
  hook_();
}

void UcxGroup::check_alive(const WaitPoint& where) {
  const int peer = where.peer;
  if (peer < 0 || peer >= size_ || peer == rank_ || !same_node(peer)) return;
  const ProcessIdentity& l = lives_[static_cast<std::size_t>(peer)];
  if (!l.checkable()) return;  // another pid namespace: the timeout decides
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::int64_t next = next_life_check_.load(std::memory_order_relaxed);
  if (now < next || !next_life_check_.compare_exchange_strong(next, now + std::chrono::nanoseconds(std::chrono::milliseconds(20)).count()))
    return;
  const ProcessIdentity::Seen seen = l.look();
  std::atomic<std::int64_t>& suspect = suspect_since_[static_cast<std::size_t>(peer)];
  if (!l.ended(seen)) return suspect.store(0, std::memory_order_relaxed);
  // Death is final: seen again 100 ms later it is reported (a single /proc look was
  // measured to miss a live peer under load, rarely).
  const std::int64_t since = suspect.load(std::memory_order_relaxed);
  if (since == 0) return suspect.store(now, std::memory_order_relaxed);
  if (now - since < std::chrono::nanoseconds(std::chrono::milliseconds(100)).count()) return;
  broken_.store(true, std::memory_order_relaxed);
  throw Error(ErrorCode::kPeerFailed,
              "rank " + std::to_string(rank_) + ": ucx: " + describe(peer) + " (pid " + std::to_string(l.pid) + ": " + l.describe(seen) +
                  ") died while this rank waited for it in phase '" + where.phase + "'",
              peer);
}

void UcxGroup::fail_timeout(const WaitPoint& where) const {
  broken_.store(true, std::memory_order_relaxed);
  throw Error(ErrorCode::kTimeout,
              "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) + " ms in phase '" +
                  where.phase + "' waiting for " + describe(where.peer) + " (ucx transport)",
              where.peer);
}

std::vector<std::string> UcxGroup::exchange(const std::string& mine) {
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      ucp_worker_progress(worker_);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  struct Join {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Join() {
      stop = true;
      t.join();
    }
  } join{stop, helper};
  return allgather_strings(boot_, mine);
}

// ---------------------------------------------------------------------------------------

UcxTransport::UcxTransport(std::shared_ptr<UcxGroup> group) : group_(std::move(group)) {}

UcxTransport::~UcxTransport() { release(); }

int UcxTransport::rank() const noexcept { return group_->rank(); }
int UcxTransport::num_ranks() const noexcept { return group_->size(); }
const TransportCaps& UcxTransport::caps() const noexcept { return group_->caps(); }
std::chrono::milliseconds UcxTransport::timeout() const noexcept { return group_->timeout(); }
void UcxTransport::enter_phase(const char* phase) noexcept { group_->note(phase); }

std::unique_ptr<Transport> UcxTransport::open_endpoint() { return std::make_unique<UcxTransport>(group_); }

// After a failure a peer may still put into this block (UCX writes whatever arrives while
// the worker progresses, unchecked): the block then stays mapped until the group's end.
void UcxTransport::release() noexcept {
  if (memh_ == nullptr) return;
  try {
    if (!group_->broken()) group_->flush(nullptr, true);  // nothing of this block is still read by a get or a put in flight
  } catch (const Error&) {
  }
  for (ucp_rkey_h& k : rkeys_)
    if (k != nullptr) ucp_rkey_destroy(k), k = nullptr;
  rkeys_.clear();
  mapped_.clear();
  if (group_->broken()) group_->keep_mapped(memh_);
  else ucp_mem_unmap(group_->context(), memh_);
  memh_ = nullptr;
  base_ = nullptr;
  block_bytes_ = window_bytes_ = num_signals_ = 0;
}

void UcxTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  release();
  if (window_bytes == 0 && num_signals == 0) return;
  make_block(window_bytes, num_signals);
}

// UCX allocates the block (UCP_MEM_MAP_ALLOCATE): shared memory that its same-machine
// transports map. Returns what this rank publishes: "+" address, packed rkey; or "!" why it
// has none, so that a rank that cannot allocate fails every rank alike instead of leaving
// them waiting.
std::string UcxTransport::map_block(std::size_t bytes) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t s = ucp_mem_map(group_->context(), &mp, &memh_);
  if (s != UCS_OK) {
    memh_ = nullptr;
    return "!ucp_mem_map of " + format_bytes(bytes) + ": " + status_text(s);
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  ucp_mem_query(memh_, &attr);
  base_ = static_cast<std::byte*>(attr.address);
  std::memset(base_, 0, bytes);  // zeroed and pre-faulted before any peer learns the rkey
  void* packed = nullptr;
  std::size_t packed_size = 0;
  s = ucp_rkey_pack(group_->context(), memh_, &packed, &packed_size);
  if (s != UCS_OK) return "!ucp_rkey_pack: " + status_text(s);
  const auto addr = reinterpret_cast<std::uint64_t>(base_);
  std::string mine = "+";
  mine.append(reinterpret_cast<const char*>(&addr), sizeof addr);
  mine.append(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  return mine;
}

// Two all-gathers: the blocks, then whether every rank holds every peer's rkey. The second
// keeps a rank from going on (and perhaps dying) while a peer still attaches to its block:
// UCX 1.13 crashes in ucp_ep_rkey_unpack's error path when the segment is gone.
void UcxTransport::make_block(std::size_t window_bytes, std::size_t num_signals) {
  const int P = num_ranks(), me = rank();
  signal_offset_ = round_page(window_bytes);
  block_bytes_ = signal_offset_ + (num_signals + static_cast<std::size_t>(P)) * sizeof(std::uint64_t);
  const std::vector<std::string> all = group_->exchange(map_block(block_bytes_));
  std::string why;  // "C..." (no block) or "P..." (no rkey) when this rank cannot go on
  for (int p = 0; p < P && why.empty(); ++p) {
    const std::string& blob = all[static_cast<std::size_t>(p)];
    if (blob.size() < 1 + sizeof(std::uint64_t) || blob[0] != '+')
      why = "Crank " + std::to_string(p) + " cannot register its window: " + (blob.empty() ? "(nothing sent)" : blob.substr(1));
  }
  if (why.empty()) why = unpack_rkeys(all);
  const std::vector<std::string> verdicts = group_->exchange(why.empty() ? "+" : "!" + why);
  for (int p = 0; p < P; ++p) {
    const std::string& v = verdicts[static_cast<std::size_t>(p)];
    if (v == "+") continue;
    release();
    const bool capacity = v.size() > 1 && v[1] == 'C';
    throw Error(capacity ? ErrorCode::kCapacityExceeded : ErrorCode::kPeerFailed,
                "rank " + std::to_string(me) + ": ucx: allocate failed on rank " + std::to_string(p) + ": " + (v.size() > 2 ? v.substr(2) : v),
                capacity ? p : -1);
  }
  window_bytes_ = window_bytes;
  num_signals_ = num_signals;
  barrier_epoch_ = 0;
}

// Every peer's block address and rkey; "" or "P" + why not.
std::string UcxTransport::unpack_rkeys(const std::vector<std::string>& all) {
  const int P = num_ranks(), me = rank();
  rkeys_.assign(static_cast<std::size_t>(P), nullptr);
  remote_base_.assign(static_cast<std::size_t>(P), 0);
  mapped_.assign(static_cast<std::size_t>(P), nullptr);
  mapped_[static_cast<std::size_t>(me)] = base_;
  for (int p = 0; p < P; ++p) {
    const std::string& blob = all[static_cast<std::size_t>(p)];
    std::memcpy(&remote_base_[static_cast<std::size_t>(p)], blob.data() + 1, sizeof(std::uint64_t));
    if (p == me) continue;
    const ucs_status_t s = ucp_ep_rkey_unpack(group_->ep(p), blob.data() + 1 + sizeof(std::uint64_t), &rkeys_[static_cast<std::size_t>(p)]);
    if (s != UCS_OK) {
      rkeys_[static_cast<std::size_t>(p)] = nullptr;
      return "Pcannot unpack the rkey of " + group_->describe(p) + ": " + status_text(s);
    }
    // A same-machine peer's block mapped here (UCX's sysv/posix memory): puts become copies
    // and signals release stores, without UCX's per-call cost. Measured, 4 ranks, dispatch +
    // combine of 64 tokens x 2048, median of 6 runs on a loaded 2-core box: 1.20 ms mapped,
    // 1.86 ms through UCX's sysv/posix, 1.44 ms on shm.
    void* at = nullptr;
    if (group_->map_peers() && group_->same_node(p) &&
        ucp_rkey_ptr(rkeys_[static_cast<std::size_t>(p)], remote_base_[static_cast<std::size_t>(p)], &at) == UCS_OK)
      mapped_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(at);
  }
  return "";
}

void UcxTransport::check_range(const char* what, int peer, std::size_t offset, std::size_t bytes) const {
  if (base_ != nullptr && peer >= 0 && peer < num_ranks() && offset <= block_bytes_ && bytes <= block_bytes_ - offset) return;
  throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": ucx: " + what + " of " + std::to_string(bytes) +
                                               " bytes at offset " + std::to_string(offset) + " to rank " + std::to_string(peer) +
                                               " is outside the block of " + std::to_string(block_bytes_) + " bytes");
}

void UcxTransport::put(int peer, std::size_t offset, const void* src, std::size_t bytes, int) {
  if (bytes == 0) return;
  check_range("put", peer, offset, bytes);
  const auto p = static_cast<std::size_t>(peer);
  if (std::byte* dst = mapped_[p]) {
    bulk_copy(dst + offset, src, bytes);
    // Over TCP the other machines' puts into this rank (and this rank's own in flight) move
    // only while it progresses: now and then during a stretch of copies too.
    thread_local std::size_t copied = 0;
    if (group_->has_remote_peers() && (copied += bytes) >= kProgressEveryBytes) copied = 0, group_->progress();
    return;
  }
  ucp_request_param_t prm{};
  group_->settle(ucp_put_nbx(group_->ep(peer), src, bytes, remote_base_[p] + offset, rkeys_[p], &prm), peer, "a put to");
}

void UcxTransport::get(int peer, std::size_t offset, void* dst, std::size_t bytes, int) {
  if (bytes == 0) return;
  check_range("get", peer, offset, bytes);
  const auto p = static_cast<std::size_t>(peer);
  if (const std::byte* src = mapped_[p]) return static_cast<void>(std::memcpy(dst, src + offset, bytes));
  ucp_request_param_t prm{};
  group_->settle(ucp_get_nbx(group_->ep(peer), dst, bytes, remote_base_[p] + offset, rkeys_[p], &prm), peer, "a get from");
}

void UcxTransport::ordered_set(int peer, std::size_t offset, std::uint64_t value) {
  check_range("signal", peer, offset, sizeof value);
  if (std::byte* dst = mapped_[static_cast<std::size_t>(peer)]) {
    // Earlier puts to a mapped peer were copies (bulk_copy ends with a store fence).
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(dst + offset)).store(value, std::memory_order_release);
    return;
  }
  group_->fence(peer);  // earlier puts to `peer` complete before what follows
  // The value must outlive the put, which may wait for room in UCX's send queue: a heap word
  // that the completion callback frees (or this call, if it completed at once).
  auto* word = new std::uint64_t(value);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<std::uint64_t*>(user_data);
    ucp_request_free(request);
  };
  prm.user_data = word;
  const auto p = static_cast<std::size_t>(peer);
  ucs_status_ptr_t r = ucp_put_nbx(group_->ep(peer), word, sizeof *word, remote_base_[p] + offset, rkeys_[p], &prm);
  if (UCS_PTR_IS_PTR(r)) return;  // the callback frees the word and the request
  delete word;
  group_->settle(r, peer, "a signal to");
}

void UcxTransport::signal(int peer, std::size_t slot, std::uint64_t value, int) {
  ordered_set(peer, signal_offset_ + slot * sizeof(std::uint64_t), value);
}

void UcxTransport::put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag, int queue) {
  put(peer, offset, src, bytes, queue);
  ordered_set(peer, offset + bytes, flag);
}

std::uint64_t* UcxTransport::signal_word(std::size_t slot) const noexcept {
  return reinterpret_cast<std::uint64_t*>(base_ + signal_offset_) + slot;
}

std::uint64_t UcxTransport::read_signal(std::size_t slot) noexcept {
  group_->progress();
  return std::atomic_ref<std::uint64_t>(*signal_word(slot)).load(std::memory_order_acquire);
}

void UcxTransport::wait_word(std::uint64_t* word, std::uint64_t at_least, const WaitPoint& where) {
  group_->note(where.phase);
  std::atomic_ref<std::uint64_t> w(*word);
  if (w.load(std::memory_order_acquire) >= at_least) return;
  spi::Backoff backoff(group_->timeout(), kNetworkSpins);
  for (;;) {
    group_->progress();  // over TCP a peer's put lands only while this rank progresses
    if (w.load(std::memory_order_acquire) >= at_least) break;
    group_->check_waiting(where, backoff.yielding());
    if (!backoff.step()) group_->fail_timeout(where);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

void UcxTransport::wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) {
  wait_word(signal_word(slot), at_least, where);
}

void UcxTransport::wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) {
  wait_word(reinterpret_cast<std::uint64_t*>(base_ + offset), at_least, where);
}

void UcxTransport::quiet(int) { group_->flush(nullptr); }

void UcxTransport::quiet_timed(int, std::uint64_t* lap_ns) { group_->flush(lap_ns); }

void UcxTransport::barrier(const char* phase) {
  // A transport whose buffers each opened an endpoint has no block of its own until its first
  // barrier: then one with the barrier's slots only (collective, as the barrier is).
  if (base_ == nullptr) make_block(0, 0);
  ++barrier_epoch_;
  const int P = num_ranks(), me = rank();
  for (int p = 0; p < P; ++p) signal(p, num_signals_ + static_cast<std::size_t>(me), barrier_epoch_, 0);
  for (int p = 0; p < P; ++p) wait_signal(num_signals_ + static_cast<std::size_t>(p), barrier_epoch_, WaitPoint{phase, p});
}

std::unique_ptr<Transport> connect_ucx(Bootstrap& bootstrap, const ConnectOptions& options) {
  return std::make_unique<UcxTransport>(std::make_shared<UcxGroup>(bootstrap, options));
}

}  // namespace epx::detail

namespace epx {
bool ucx_available() noexcept { return true; }
}  // namespace epx
