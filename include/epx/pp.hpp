// epx/pp.hpp — PPBuffer: pipeline-parallel send / receive between the ranks of a group
// (DeepEP V2.5's PPBuffer), on every transport (threads, shm, OpenSHMEM, the simulator).
//
//   epx::PPBuffer pp(transport, {.num_max_tensor_bytes = 64 << 20, .num_max_inflight_tensors = 2});
//   pp.send(activation, next_stage);          // returns once the bytes are in the peer's slot
//   pp.recv(grad_out, next_stage);            // waits for the next message from that peer
//   epx::PPView v = pp.recv_view(prev_stage); // or: use the bytes where they lie ...
//   pp.release(v);                            // ... and give the slot back
//
// Semantics (docs/spec.md §9): every ordered pair (s, d) of linked ranks has a FIFO of
// num_max_inflight_tensors slots in d's window. The k-th recv from s on d gets the k-th
// send to d on s, bitwise; the byte count travels with the data, and a receive tensor of
// another byte count is an error naming both counts, the peer and the message's sequence
// number (the message stays first in the FIFO: a receive of the right size gets it).
// A send waits only while all slots of its pair are full (the receiver has not yet taken
// or released that many messages): bounded by the transport's timeout, after which it
// throws kTimeout naming the peer and saying its receives are behind. A receive waits for
// its message (kTimeout naming the peer likewise). Any peer may be addressed, this rank
// included, as long as the pair is linked (PPConfig::links).
//
// send and recv are point-to-point: they involve only the two ranks and fail only on the
// calling rank. Construction and destroy() are collective (epx/buffer_base.hpp).
//
// Planned tensors (DeepEP's BufferAllocator): built with a plan, the buffer's window ends
// with the plan's tensors, tensor(name) views them. A recv() into a planned tensor from a
// mapped peer (shm, threads) takes one copy instead of two: a receiver that has to wait posts
// the tensor's window offset, and the sender writes x straight into it (the bytes it put
// into the slot before it saw the post the receiver copies). The FIFO, the byte-count check
// and every error stay as above; the slot is still taken and released for each message.
//   epx::BufferAllocator plan;
//   plan.allocate("act", {4096, 7168}, epx::DType::kBF16);
//   epx::PPBuffer pp(transport, config, plan);
//   pp.recv(pp.tensor("act"), prev_stage);     // the sender writes into "act" directly
// A PPBuffer is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "epx/buffer_allocator.hpp"
#include "epx/buffer_base.hpp"
#include "epx/dataplane.hpp"
#include "epx/tensor.hpp"

namespace epx {

/// The most slots one ordered pair may have.
inline constexpr int kMaxPPInflight = 64;

/// What a PPBuffer is built for (`epx::PPBuffer pp(transport, {.num_max_tensor_bytes = ...})`,
/// the shape of every buffer kind: EPConfig, BucketConfig, EngramConfig). Every rank passes
/// the same values.
struct PPConfig {
  /// Largest message in bytes (>= 1); a larger one is refused before anything moves.
  std::size_t num_max_tensor_bytes = 0;
  /// Slots per ordered pair (1..kMaxPPInflight): sends a peer has not received yet.
  int num_max_inflight_tensors = 1;
  /// The pairs of ranks that exchange messages, in both directions ({a, b} with a == b
  /// links a rank to itself). Empty: every pair, every rank to itself included. Each rank's
  /// window holds num_max_inflight_tensors slots for each rank linked to it, so a pipeline
  /// passes its stages' links (pp_ring_links, pp_chain_links) to keep windows small.
  /// Every rank passes the same links (checked at construction).
  std::vector<std::pair<int, int>> links{};
  /// Between ranks whose windows are mapped (shm, threads), messages of at least 4 chunks
  /// move in chunks of this many bytes and, when the receiver is already waiting in recv(),
  /// through a ring of 4 chunks per linked rank that the receiver empties as it fills (the
  /// bytes cross memory once). 0: 256 KiB; else a multiple of 64. The window has the rings
  /// when num_max_tensor_bytes is at least 4 chunks.
  std::size_t chunk_bytes = 0;
  /// How a message's receiver learns it has landed (docs/buffers.md, "Completion protocols"):
  /// explicit (quiet, then the arrived signal), tail (the arrived signal, ordered after the
  /// puts), flag (the slot header's last word carries the message number, written after the
  /// bytes; no signal; mapped peers only). Unset: tail where the transport orders signals
  /// after puts, else explicit (or the EPX_PP_PROTOCOL environment variable's value, for A/B
  /// runs). A protocol the transport cannot run is refused at construction
  /// (epx/spi/kind_support.hpp). Every rank passes the same value.
  std::optional<Protocol> protocol{};
};

/// Links of a ring of `num_ranks`: r with (r + 1) % num_ranks (DeepEP's neighbours).
std::vector<std::pair<int, int>> pp_ring_links(int num_ranks);
/// Links of pipelines of `stages` consecutive ranks each: r with r + 1 inside a pipeline
/// (num_ranks % stages == 0; 4 pipelines of 2 on 8 ranks: {0,1},{2,3},{4,5},{6,7}).
std::vector<std::pair<int, int>> pp_chain_links(int num_ranks, int stages);

/// A received message left in its slot (recv_view): `nbytes` bytes at `data`, in this rank's
/// window, valid until release() or destroy().
struct PPView {
  void* data = nullptr;
  std::size_t nbytes = 0;
  int src = -1;            ///< the sender
  std::uint64_t seq = 0;   ///< the message's number on the pair (0, 1, ...)
  std::uint64_t token = 0; ///< identifies the view to release() (0: empty / released)
  /// Keeps the window mapped while held, even after destroy() (the bytes are the sender's
  /// again after release() all the same).
  std::shared_ptr<const void> keep;
};

/// Counters of one peer, since construction.
struct PPPeerStats {
  std::uint64_t sent = 0, received = 0;             ///< messages
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::uint64_t send_wait_ns = 0;  ///< time sends to this peer waited for a free slot
  std::uint64_t recv_wait_ns = 0;  ///< time receives from this peer waited for the message
  std::uint64_t streamed = 0;      ///< messages sent to this peer partly through its ring (PPConfig::chunk_bytes)
  std::uint64_t direct = 0;        ///< messages sent to this peer partly or wholly straight into its planned tensor
};

class PPBuffer : public BufferBase {
 public:
  /// Collective, the `Kind(Transport&, KindConfig)` shape every buffer kind shares: every
  /// rank passes the same config (else kInvalidArgument on every rank naming the first
  /// differing value). Throws kInvalidArgument for a size of 0, an in-flight count outside
  /// 1..kMaxPPInflight or a link naming a rank outside the group, kCapacityExceeded when the
  /// window (slots x linked ranks) does not fit in memory. `transport` must outlive the buffer.
  PPBuffer(Transport& transport, const PPConfig& config);
  /// As above, the window ending with `plan`'s tensors (every rank the same plan, else
  /// kInvalidArgument on every rank naming the first differing entry and the rank).
  PPBuffer(Transport& transport, const PPConfig& config, const BufferAllocator& plan);
  /// Calls destroy() if the caller did not (collective then; errors are swallowed).
  ~PPBuffer() override;

  /// Bytes a window needs for `config` (and `plan`) on `num_ranks` ranks (local, for planning).
  static std::size_t get_buffer_size_hint(int num_ranks, const PPConfig& config, const BufferAllocator& plan = {});

  /// A planned tensor: a view of this rank's window, valid until destroy(). Throws
  /// kInvalidArgument naming the plan's names when `name` is not one. Local.
  MutableView tensor(const std::string& name);
  /// The planned tensors' region of this rank's window (plan.total_bytes() bytes; nullptr
  /// and 0 without a plan or after destroy()).
  std::byte* storage() noexcept;
  std::size_t storage_bytes() const noexcept;
  /// storage(), keeping the window mapped while held (even after destroy()); throws
  /// kInvalidArgument after destroy() and without a plan.
  std::shared_ptr<std::byte> storage_ref();

  /// Sends `x`'s bytes (x.shape.numel() * dtype_size) to `dst_rank`. Returns once they are
  /// in the peer's slot; waits while the pair's slots are all full. Throws
  /// kCapacityExceeded for more than num_max_tensor_bytes, kInvalidArgument for a rank
  /// outside the group or not linked to this one (nothing moved), kTimeout as above.
  void send(const TensorView& x, int dst_rank);

  /// Receives the next message from `src_rank` into `out` (its bytes, any dtype / shape of
  /// the same byte count). Throws kShapeMismatch when the byte counts differ (the message
  /// stays), kInvalidArgument for a bad rank or when every slot of the pair holds a view not
  /// released yet, kTimeout when no message came. `out` inside the planned tensors' region
  /// (storage()) is received into directly (one copy, see above); `out` that starts inside
  /// it and ends past it is refused (kInvalidArgument naming the rank, the peer and both
  /// spans) before anything moves.
  void recv(const MutableView& out, int src_rank);

  /// Receives the next message from `src_rank` without copying it: a view of its slot.
  /// The slot is the sender's again only after release(view). Same errors as recv; with
  /// `expect_nbytes` (not kAnyBytes) a message of another byte count is refused as recv
  /// refuses it (and stays).
  static constexpr std::size_t kAnyBytes = ~std::size_t{0};
  PPView recv_view(int src_rank, std::size_t expect_nbytes = kAnyBytes);
  /// Gives a view's slot back to its sender (views of one pair may be released in any
  /// order). Throws kBadHandle for a view already released or not of this buffer.
  void release(PPView& view);

  const PPConfig& config() const noexcept { return config_; }
  /// This rank's counters for `peer`.
  const PPPeerStats& stats(int peer) const;
  /// Messages sent to `dst_rank` that it has not released yet (0..num_max_inflight_tensors).
  std::uint64_t in_flight(int dst_rank);

 private:
  struct Peeked {
    PPView view;
    std::uint64_t ring_from;  // the chunk from which its bytes come through the ring (stream.hpp)
    bool direct;              // ... or were written into the planned tensor
  };
  // The next message, not taken yet; `into`: recv's tensor (its receive may be posted for
  // streaming, or with `direct` != 0 as planned_offset's), nullptr: a view.
  Peeked peek(int src_rank, std::size_t expect_nbytes, const MutableView* into, std::uint64_t direct);
  // Waits for message n (posting the receive of `post_nbytes` bytes unless kAnyBytes).
  void wait_message(Transport& t, int src_rank, std::uint64_t n, std::size_t post_nbytes, std::uint64_t direct);
  // The bytes of message n into dst's slot (or ring), the header, the arrived signal.
  void move_message(Transport& t, const std::byte* x, std::size_t nbytes, int dst_rank, std::uint64_t n);
  void take(const PPView& view);  // counts it received (its slot is held until release)
  // 1 + the offset of `out` in this rank's window when it lies in the planned region
  // (0: it does not; throws when it straddles the region's end).
  std::uint64_t planned_offset(const MutableView& out, int src_rank);
  void init(Transport& transport, const BufferAllocator* plan);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  PPConfig config_;
  BufferAllocator plan_;
};

}  // namespace epx
