// shmem/: the OpenSHMEM transport (Open MPI's oshmem over UCX) for ranks that oshrun /
// mpirun started, on one machine or several.
//
//   * window + signal slots: one shmem_malloc block per allocate(), the same size on every
//     PE, in the symmetric heap (its size: epx::ShmemOptions; a block that does not fit is
//     refused on every PE before shmem_malloc, naming the heap and how to raise it);
//   * put: shmem_putmem_nbi, or a plain copy where shmem_ptr maps the peer's heap here
//     (same-node peers when UCX shares memory between them);
//   * ordered signal: shmem_fence, then one aligned 8-byte put (shmem_ulong_p; OpenSHMEM 1.4
//     has no put_signal, and Open MPI 4.1's shmem_ulong_atomic_set waits for a reply);
//     data-as-flag blocks the same way (bytes, fence, the flag's word); to a mapped peer:
//     copy, then a release store;
//   * quiet: shmem_quiet (completes every put of this PE, a superset of one queue's);
//   * waits poll local memory with a deadline and call opal_progress meanwhile, which
//     drives the runtime's progress (UCX over TCP emulates puts with active messages that
//     the target must poll for); a timeout names the peer, its node and the phase;
//   * shmem_quiet and shmem_fence block inside UCX with no deadline (a cut link: forever), so
//     a watchdog thread ends the process (exit 1, the error on stderr naming the peers with
//     incomplete puts and the last phase) when one of them outlasts the timeout; the
//     launcher then ends the job (where it lets survivors live: after twice the timeout,
//     UCX's time to declare a dead PE's endpoint dead, and by shmem_global_exit, else Open
//     MPI would wait for the dead PE);
//   * barrier: signals through the window like the mapped transports (a deadline, unlike
//     shmem_barrier_all);
//   * where the launcher lets survivors live, a wait that yields looks every 20 ms whether a
//     member's process is gone (seen by a PE of its machine, announced to every member) and
//     then fails at once naming it (kPeerFailed) instead of after the timeout;
//   * while a transport lives, a SIGTERM handler writes one line naming this rank, its node,
//     the phase and the peer awaited (Open MPI's daemons send SIGTERM, then SIGKILL after
//     odls_base_sigkill_timeout, to the ranks they end when another rank or daemon died),
//     then ends the process by SIGTERM's default action (replacing liboshmem's handler, which
//     ignores SIGTERM, so the rank would die of the SIGKILL a second later, silently). The
//     line's pieces are built when the transport is made; the handler only copies them and
//     the current phase and peer (async-signal-safe).
//   * elastic (epx/elastic.hpp; shmem_elastic.cpp): the survivors of a lost PE agree and
//     sum through words of their own (ShmemControl) and rebuild a group over themselves: a
//     transport whose rank i is PE survivors[i], over the same symmetric heap, whose
//     windows reuse the blocks the old group gave back (shmem_malloc would wait for the dead
//     PE). Open MPI must let the survivors live (oshrun --mca orte_abort_on_non_zero_status
//     0); they end the job at exit (end_job_with_group). Joins come from the job's spare
//     PEs (EPX_SHMEM_SPARES; shmem_join.cpp): they wait in connect until admitted into a
//     group over the members' PEs and theirs.
//
// The sources: shmem_runtime.cpp (the runtime, the bootstrap, connect), shmem_transport.cpp
// (the data path), shmem_faults.cpp (the watchdog, the SIGTERM line, the errors naming a
// peer), shmem_elastic.cpp (losing PEs), shmem_join.cpp (spare PEs joining).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/shmem.hpp"
#include "epx/spi/payload_region.hpp"
#include "epx/transport.hpp"
#include "elastic_ops.hpp"

namespace epx::detail {

class ShmemRuntime;
class ShmemControl;

/// connect(kShmem): collective over `bootstrap`, which must be (or agree with) the
/// OpenSHMEM runtime of this job: same rank and size as shmem_my_pe / shmem_n_pes.
std::unique_ptr<Transport> connect_shmem(Bootstrap& bootstrap, const ConnectOptions& options);

class ShmemTransport final : public Transport, public spi::PayloadRegionListener, public ElasticOps {
 public:
  /// `heap_bytes`: the symmetric heap every PE has (the smallest of theirs; 0 = unknown).
  ShmemTransport(std::shared_ptr<ShmemRuntime> runtime, const NodeMap& nodes, std::chrono::milliseconds timeout,
                 std::size_t heap_bytes);
  ~ShmemTransport() override;

  int rank() const noexcept override { return rank_; }
  int num_ranks() const noexcept override { return num_ranks_; }
  const TransportCaps& caps() const noexcept override { return caps_; }
  /// allocate(0, 0) releases the window (shmem_free: collective).
  void allocate(std::size_t window_bytes, std::size_t num_signals) override;
  /// An endpoint: its own shmem_malloc block per allocate (freed by allocate(0, 0); one still
  /// held when the endpoint is destroyed stays in the heap until the job ends, since a free
  /// is collective), counted in this transport's peer_info as well.
  std::unique_ptr<Transport> open_endpoint() override;
  std::byte* window() noexcept override { return base_; }
  std::size_t window_bytes() const noexcept override { return window_bytes_; }
  void put(int peer, std::size_t offset, const void* src, std::size_t bytes, int queue) override;
  /// A copy from a mapped peer, else shmem_getmem_nbi (complete after quiet).
  void get(int peer, std::size_t offset, void* dst, std::size_t bytes, int queue) override;
  void signal(int peer, std::size_t slot, std::uint64_t value, int queue) override;
  void wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) override;
  std::uint64_t read_signal(std::size_t slot) noexcept override;
  void put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                   int queue) override;
  void wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) override;
  const std::byte* peer_window(int peer) const noexcept override;
  void quiet(int queue) override;
  void quiet_timed(int queue, std::uint64_t* lap_ns) override;
  /// quiet_timed's probe of the network peers put to (or read from) since their last probe:
  /// adds each one's lap; the first whose probe did not land within the timeout, or -1.
  /// Where survivors heal it stops at an announced death (kPeerFailed naming it and `phase`).
  int probe_peers(std::uint64_t* lap_ns, const char* phase);
  void barrier(const char* phase) override;
  void enter_phase(const char* phase) noexcept override { note(phase, last_peer_.load(std::memory_order_relaxed)); }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }
  void set_payload_region(std::size_t begin, std::size_t end) override { payload_begin_ = begin, payload_end_ = end; }

  std::vector<ShmemPeerInfo> peer_info() const;

  // Elastic (shmem_elastic.cpp): collective over the group's live ranks / the survivors.
  Membership agree_survivors() override;
  std::unique_ptr<Transport> rebuild_group(const Membership& membership) override;
  std::vector<std::int64_t> sum_over_group(const std::vector<std::int64_t>& values) override;
  // Joins (shmem_join.cpp): the job's spare PEs (EPX_SHMEM_SPARES), admitted by the members.
  void request_ranks(int count) override;
  std::unique_ptr<Transport> admit(const AdmitOptions& options, Admission* admission) override;
  /// connect's end in a job with `spares` spare PEs (`all`: the transport over every PE):
  /// in a member, the group over the first PEs; in a spare, the group it is admitted into
  /// (it waits until then; if the job ends first it ends the process, status 0).
  static std::unique_ptr<Transport> split_spares(std::unique_ptr<ShmemTransport> all, int spares);

 private:
  ShmemTransport(ShmemTransport& parent, int);  // an endpoint
  ShmemTransport(ShmemTransport& old, const Membership& m);  // a group over old's survivors
  /// A group over `pes` (rank i is PE pes[i]; this process is `rank`), over `from`'s heap.
  ShmemTransport(const ShmemTransport& from, std::vector<int> pes, int rank, int lineage, std::chrono::milliseconds timeout);
  /// A spare PE (this, the transport over every PE): waits for an admission (shmem_join.cpp).
  std::unique_ptr<Transport> wait_as_spare();
  /// The spare's side of the admission `stamp` it was invited to: the new group, or null.
  std::unique_ptr<Transport> join_invited(std::uint64_t stamp);
  /// Rank 0 of an admission: the spares it claims (PEs, at most `want`, alive: they
  /// answered its probe within `wait`), and publishes the decision to members and joiners.
  std::vector<int> claim_spares(std::uint64_t stamp, int want, std::chrono::milliseconds wait);
  void publish_admission(const std::vector<int>& joiners, std::uint64_t stamp, std::uint64_t tag, std::uint64_t round);
  /// The new group's members and joiners meet; the members decide over this group whether
  /// it stands for all; rank 0 tells the joiners. The new group or null.
  std::unique_ptr<ShmemTransport> meet_joiners(const std::vector<int>& roster, std::uint64_t stamp);
  /// kBadHandle once a rebuild retired this group (`call` names the call).
  void require_live(const char* call) const;
  /// A block from those the old group gave back (after a loss), the same one on every member.
  void reuse_block(std::size_t bytes);
  /// A PE of `rank`'s machine saw its process gone (announced in the control words).
  bool member_gone(int rank) const noexcept;
  /// agree_survivors' wait for the members' announcements of `stamp`: [P] who arrived (the
  /// others are known dead, or missed the timeout).
  std::vector<bool> arrivals(std::uint64_t stamp);
  /// A barrier over the control words (this group's PEs); throws kTimeout naming the missing rank.
  void control_barrier(const char* phase);
  int pe(int rank) const noexcept { return pe_[static_cast<std::size_t>(rank)]; }
  void make_block(std::size_t window_bytes, std::size_t num_signals);
  void release_heap() noexcept;
  /// kCapacityExceeded (on every PE alike) if a block of `bytes` cannot fit in the heap.
  void check_heap(std::size_t bytes) const;
  /// The heap's size, where it comes from, and how to raise it.
  std::string heap_advice(std::size_t bytes) const;
  /// Where this rank waits now (the watchdog's and the SIGTERM line's phase and peer), on
  /// the transport the rank was given too when this is an endpoint.
  void note(const char* phase, int peer) noexcept;
  /// A blocking runtime call (shmem_quiet / shmem_fence) under the watchdog.
  struct Blocking {
    std::chrono::steady_clock::time_point since;
    const char* call;
    int peer;  // -1: every peer with outstanding puts
  };
  template <class F>
  void guarded(const char* call, int peer, F&& f);
  void watchdog_loop();
  /// How long a shmem_quiet / shmem_fence may block before the watchdog ends the process.
  std::chrono::milliseconds watch_limit() const noexcept;
  [[noreturn]] void watchdog_fire(const Blocking& b);
  /// The 8-byte word at `offset` of the block: this rank's or, mapped, `peer`'s.
  std::uint64_t* signal_word(std::byte* base, std::size_t slot) const noexcept;
  void wait_word(std::uint64_t* word, std::uint64_t at_least, const WaitPoint& where);
  /// kPeerFailed if a member's process is known gone (shmem_elastic.cpp's control words).
  void check_members(const WaitPoint& where);
  /// A member known gone (announced in the control words, or its process seen ended on this
  /// machine): a call over every PE (teardown's shmem_free) could no longer complete.
  bool member_known_gone() const noexcept;
  /// Sets `peer`'s copy of the word at `offset` from this block's start, after every
  /// earlier put of this PE to `peer`.
  void ordered_set(int peer, std::size_t offset, std::uint64_t value);
  void reset_counters(int peer) noexcept;
  void count(int peer, std::size_t offset, std::size_t bytes) noexcept;
  [[noreturn]] void fail_timeout(const WaitPoint& where);
  /// "rank 3 (node 1, another machine)"; -1: "the other ranks".
  std::string describe_peer(int peer) const;
  static bool replaceable_term_action(const struct sigaction& old);
  void install_term_note();
  void remove_term_note() noexcept;
  static void on_term(int sig) noexcept;

  std::shared_ptr<ShmemRuntime> runtime_;
  std::shared_ptr<ShmemControl> control_;  // the elastic words (the runtime's)
  std::vector<int> pe_;                    // [P] the PE of each rank (the identity but in a rebuilt group)
  int lineage_ = 0;                        // rebuilds since the first group
  // Shared by a group and its endpoints: the sequences of its control-word stamps, and the
  // round of the rebuild that retired it (0: live).
  struct GroupState {
    std::atomic<std::uint64_t> agree{0}, sums{0}, barriers{0}, admits{0};
    std::atomic<int> retired{0};
  };
  std::shared_ptr<GroupState> group_ = std::make_shared<GroupState>();
  std::size_t heap_bytes_;            // the heap every PE has (0: unknown)
  std::size_t block_bytes_ = 0;       // this transport's shmem_malloc block
  ShmemTransport* parent_ = nullptr;  // an endpoint's transport
  ShmemTransport& term_root() noexcept;  // the transport without a parent: its counters feed the SIGTERM line
  void mark_outstanding(int peer) noexcept;
  int rank_;
  int num_ranks_;
  std::vector<int> node_of_rank_;
  std::chrono::milliseconds timeout_;
  TransportCaps caps_;
  std::vector<bool> mapped_;          // [P] shmem_ptr reaches the peer's heap
  std::byte* base_ = nullptr;         // this rank's block of the symmetric heap
  std::vector<std::byte*> peer_base_; // [P] mapped address of each peer's block, or nullptr
  std::size_t window_bytes_ = 0;
  std::size_t signal_offset_ = 0;
  std::size_t num_signals_ = 0;
  std::uint64_t barrier_epoch_ = 0;
  std::size_t payload_begin_ = 0, payload_end_ = 0;
  std::unique_ptr<std::atomic<std::uint64_t>[]> puts_, put_bytes_, payload_bytes_;  // [P] since construction (an endpoint's also on its transport)
  std::unique_ptr<std::atomic<bool>[]> outstanding_;  // [P] network puts went to this peer (for the watchdog's message)
  std::unique_ptr<std::atomic<bool>[]> unprobed_;     // [P] network puts / gets since quiet_timed last probed this peer
  std::atomic<bool> gets_out_{false};                 // network gets since the last quiet
  std::atomic<const char*> last_phase_{"setup"};      // of the last wait or enter_phase (watchdog, SIGTERM line)
  std::atomic<int> last_peer_{-1};                    // the peer of the last wait (SIGTERM line)
  std::atomic<int> waiting_{0};                       // threads inside a wait that did not return at once
  std::atomic<int> blocked_{0};                       // threads inside guarded() (shmem_fence / shmem_quiet)
  std::atomic<const char*> blocked_call_{""};         // the last of them, and its peer (-1: every peer
  std::atomic<int> blocked_peer_{-1};                 //   with outstanding puts)
  // The SIGTERM line's fixed pieces: head + phase + one of while_ / in_ / after_ + peers.
  std::string term_head_, term_while_, term_after_;
  std::vector<std::string> term_peer_;                // [P + 1]: the other ranks, rank 0, ...
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::list<Blocking> blocking_;
  bool stop_watch_ = false;
  std::thread watchdog_;
};

}  // namespace epx::detail
