// epx/transport.hpp — the one interface every transport implements.
//
// A transport connects the P ranks of one expert-parallel group. It offers exactly what
// the engine needs and nothing more, so that a transport whose peer memory is not mapped
// into this address space (OpenSHMEM, a simulator) can implement it:
//
//   * one symmetric window per rank, the same size on every rank, plus an array of 64-bit
//     signal slots per rank;
//   * put(peer, offset, bytes, queue): non-blocking one-sided write into a peer's window;
//   * signal(peer, slot, value, queue): writes a 64-bit value into a peer's signal slot;
//     it becomes visible only after every put this thread issued before it on that queue
//     (the "ordered signal"; see TransportCaps for what a transport guarantees);
//   * wait_signal(slot, at_least, ...): waits until a local slot holds a value >= at_least,
//     with a timeout that becomes an epx::Error naming the peer and the phase;
//   * quiet(queue): every put this thread issued on that queue has landed;
//   * barrier(phase): all ranks have reached it;
//   * put_flagged / wait_flag: data-as-flag blocks (bytes, then an 8-byte epoch that is
//     visible only after them), for protocols that need no separate signal.
//
// A modelling transport (the simulator) also implements the optional
// epx/sim/model_transport.hpp, which the engine looks for once per Buffer; this interface
// carries nothing simulator-only.
//
// Nothing above the transport touches a peer's memory in any other way. Signal values are
// monotonic epochs (never reset), so a slot can be reused without clearing it.
//
// Threading: put/signal/quiet/wait_signal may be called concurrently from several threads
// of one rank (the engine's workers); allocate and barrier are called by one thread per rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace epx {

/// What a transport guarantees; protocols ask for what they need, never guess.
struct TransportCaps {
  const char* name = "";
  /// Peers' windows are mapped into this address space (puts are plain stores).
  bool peer_memory_mapped = false;
  /// A signal is visible only after the same thread's earlier puts on the same queue.
  bool ordered_signal_per_queue = false;
  /// Every put is complete (visible at the target) when put() returns.
  bool put_completes_on_return = false;
  /// Largest queue count this transport supports (queue ids are 0..max_queues-1).
  int max_queues = 1;
  /// put_flagged's flag word becomes visible only after the block's bytes (data-as-flag).
  bool flagged_puts = false;
  /// get() reads peers' windows one-sided (mapped: a copy; OpenSHMEM: shmem_getmem_nbi).
  bool one_sided_get = false;
  /// What one put costs besides its bytes, for the dispatch's send policy (epx/dataplane.hpp
  /// SendPolicy): the fixed time of issuing one put (descriptor, doorbell, work request) in
  /// ns, and the rate a rank's puts leave at in GB/s (= bytes per ns). 0: negligible / not
  /// stated (the policy then keeps cache-sized blocks).
  double put_overhead_ns = 0;
  double put_gbps = 0;
};

/// Where a wait happens, for the timeout / peer-failure error message.
struct WaitPoint {
  const char* phase = "";  ///< e.g. "dispatch notify"
  int peer = -1;           ///< the rank whose signal is awaited (-1: any)
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const noexcept = 0;
  virtual int num_ranks() const noexcept = 0;
  virtual const TransportCaps& caps() const noexcept = 0;

  /// Collective: (re)creates this rank's window of `window_bytes` (zeroed, pre-faulted)
  /// and `num_signals` zeroed signal slots; every rank passes the same sizes. Invalidates
  /// any previous window. Throws kPeerFailed/kTimeout if a peer never arrives.
  virtual void allocate(std::size_t window_bytes, std::size_t num_signals) = 0;

  /// This rank's own window (readable and writable locally), window_bytes() long.
  virtual std::byte* window() noexcept = 0;
  virtual std::size_t window_bytes() const noexcept = 0;

  /// One-sided write of `bytes` bytes from `src` into `peer`'s window at `offset`.
  /// `src` must stay valid until quiet(queue) (or until put returns when
  /// caps().put_completes_on_return). Peer may be this rank.
  virtual void put(int peer, std::size_t offset, const void* src, std::size_t bytes,
                   int queue) = 0;

  /// Writes `value` into `peer`'s signal slot `slot`, ordered after this thread's earlier
  /// puts on `queue` (see caps().ordered_signal_per_queue).
  virtual void signal(int peer, std::size_t slot, std::uint64_t value, int queue) = 0;

  /// Waits until this rank's slot `slot` holds a value >= `at_least` (acquire: the puts
  /// ordered before that signal are visible afterwards). Spins briefly, then yields.
  /// Throws kTimeout after the transport's timeout, kPeerFailed if the awaited peer died.
  virtual void wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) = 0;

  /// Current value of this rank's slot (acquire).
  virtual std::uint64_t read_signal(std::size_t slot) noexcept = 0;

  /// Data-as-flag block: writes `bytes` bytes from `src` into `peer`'s window at `offset`,
  /// then the 8-byte `flag` at `offset + bytes` (8-aligned); a reader that sees the flag
  /// (wait_flag) sees the bytes. Needs caps().flagged_puts.
  virtual void put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes,
                           std::uint64_t flag, int queue) = 0;

  /// Waits until the 8-byte word at `offset` of this rank's window holds >= at_least
  /// (acquire), with the same timeout / peer-failure rules as wait_signal.
  virtual void wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) = 0;

  /// Where peer memory is mapped into this address space: `peer`'s window (this rank's own
  /// for peer == rank()), for reading rows in place (the combine's pull mode reads the
  /// expert ranks' outputs where they lie). nullptr on a transport that cannot offer that
  /// (the default: OpenSHMEM-like transports and the simulator, which models puts only).
  virtual const std::byte* peer_window(int peer) const noexcept { (void)peer; return nullptr; }

  /// One-sided read of `bytes` bytes of `peer`'s window at `offset` into `dst` (any memory
  /// of this process). Non-blocking: `dst` holds the bytes after quiet(queue) (or when get
  /// returns, where caps().put_completes_on_return). Peer may be this rank. Only with
  /// caps().one_sided_get; the default throws kUnsupported. Thread-safety as put.
  virtual void get(int peer, std::size_t offset, void* dst, std::size_t bytes, int queue);

  /// Every put (and get) this thread issued on `queue` has completed.
  virtual void quiet(int queue) = 0;

  /// quiet(queue), and where the transport can tell, which peers it waited for: `lap_ns[p]`
  /// (P entries) += the ns from the call, or from the previous peer's completion, until
  /// peer p's puts were seen complete, peers in the order they completed (the laps add up
  /// to the wait). For the engine's PeerWaits (docs/diagnose.md), an estimate: never needed
  /// for correctness. The default: quiet(queue), nothing charged (a transport whose quiet
  /// has nothing to wait for, or cannot tell the peers apart). Thread-safety as quiet.
  virtual void quiet_timed(int queue, std::uint64_t* lap_ns) {
    (void)lap_ns;
    quiet(queue);
  }

  /// Collective: returns when every rank has called barrier (with the same phase name).
  virtual void barrier(const char* phase) = 0;

  /// Local: this rank now works in `phase` (a string literal, e.g. "epilogue") without
  /// waiting. Waits name their phase themselves; this is for local stretches between them,
  /// so that a rank that dies there is reported in the right phase (the launcher's report,
  /// docs/reliability.md). Nothing to do by default.
  virtual void enter_phase(const char* phase) noexcept { (void)phase; }

  /// Timeout applied to every wait of this transport.
  virtual std::chrono::milliseconds timeout() const noexcept = 0;

  /// Collective: a new endpoint of the same group — the same ranks, caps and timeout — with
  /// a window and signal slots of its own (none until its allocate()), independent of this
  /// transport's and of every other endpoint's: its puts, signals, waits and barriers never
  /// touch theirs, and allocating or destroying it leaves them alone. Every buffer opens one
  /// (epx/buffer_base.hpp), so any number of buffers share a group. Every rank opens and
  /// destroys endpoints in the same order; destroying one is local (BufferBase::destroy()
  /// puts a barrier before it). An endpoint must not outlive the transport it came from.
  /// nullptr: this transport has only its one window (then a buffer uses it directly, one
  /// buffer at a time) — the default, for wrappers that do not forward it.
  virtual std::unique_ptr<Transport> open_endpoint() { return nullptr; }
};

}  // namespace epx
