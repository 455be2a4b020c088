// epx/bucket.hpp — all-gather, reduce-scatter and all-reduce on symmetric memory (DeepEP
// V2.5's BucketBuffer; the math is docs/spec.md §8).
//
//   epx::BufferAllocator plan;
//   plan.allocate("grads", {1 << 20}, epx::DType::kF32);
//   epx::BucketBuffer bucket(t, epx::BucketConfig{}, plan);   // collective; groups {}: the world
//   epx::MutableView g = bucket.tensor("grads");                           // a view of the storage
//   ... write this rank's gradients into g ...
//   bucket.all_reduce({g}, 1.0f / t.num_ranks());                           // collective, in place
//
// Groups. A BucketBuffer serves 1..kBucketMaxGroups groups, each a subset of the
// transport's ranks given as its world ranks, ascending and distinct (the world, halves,
// pairs, strided "rails"); every rank passes the same groups in the same order, also the
// ranks that are not members of some. All groups share one storage. A call names its group
// by index (-1: the buffer's only group); member i of a group is its i-th rank (docs/spec.md §8).
//
// Collective calls: every member of the call's group makes the same call (same op, group,
// number of tensors, byte sizes, dtypes, precision, scale) in the same order as every other
// member; ranks outside the group do not take part. A bad input on any member — sizes that
// differ between members, 0 or > kBucketMaxTensors tensors, a tensor outside the storage, a
// reduction that is not float32, misalignment, overlapping tensors — throws epx::Error on
// every member, with one message naming the argument, the rank and what was expected
// (origin_rank = that rank). A call with a group index this buffer does not have, or by a
// rank outside the group, throws on that rank only (kInvalidArgument), without entering
// anything. A peer that dies or stops answering makes the call throw kPeerFailed / kTimeout
// within the transport's timeout; the buffer is not usable after that (destroy it).
//
// Storage. `num_bytes` of this rank's window (or a plan's total_bytes()), zeroed at
// construction, the same size on every rank. Tensors of a call (except all_gather's srcs
// when dsts are given) must lie inside it; their offsets may differ between ranks. Bytes a
// call does not name as its output stay unchanged (the call's internal staging lies
// outside the storage).
//
// Asynchronous calls: *_async returns once every member's call header arrived and was
// checked (input errors throw there, on every member); the data moves on epx's thread
// (or on the thread that calls wait(), whichever comes first). Until wait() returns, the
// call's inputs must stay unchanged and its outputs must not be read, and another call on
// this buffer throws kInvalidArgument on that rank ("a call is pending"). The plain calls
// are *_async(...).wait().
//
// A BucketBuffer is used by one thread at a time (plus epx's own thread for async calls).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "epx/buffer_allocator.hpp"
#include "epx/buffer_base.hpp"
#include "epx/dataplane.hpp"
#include "epx/error.hpp"
#include "epx/tensor.hpp"
#include "epx/transport.hpp"

namespace epx {

/// Groups per BucketBuffer and tensors per call, as DeepEP.
inline constexpr int kBucketMaxGroups = 8;
inline constexpr int kBucketMaxTensors = 64;

/// [0, 1, ..., num_ranks - 1]: the world as a group.
std::vector<int> world_ranks(int num_ranks);

/// What reduce_scatter sends and sums: every member's contribution as float32, or rounded
/// to bf16 first (docs/spec.md §8: v_j = f32(bf16(x_j[e])), the member's own included).
enum class CommPrecision { kFP32, kBF16 };
/// "fp32" | "bf16" (static strings).
const char* to_string(CommPrecision p) noexcept;
/// "fp32" | "bf16"; throws kInvalidArgument naming the accepted values otherwise.
CommPrecision parse_comm_precision(std::string_view name);

/// Which algorithm the last call used (BucketBuffer::last_algorithm), for tests and the bench.
enum class BucketAlgorithm {
  kNone,
  kStaged,    ///< one exchange: every member's data travels with its call header, reduced by each receiver
  kMapped,    ///< header exchange, then each member reads its shard from the peers' windows in place
  kPipelined, ///< header exchange, then chunks through staging slots with credits (puts only)
  kTwoLevel,  ///< the pipelined reduction in member order, machine by machine (puts only)
  kDirect,    ///< all_gather: header exchange, then puts straight into the peers' outputs
  kOneShot,   ///< small calls where peer windows are readable: inputs with the header in the caller's own window, one round
};
/// The names parse_bucket_algorithm accepts ("auto" for kNone); static strings.
const char* to_string(BucketAlgorithm a) noexcept;
/// "auto" (kNone) | "staged" | "mapped" | "pipelined" | "two-level" | "direct" | "one-shot"; throws
/// kInvalidArgument naming the accepted values otherwise.
BucketAlgorithm parse_bucket_algorithm(std::string_view name);

struct BucketOptions {
  /// Where the ranks sit, for the two-level algorithms across machines: a topology spec
  /// (epx/topology.hpp; a RankPlace's `server` is its machine), e.g. "builtin:servers:2".
  /// Empty: one machine when the transport maps the peers' windows, else unknown (flat
  /// algorithms only). Every rank passes the same value.
  std::string topology;
  /// Bytes of one staging slot's payload (a call's small messages, a chunk of the pipelined
  /// algorithms, a one-shot board slot's data); 0 = auto (64 KiB on mapped transports, up to
  /// 1 MiB on the others). The window holds 2 slots per rank of the transport, and on mapped
  /// transports 2 board slots per group, outside the storage.
  std::size_t chunk_bytes = 0;
  /// kNone: each call picks its algorithm (docs/buffers.md). Else the reductions use this one
  /// where it can run (kStaged / kOneShot only when a call's data fits a slot; kTwoLevel only
  /// for all_reduce on a machine-major group; kMapped and kOneShot need readable peer
  /// windows, checked at construction) and all_gather uses kDirect, kStaged or kOneShot if
  /// named: for tests and A/B runs. Forcing kStaged, kPipelined or kTwoLevel on a mapped
  /// transport also brings back the headers' channel exchange (no boards).
  BucketAlgorithm algorithm = BucketAlgorithm::kNone;
  /// How a call's messages complete (docs/buffers.md, "Completion protocols"): explicit
  /// (quiet, then the signal), tail (the signal, ordered after the puts), flag (the one-shot
  /// board's header round: each member's slot carries the call's epoch after its header and
  /// inputs and the members look at it in place, no signal; needs the boards, i.e. readable
  /// peer windows and no forced channel algorithm; the credit channels stay tail). Unset:
  /// tail where the transport orders signals after puts, else explicit (or the
  /// EPX_BUCKET_PROTOCOL environment variable's value, for A/B runs). A protocol the
  /// transport cannot run is refused at construction (epx/spi/kind_support.hpp).
  std::optional<Protocol> protocol{};
};


/// What a BucketBuffer is built for: the `Kind(Transport&, KindConfig)` shape every buffer
/// kind shares (EPConfig, PPConfig, EngramConfig). Every rank passes the same values.
///   epx::BucketBuffer b(t, {.num_bytes = 64 << 20});                          // the world
///   epx::BucketBuffer b(t, {.groups = {{0, 1}, {2, 3}}, .num_bytes = 1 << 20}); // two pairs
///   epx::BucketBuffer b(t, epx::BucketConfig{}, plan);                        // a plan's storage
/// (With a plan, name the type: a bare brace list there could also be the first
/// constructors' groups.)
struct BucketConfig {
  /// 1..kBucketMaxGroups groups, each ascending distinct world ranks (the groups of the
  /// file's header). Empty: one group, every rank of the transport (world_ranks).
  std::vector<std::vector<int>> groups{};
  /// Bytes of storage (> 0) without a plan. With a plan: 0 (the plan's total_bytes()) or
  /// exactly the plan's total_bytes(); another value throws kInvalidArgument locally.
  std::size_t num_bytes = 0;
  BucketOptions options{};
};

/// Where the time of a call went on this rank (BucketBuffer::last_stats), microseconds.
struct BucketStats {
  BucketAlgorithm algorithm = BucketAlgorithm::kNone;
  double exchange_us = 0;  ///< the header exchange: sending headers (and staged data), waiting for every member's
  double data_us = 0;      ///< the data phase: reading, summing, putting (done_us included)
  double done_us = 0;      ///< of data_us, waiting for the other members' done signals
};

namespace detail {
struct BucketCall;
}

/// A call in flight (BucketBuffer::*_async). Move-only; local. Dropping it unwaited waits
/// for the call (its error, if any, is dropped).
class BucketEvent {
 public:
  /// An empty event (valid() false): what a moved-from one is.
  BucketEvent() noexcept;
  BucketEvent(BucketEvent&&) noexcept;
  BucketEvent& operator=(BucketEvent&&) noexcept;
  ~BucketEvent();
  bool valid() const noexcept { return call_ != nullptr; }
  /// wait() would not block.
  bool ready() const noexcept;
  /// Waits up to `timeout` for the call (running it here if epx's thread has not begun it);
  /// true when wait() would not block. For waits that check for signals in between.
  bool wait_for(std::chrono::milliseconds timeout);
  /// The result views wait() will return (their values only once it returned).
  const std::vector<MutableView>& outputs() const;
  /// Waits for the call (running what epx's thread has not begun yet here) and returns its
  /// results, one per tensor: all_gather the gathered tensors (1-D, the srcs' dtype),
  /// reduce_scatter this member's shard of each x (1-D float32 views of the storage),
  /// all_reduce the tensors themselves. Throws the call's epx::Error. Once.
  std::vector<MutableView> wait();

 private:
  friend class BucketBuffer;
  std::shared_ptr<detail::BucketCall> call_;
};

class BucketBuffer final : public BufferBase {
 public:
  /// Collective over every rank of `transport` (which must outlive the buffer): checks that
  /// every rank passes the same groups, size and options (kInvalidArgument naming the first
  /// difference and the rank) and allocates the window: config.num_bytes of storage (> 0),
  /// zeroed, plus the staging slots (kCapacityExceeded when it does not fit in memory).
  BucketBuffer(Transport& transport, const BucketConfig& config)
      : BucketBuffer(transport, groups_of(transport, config), config.num_bytes, config.options) {}
  /// As above with the storage of `plan` (every rank the same plan; its tensors are then
  /// tensor(name)); config.num_bytes 0 or the plan's total_bytes().
  BucketBuffer(Transport& transport, const BucketConfig& config, const BufferAllocator& plan)
      : BucketBuffer(transport, groups_of(transport, config, &plan), plan, config.options) {}
  /// The first constructors, equivalent to the above: BucketBuffer(t, groups, n, options)
  /// is BucketBuffer(t, {.groups = groups, .num_bytes = n, .options = options}) (groups
  /// not empty here), and BucketBuffer(t, groups, plan, options) is
  /// BucketBuffer(t, {.groups = groups, .options = options}, plan).
  BucketBuffer(Transport& transport, const std::vector<std::vector<int>>& groups, std::size_t num_bytes,
               const BucketOptions& options = {});
  BucketBuffer(Transport& transport, const std::vector<std::vector<int>>& groups, const BufferAllocator& plan,
               const BucketOptions& options = {});
  /// Calls destroy() if the caller did not (collective then; errors are swallowed).
  ~BucketBuffer() override;

  /// Collective (over the group's members): docs/spec.md §8 all_gather, batched. `srcs[i]` any
  /// dtype; without `dsts` each src is this member's shard of a storage tensor of
  /// n * src bytes (it starts member * src bytes before the src) which is gathered in
  /// place; with `dsts` (as many as srcs, each n * src bytes, same dtype, in the storage,
  /// not overlapping the srcs or each other) the srcs may lie anywhere in this process.
  BucketEvent all_gather_async(const std::vector<TensorView>& srcs, const std::vector<MutableView>& dsts = {},
                               int group = -1);
  /// Collective: docs/spec.md §8 reduce_scatter, in place: each x float32 in the storage with
  /// numel % n == 0; this member's shard of the sum (times `scale`) replaces its own shard
  /// of x, the rest of x stays unchanged.
  BucketEvent reduce_scatter_async(const std::vector<MutableView>& xs, CommPrecision precision = CommPrecision::kFP32,
                                   float scale = 1.0f, int group = -1);
  /// Collective: docs/spec.md §8 all_reduce, in place: each x float32 in the storage becomes the
  /// sum (times `scale`), bitwise identical on every member.
  BucketEvent all_reduce_async(const std::vector<MutableView>& xs, float scale = 1.0f, int group = -1);

  /// The same calls, waited for: the data phase runs on the calling thread.
  std::vector<MutableView> all_gather(const std::vector<TensorView>& srcs, const std::vector<MutableView>& dsts = {},
                                      int group = -1);
  std::vector<MutableView> reduce_scatter(const std::vector<MutableView>& xs,
                                          CommPrecision precision = CommPrecision::kFP32, float scale = 1.0f,
                                          int group = -1);
  std::vector<MutableView> all_reduce(const std::vector<MutableView>& xs, float scale = 1.0f, int group = -1);

  /// Collective over the members of `ranks` (ascending world ranks, this rank among them):
  /// fails the call named `call` on every one of them with `problem`, as an input error of
  /// this rank would. For a binding whose caller named a group this buffer does not have,
  /// but whose ranks it knows (the other members' call then throws too).
  [[noreturn]] void fail_call(const std::vector<int>& ranks, const char* call, const std::string& problem);

  /// This rank's storage (num_bytes() bytes, the same offsets on every rank); nullptr after destroy().
  std::byte* storage() noexcept;
  /// The storage as a shared reference that keeps this rank's window mapped until it is
  /// dropped, also after destroy() (for views handed to another owner, e.g. Python's).
  std::shared_ptr<std::byte> storage_ref() const;
  std::size_t num_bytes() const noexcept { return num_bytes_; }
  /// A planned tensor (kInvalidArgument naming the plan's names if `name` is not one). Local.
  MutableView tensor(const std::string& name);

  int num_groups() const noexcept { return static_cast<int>(groups_.size()); }
  const std::vector<int>& group_ranks(int group) const;
  /// This rank's position in `group`, -1 if not a member.
  int group_rank(int group) const;
  /// Machines of the group's members (1 when unknown or all on one).
  int group_machines(int group) const;
  /// The algorithm of the last call that passed its header exchange on this rank.
  BucketAlgorithm last_algorithm() const noexcept { return last_algorithm_; }
  /// Phases of the last call whose event was waited for (a pending call's are not final).
  const BucketStats& last_stats() const noexcept { return stats_; }
  /// Bytes of one staging slot's payload (BucketOptions::chunk_bytes after auto).
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

  struct Impl;

 private:
  // config.groups, or the world when empty; with a plan, checks config.num_bytes against it
  // (local: a config every rank passes alike fails alike, before any collective).
  static std::vector<std::vector<int>> groups_of(const Transport& transport, const BucketConfig& config,
                                                 const BufferAllocator* plan = nullptr) {
    if (plan != nullptr && config.num_bytes != 0 && config.num_bytes != plan->total_bytes())
      throw Error(ErrorCode::kInvalidArgument,
                  "rank " + std::to_string(transport.rank()) + ": bucket.create: BucketConfig::num_bytes is " +
                      std::to_string(config.num_bytes) + " but the plan holds " +
                      std::to_string(plan->total_bytes()) + " bytes (pass 0 or the plan's total_bytes())",
                  transport.rank());
    if (!config.groups.empty()) return config.groups;
    return {world_ranks(transport.num_ranks())};
  }
  void init(const std::vector<std::vector<int>>& groups, std::size_t num_bytes, const BufferAllocator* plan,
            const BucketOptions& options);
  void on_destroy() noexcept override;
  std::shared_ptr<detail::BucketCall> begin_call(int op, int group, const char* call);
  BucketEvent gather(const std::vector<TensorView>& srcs, const std::vector<MutableView>& dsts, int group, bool async);
  BucketEvent reduce(int op, const std::vector<MutableView>& xs, CommPrecision precision, float scale, int group,
                     bool async);
  BucketEvent start(std::shared_ptr<detail::BucketCall> call, bool async);
  void exchange(detail::BucketCall& call);
  void check_verdicts(detail::BucketCall& call);

  std::vector<std::vector<int>> groups_;
  std::size_t num_bytes_ = 0;
  std::size_t chunk_bytes_ = 0;
  BufferAllocator plan_;
  BucketAlgorithm last_algorithm_ = BucketAlgorithm::kNone;
  BucketStats stats_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace epx
