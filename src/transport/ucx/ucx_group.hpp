// The ucx transport's shared part (ucx_transport.hpp): the UCP context, worker, endpoints and links
// of a group, which every endpoint (UcxTransport) of it uses; and the constants both use.
#pragma once

#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/transport.hpp"
#include "process_identity.hpp"

namespace epx::detail {

class UcxGroup;

namespace ucx {

inline constexpr std::size_t kPage = 4096;
// Pauses a wait takes before it yields (spi::Backoff): each look also progresses the worker,
// so a look costs more than a mapped transport's and it spins less (as the shmem transport).
inline constexpr int kNetworkSpins = 64;
// How often a yielding wait calls ConnectOptions::wait_hook (the Python binding's Ctrl-C).
inline constexpr auto kHookEvery = std::chrono::milliseconds(50);
// How long a teardown after a failure tries to complete this rank's puts (a cut link: all of it).
inline constexpr std::chrono::milliseconds kBrokenTeardown{2000};
// The longest a waiting thread sleeps (a wait or flush for a peer on another machine, the
// progress thread on the worker's event fd) before it looks again: what arrives wakes it
// sooner; this bounds what nothing announces (a hook, a deadline, a same-machine store).
inline constexpr int kSleepMs = 1;
// The progress thread's longest sleep when puts and signals go over links (UCX then carries
// only gets, the goodbye and its keepalive, whose bytes wake it anyway).
inline constexpr int kIdleLinksMs = 10;
inline constexpr std::size_t kProgressEveryBytes = std::size_t{256} << 10;  // of copies to mapped peers, when some peer is remote
inline std::size_t round_page(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }

inline std::string status_text(ucs_status_t s) { return ucs_status_string(s); }

inline std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// The groups with peers on other machines alive in this process (ucx_group.cpp), for their
// goodbye when it exits with one still alive and for a forked child's closing of the links.
struct LiveGroups {
  std::mutex mu;
  std::vector<UcxGroup*> groups;
};
LiveGroups& live_groups();
// This process's established TCP connections and their kernel queues, for a timeout's message.
std::string tcp_queues();

}  // namespace ucx

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
  /// Progresses the worker; when it did something and a thread sleeps in sleep_unless, wakes
  /// it (what this progress did may be what it waits for: its word, its flush).
  void progress() noexcept {
    if (ucp_worker_progress(worker_) != 0 && wakeup_) {
      progressed_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_sleepers();
    }
  }
  /// A thread that waits for `peer` may sleep instead of yielding: the peer is on another
  /// machine (its bytes arrive through a socket, which wakes a link reader or the progress
  /// thread), not a same-machine peer whose stores nothing announces.
  bool sleeps_for(int peer) const noexcept { return wakeup_ && peer >= 0 && peer < size_ && peer != rank_ && !same_node(peer); }
  /// Sleeps until some thread's progress or a link reader did something (they sleep on their
  /// sockets and wake as soon as bytes arrive), or kSleepMs passed; returns at once when
  /// `ready()` already holds. Under load a sleeper is woken by the kernel at once,
  /// where a yielding poll loop waits for its turn (measured: docs/transport.md).
  template <class Ready>
  void sleep_unless(Ready&& ready) noexcept {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t seen = progressed_.load(std::memory_order_seq_cst);
    if (!ready()) sleep_while(seen);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
  /// Puts and signals to a peer on another machine go through the group's own TCP
  /// connection to it (see Link below) rather than UCX: true when every rank set them up,
  /// which a rank does where UCX's own puts would go over TCP (links_refusal: every lane of
  /// its endpoints to other machines is UCX's tcp transport; with an RDMA lane, rc, dc or
  /// ud, UCX's puts stay the path), or when EPX_UCX_LINKS=1 forces them (=0 forbids them).
  bool uses_link(int peer) const noexcept { return links_on_ && !same_node(peer); }
  /// Sends `bytes` from `src` to the absolute address `addr` of `peer` (a put), or, with `src`
  /// null, the 8-byte `value` stored there with release order (a signal or flag), after
  /// everything this rank sent the peer before. Returns when the bytes are in the kernel's
  /// socket buffer (the source may be reused); a later flush() waits for the peer to have
  /// written them. Dropped for a peer that said goodbye.
  void link_send(int peer, std::uint64_t addr, const void* src, std::size_t bytes, std::uint64_t value, const char* what);
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
  /// by the next flush); an error means the peer's endpoint failed, which fails the call
  /// unless the peer said goodbye and the call wrote to it (`is_get` false): see closed().
  void settle(ucs_status_ptr_t r, int peer, const char* what, bool is_get = false);
  /// `peer` (on another machine) closed its group cleanly: it completed its own puts, then
  /// set its word in this rank's goodbye block. It reads nothing more, so a put or signal
  /// to it is dropped, and one that fails on its closed connection is complete; a wait for
  /// it that its words did not end fails at once. Ranks on this machine send no goodbye
  /// (their puts are copies into memory that outlives them; a wait sees their end in /proc).
  bool closed(int peer) const noexcept;
  /// A get to `peer` went out: a flush that finds `peer` closed fails (its bytes are lost).
  void note_get(int peer) noexcept { gets_[static_cast<std::size_t>(peer)].store(true, std::memory_order_relaxed); }
  /// Every operation this worker issued to a peer it talked to is complete at the target.
  void flush(std::uint64_t* lap_ns, bool teardown = false);
  /// Between looks of a wait (whose word is still short of its value): the awaited peer's
  /// endpoint failed or the peer said goodbye, or the caller's hook. `word` is looked at
  /// again first: what the peer put before it failed or closed ends the wait.
  void check_waiting(const WaitPoint& where, bool yielding, const std::uint64_t* word, std::uint64_t at_least);
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
    bool gets;  // a get from the peer was among what the flush completes
  };
  void await_flushes(std::vector<Pending>& pending, std::uint64_t* lap_ns, bool teardown);
  /// A flush to `peer` failed with `s`: nothing lost if the peer said goodbye and no get
  /// from it was pending.
  bool lost_to(int peer, bool gets_pending) const noexcept { return !closed(peer) || gets_pending; }
  void map_goodbye_block();
  void say_goodbye() noexcept;
  static void goodbye_at_exit() noexcept;
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void make_context();
  void make_worker();
  std::vector<std::string> start_worker();
  void connect_endpoints(const std::vector<std::string>& addresses);
  void make_endpoints(const std::vector<std::string>& addresses, const std::vector<int>& peers);
  void close_endpoints() noexcept;
  [[noreturn]] void fail_peer(int peer, ucs_status_t status, const char* what) const;
  /// A same-machine peer this rank waits for (whose endpoint reports nothing: no peer error
  /// handling) died: kPeerFailed. Every 20 ms at most, while a wait yields.
  void check_alive(const WaitPoint& where);
  /// This rank leaves its call because `lost` failed: its left word set at every live rank
  /// (once per group; this machine's through their mapped blocks), whose waits for this
  /// rank then fail at once.
  void tell_left(int lost) const noexcept;
  void check_left(const WaitPoint& where, const std::uint64_t* word, std::uint64_t at_least);
  /// The rank whose failure made `peer` leave its call, or -1.
  int left_because(int peer) const noexcept;

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
  std::unique_ptr<std::atomic<bool>[]> gets_;       // [P] a get from this peer since the last flush began
  // The goodbye block: word p is set by peer p when it closes (its put, after its own puts
  // completed); peer p's copy of this rank's word is at goodbye_remote_[p] + 8 * rank.
  ucp_mem_h goodbye_memh_ = nullptr;
  std::uint64_t* goodbye_ = nullptr;
  // The block's second half: word p is set by peer p (to lost + 1) when it left a call
  // because rank `lost` failed (tell_left); peer p's copy of this rank's word is at
  // goodbye_remote_[p] + 8 * (P + rank).
  std::uint64_t* left_ = nullptr;
  mutable std::atomic<bool> told_left_{false};
  mutable std::uint64_t left_value_ = 0;  // the put's source: valid until the teardown's flush
  std::vector<std::uint64_t> goodbye_remote_;
  std::vector<ucp_rkey_h> goodbye_rkeys_;
  std::vector<std::uint64_t*> peer_blocks_;  // [P] a same-machine peer's goodbye block mapped here, else nullptr
  std::atomic<bool> said_goodbye_{false};
  pid_t owner_ = 0;  // the process that made the group (a forked child must not say its goodbye)
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
  // With peers on other machines, a thread progresses the worker whenever its event fd says
  // UCX has something to do, while the group lives: UCX over TCP serves a peer's gets and
  // lands its goodbye (and, without links, its puts and signals) only while this rank
  // progresses, and between epx calls (a rank waiting in gloo, in the application, or done
  // and about to exit) no epx wait does.
  std::thread progress_thread_;
  std::atomic<bool> progress_stop_{false};
  // UCP_FEATURE_WAKEUP (groups with peers on other machines): the progress thread sleeps on
  // the worker's event fd; the other waiting threads sleep on progressed_ (a futex word that
  // every progress that did something bumps), counted in sleepers_.
  bool wakeup_ = false;
  int efd_ = -1;
  std::atomic<std::uint32_t> progressed_{0};
  std::atomic<int> sleepers_{0};
  void start_progress();
  void stop_progress() noexcept;
  // ---- the links (ucx_links.cpp): puts and signals to other machines over TCP connections
  // of the group's own, where UCX itself would use TCP. UCX 1.13 over TCP has no RMA lane: it
  // moves a put as 64 KiB active messages, each copied on both sides and acknowledged, and
  // lands them only while the target progresses its worker; a connection of our own moves
  // the bytes as gloo does (the kernel's copies only, written by a reader thread that sleeps
  // in recv) and keeps the order that signals need. UCX still carries gets, the goodbye, the
  // keepalive and its endpoints' error reports. Over RDMA (rc, dc, ud lanes) UCX's puts are
  // one-sided and need no target thread: no links then.
  struct Link {
    int out = -1;  // this rank -> the peer: messages; the peer's acknowledgements come back
    int in = -1;   // the peer -> this rank: messages; this rank acknowledges on it
    std::timed_mutex send_mu;  // one message at a time; a sender waits for it with its deadline
    std::atomic<std::uint64_t> sent{0};   // messages written to `out`
    std::atomic<std::uint64_t> acked{0};  // of them, written at the peer (its acknowledgement)
    std::atomic<bool> down{false};        // a connection ended (EOF or an error)
    std::thread reader, ack_reader;
  };
  void connect_links();
  /// "" when this rank wants links (EPX_UCX_LINKS, else UCX's lanes: ucx_lanes.hpp), else why
  /// not; one rank's refusal turns them off for every rank (connect_links' all-gather).
  std::string links_refusal();
  bool connect_outgoing(const std::vector<std::string>& all);
  bool accept_incoming(int listener, int remote);
  void start_links();
  void close_links() noexcept;
  static void close_links_in_child() noexcept;
  void read_link(int peer) noexcept;
  void read_acks(int peer) noexcept;
  void link_down(int peer) noexcept;
  /// Waits until every link message sent before the call is acknowledged (part of flush()).
  void await_links(std::uint64_t* lap_ns, bool teardown);
  std::unique_ptr<Link[]> links_;  // [P]; connections only towards other machines' ranks
  bool links_on_ = false;
  std::atomic<bool> links_closing_{false};
  void sleep_while(std::uint32_t seen) noexcept;  // futex: until progressed_ != seen, kSleepMs at most
  void wake_sleepers() noexcept;
};

}  // namespace epx::detail
