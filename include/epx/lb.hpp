// epx/lb.hpp — redundant experts at work: weights to the replicas, gradients back home, and
// replicas chosen from the batch itself (DeepEP's lb_prefetch_weights / lb_reduce_grads).
//
// Load balancing has one vocabulary, "replicas", here and in epx/eplb.hpp: a logical expert's
// copies are its replicas (its home copy and the redundant slots holding it); a plan says
// which replicas exist (ReplicaPlacement, StaticReplicaPlan from measured load,
// DynamicReplicaPlan from this batch); routing sends each (token, k) to one replica
// (route_through_replicas). The first names (LbPlacement, LbDirection, LbToken, LbTransfer,
// LbEvent, plan_lb_transfer; EplbPlan, rebalance_experts, map_to_replicas, ... in
// epx/eplb.hpp) stay as aliases of the same types and functions; docs/cpp.md, "Names".
//
// Placement model (the same on every rank):
//   * P ranks, each the home of L logical experts: logical expert e lives on rank e / L as
//     home expert e % L. Every rank holds its home experts' tensors ("expert_weights").
//   * Every rank has B redundant slots ("redundant_weights"); ReplicaPlacement::mapping [P, B]
//     names the logical expert each slot of each rank holds (-1 = unused). Global slot
//     number of slot b on rank d: g = d * B + b.
//   * A weight "kind" (w1, w2, ...) is one tensor per expert of the same byte size on every
//     expert; a rank passes, per kind, its L home tensors back to back and its B slot tensors
//     back to back (ExpertTensors). Several kinds per expert, any byte sizes.
//
// Movement: a layer above the engine. Each expert's bytes (its kinds concatenated, in kind
// order) are cut into rows of 2*H bytes (H = the Buffer's hidden, the last row padded) and
// each row travels as one bf16 "token" of a compact-layout dispatch (docs/spec.md §3.1 moves rows
// bitwise), its topk naming local expert 0 of every destination rank. More destinations than
// K or more rows than the Buffer takes per call make more tokens / more rounds (dispatches).
// plan_replica_transfer is the one owner of which row travels in which round as which token.
//
//   epx::ReplicaPlacement pl{.home_experts = L, .slots = B, .mapping = m};  // same on all ranks
//   epx::prefetch_weights(buffer, {{slots_w1, w1_bytes}}, {{home_w1, w1_bytes}}, pl);
//   ... forward + backward through the replicas (plan_dynamic_replicas, route_through_replicas) ...
//   epx::reduce_grads(buffer, {{slot_g1, w1_f32_bytes}}, {{home_g1, w1_f32_bytes}}, pl);
//
// Collectives here must be called by every rank of the Buffer, in the same order as its other
// collectives, with the same placement and byte sizes; they use the Buffer's dispatch (one
// per round), so nothing else may use the Buffer meanwhile. Errors: epx::Error. A locally
// invalid argument (shape, range, size) throws on every rank (the bad rank with the reason,
// the others with the dispatch error naming it as origin_rank). Ranks that disagree on the
// placement or sizes are caught by the receivers' row checks (kInvalidArgument on the rank
// that sees the mismatch; the others then fail by the transport's timeout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <future>
#include <vector>

#include "epx/buffer.hpp"

namespace epx {

/// Which logical expert each redundant slot holds. The same on every rank.
struct ReplicaPlacement {
  int home_experts = 0;               ///< L >= 1: logical experts per rank (E_log = P * L)
  int slots = 0;                      ///< B >= 0: redundant slots per rank
  std::vector<std::int64_t> mapping;  ///< [P, B] int64: logical expert in [0, P*L) of each slot, or -1
};

/// One weight kind on this rank: `count` tensors of `bytes_per_expert` bytes each, back to
/// back (tensor i at data + i * bytes_per_expert). count = L for home experts, B for slots.
/// Not owned; must stay valid (and untouched by others) for the duration of the call.
struct ExpertTensors {
  void* data = nullptr;
  std::size_t bytes_per_expert = 0;
};

/// Direction of a transfer.
enum class ReplicaDirection {
  kToReplicas,  ///< prefetch: home expert rows to every slot holding that expert
  kToHome,      ///< reduce: every used slot's rows to its expert's home rank
};

/// One token of a transfer: `row` of `item`'s bytes (item = logical expert for kToReplicas,
/// global slot for kToHome), sent to the ranks dests[first_dest, first_dest + num_dests).
struct ReplicaToken {
  std::int64_t item = 0;
  std::int64_t row = 0;
  int first_dest = 0;
  int num_dests = 0;
};

/// Which rows travel in which round as which token: computed identically on every rank from
/// the placement, the bytes per expert and the Buffer's shape (plan_replica_transfer).
struct ReplicaTransfer {
  ReplicaDirection direction = ReplicaDirection::kToReplicas;
  int ranks = 0;
  std::size_t row_bytes = 0;           ///< 2 * H
  std::size_t expert_bytes = 0;        ///< the kinds' bytes_per_expert summed
  std::int64_t rows_per_expert = 0;    ///< ceil(expert_bytes / row_bytes)
  std::int64_t tokens_per_round = 0;   ///< T: at most T tokens per rank per round
  int rounds = 0;                      ///< dispatches (0 when nothing moves)
  std::vector<ReplicaToken> tokens;    ///< by (source rank, round, token index)
  std::vector<std::int64_t> offsets;   ///< [P * rounds + 1]: tokens of (s, r) = [offsets[s*rounds+r], next)
  std::vector<int> dests;              ///< destination ranks of the tokens
  std::uint32_t fingerprint = 0;       ///< a hash of every input, carried by each row (< 2^24)

  /// The tokens source `s` sends in round `r`: [begin, end) into `tokens`.
  std::int64_t begin(int s, int r) const { return offsets[static_cast<std::size_t>(s * rounds + r)]; }
  std::int64_t end(int s, int r) const { return offsets[static_cast<std::size_t>(s * rounds + r + 1)]; }
  /// Bytes this transfer puts on the wire (rows x destinations x row_bytes, local rows included).
  std::int64_t wire_bytes() const;
};

/// Plans a transfer (local, pure). Prefetch: rank h sends, for each home expert e ascending
/// that some slot holds, each row of e once to each rank holding it (up to `max_dests`
/// destination ranks per token). Reduce: rank d sends, for each used slot b ascending, each
/// row of it to the home of mapping[d][b]. Token i of a rank goes in round i / T. Throws
/// kInvalidArgument for a placement of the wrong shape or with a value outside [-1, P*L).
ReplicaTransfer plan_lb_transfer(ReplicaDirection direction, const ReplicaPlacement& placement, int ranks,
                                 std::size_t expert_bytes, std::size_t row_bytes, int max_dests,
                                 std::int64_t tokens_per_round);
/// The same plan under the vocabulary's name (plan_lb_transfer is its first name).
inline ReplicaTransfer plan_replica_transfer(ReplicaDirection direction, const ReplicaPlacement& placement, int ranks,
                                             std::size_t expert_bytes, std::size_t row_bytes, int max_dests,
                                             std::int64_t tokens_per_round) {
  return plan_lb_transfer(direction, placement, ranks, expert_bytes, row_bytes, max_dests, tokens_per_round);
}

/// Collective: every used redundant slot receives a bitwise copy of its logical expert's
/// tensors (every kind) from the expert's home rank. `expert_weights` [kinds] are read,
/// `redundant_weights` [kinds] written (slot tensors of unused slots are left alone); both
/// lists have the same kinds with the same bytes_per_expert, on every rank. Returns when this
/// rank's slots hold the bytes (and this rank's rows are sent).
void prefetch_weights(EPBuffer& buffer, const std::vector<ExpertTensors>& redundant_weights,
                      const std::vector<ExpertTensors>& expert_weights, const ReplicaPlacement& placement);

/// Collective: in place, for every home expert and every float32 element i,
///   home[i] = ((home[i] + g_0[i]) + g_1[i]) + ...
/// over the slots holding that expert, in ascending global slot (d * B + b), float32 adds
/// (bit-reproducible: the same bits on every run and transport). `expert_grads` and
/// `redundant_grads` are float32 (bytes_per_expert % 4 == 0); slot gradients are read only.
void reduce_grads(EPBuffer& buffer, const std::vector<ExpertTensors>& redundant_grads,
                  const std::vector<ExpertTensors>& expert_grads, const ReplicaPlacement& placement);

/// The completion of an asynchronous LB collective. wait() returns when it is done (or
/// throws its error); the destructor waits too. Until then the Buffer and the tensors passed
/// belong to the worker thread: no other call may use them.
class ReplicaEvent {
 public:
  ReplicaEvent() = default;
  explicit ReplicaEvent(std::future<void> f) : f_(std::move(f)) {}
  bool valid() const noexcept { return f_.valid(); }
  void wait() {
    if (f_.valid()) f_.get();
  }

 private:
  std::future<void> f_;
};

/// prefetch_weights on a worker thread: issue now (e.g. before the previous layer's compute),
/// wait later. The vectors are copied; the tensors they point to must stay valid until wait.
ReplicaEvent prefetch_weights_async(EPBuffer& buffer, std::vector<ExpertTensors> redundant_weights,
                                    std::vector<ExpertTensors> expert_weights, ReplicaPlacement placement);

/// Redundant experts chosen from this batch's routing.
///
/// Physical experts: P * (L + B); rank d holds [d*(L+B), (d+1)*(L+B)): its L home experts
/// (physical d*(L+B) + i = logical d*L + i), then its B slots (physical d*(L+B) + L + b).
/// Dispatch the routed topk_idx with num_experts = P * (L + B).
struct DynamicReplicaPlan {
  int ranks = 0, home_experts = 0, slots = 0;
  ReplicaPlacement placement;                   ///< mapping [P, B] for prefetch / reduce
  std::vector<std::int64_t> counts;             ///< [P, E_log] the input
  std::vector<std::int64_t> expert_slots;       ///< [E_log] n_e: (t, k) slots of e over all ranks
  /// Replicas of logical expert e in replica order (home first, then its slots by ascending
  /// global slot): physical experts replica_phys[replica_offsets[e] .. replica_offsets[e+1]).
  std::vector<std::int64_t> replica_offsets;    ///< [E_log + 1]
  std::vector<std::int64_t> replica_phys;
  /// Rows (t, k slots) each replica takes, parallel to replica_phys; e's sum to n_e.
  std::vector<std::int64_t> replica_rows;
  std::vector<std::int64_t> rows_without;       ///< [P] slots each rank's home experts get, no replicas
  std::vector<std::int64_t> rows_with;          ///< [P] slots each rank's experts get through the plan
  int replicas_used = 0;                        ///< used slots over all ranks
  double imbalance_without = 1, imbalance_with = 1;  ///< max / mean of rows_* (1 when nothing is routed)
};

/// Plans the replicas (local, pure, deterministic: the same counts give the same plan on every
/// rank). `counts` [P, E_log] int64 >= 0: (t, k) slots each rank routes to each logical expert
/// (E_log = P * L, all-gathered so that every rank has all of it).
///
/// Rows of an expert are split among its replicas unevenly where that balances better: for a
/// placement, replica_rows is a max flow (source -> expert e, n_e -> every rank holding e ->
/// sink, T) at the least T (the peak) that fits every row (Dinic, fixed order: deterministic).
/// Greedy placement: while free slots remain, take the ranks at the peak under those rows
/// (ascending) and, on each, its replicas by the rows they take there (most first, lowest
/// expert on ties); add a replica of the first expert for which a slot on the lightest rank that has a
/// free slot and does not hold it yet (lowest index on ties) lowers the rows that do not fit
/// under peak - 1 (so the peak falls eventually); stop when none does. Never above no replicas.
/// Routing (route_through_replicas): replica j of e takes e's (t, k) slots at global positions
/// [R_j, R_j + replica_rows[j]) (R_j: rows of the replicas before j), positions numbering e's
/// slots rank-major (rank 0's by token, then rank 1's ...). So rows_with[d] is exactly what an
/// expanded dispatch delivers to rank d (its num_recv_tokens_per_expert summed). Cost: up to
/// P * B greedy steps, each a few max flows on E_log + P nodes (host-side, once per batch). Throws
/// kInvalidArgument for a counts size other than P * E_log, a negative count, P < 1, L < 1 or B < 0.
DynamicReplicaPlan plan_dynamic_replicas(const std::vector<std::int64_t>& counts, int num_ranks, int home_experts,
                                         int slots_per_rank);

/// Maps `rank`'s logical routing (topk_idx [S, K] int64 in [-1, E_log), the one counts[rank]
/// was counted from) to physical experts of the plan (local, pure). Throws kInvalidArgument
/// for a value out of range or a routing whose counts differ from counts[rank].
std::vector<std::int64_t> route_through_replicas(const DynamicReplicaPlan& plan, int rank,
                                                 const std::vector<std::int64_t>& topk_idx, int num_topk);

/// counts[e] of one rank's routing (topk_idx [S, K], -1 skipped): what each rank contributes to
/// plan_dynamic_replicas's input. Throws kInvalidArgument for a value outside [-1, num_experts).
std::vector<std::int64_t> count_expert_slots(const std::vector<std::int64_t>& topk_idx, int num_experts);

/// The first names of the types above, the same types (kept so that existing code builds).
using LbPlacement = ReplicaPlacement;
using LbDirection = ReplicaDirection;
using LbToken = ReplicaToken;
using LbTransfer = ReplicaTransfer;
using LbEvent = ReplicaEvent;

}  // namespace epx
