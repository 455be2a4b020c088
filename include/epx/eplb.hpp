// epx/eplb.hpp — the expert-parallel load balancer (EPLB): a redundant-expert planner.
//
// Given the measured load of each logical expert (e.g. tokens routed to it over a window),
// decide how many physical replicas each logical expert gets and on which GPU each replica
// lives, so that the per-GPU load is as even as possible. This is DeepSeek's open-source
// `eplb.py` algorithm, reproduced exactly (same results, same tie-breaking):
//
//  * balanced packing: items in descending weight order (stable on ties) each go to the
//    currently lightest pack that still has room (first such pack on ties); every pack gets
//    exactly n/m items. When n/m == 1 item i simply goes to pack i.
//  * replication: each extra physical slot goes to the logical expert with the highest
//    weight/count (first index on ties).
//  * hierarchical policy (num_groups % num_nodes == 0): pack the expert groups onto nodes by
//    group weight, replicate within each node up to num_replicas/num_nodes slots, then pack
//    the node's replicas (each weighing weight/count) onto the node's GPUs.
//  * global policy (otherwise): the same with one group and one node.
//
// All weights and loads are computed in float32, like the original (torch float32).
// Physical expert p lives on GPU p / (num_replicas / num_gpus).
// All arrays are row-major (C order) std::vector, shapes given in brackets.
//
// Names: one vocabulary with epx/lb.hpp, "replicas". The names to use are StaticReplicaPlan,
// plan_static_replicas, route_through_replicas, route_through_live_replicas, replica_load,
// load_without_replicas and load_imbalance (declared after the first names, each the same
// function); EplbPlan, rebalance_experts (DeepSeek's eplb.py name), map_to_replicas,
// map_to_live_replicas, eplb_gpu_load, eplb_gpu_load_without_replicas and eplb_max_over_avg
// are their first names, kept. A "GPU" of the first names is a rank.
#pragma once

#include <cstdint>
#include <vector>

namespace epx {

/// Replicas planned from measured load (DeepSeek's EPLB): the static counterpart of
/// epx::DynamicReplicaPlan (epx/lb.hpp), which plans them from one batch's routing.
struct StaticReplicaPlan {
  int layers = 0;                     ///< number of MoE layers (rows of the weight matrix)
  int logical_experts = 0;            ///< logical experts per layer
  int num_replicas = 0;               ///< physical expert slots per layer (across all GPUs)
  int max_replicas = 0;               ///< max over all layers and experts of logcnt (last dim of log2phy)
  bool hierarchical = false;          ///< which policy was used (num_groups % num_nodes == 0)
  std::vector<std::int64_t> phy2log;  ///< [layers, num_replicas]: logical expert of each physical slot
  std::vector<std::int64_t> log2phy;  ///< [layers, logical_experts, max_replicas]: physical slots of each
                                      ///< logical expert in replica order (rank 0 first), -1 padded
  std::vector<std::int64_t> logcnt;   ///< [layers, logical_experts]: number of replicas (>= 1) of each expert
};

/// The plan's first name, the same type.
using EplbPlan = StaticReplicaPlan;

/// Plans the replicas. `weight` is [layers, logical_experts] float32 (finite, >= 0).
/// Throws epx::Error(kInvalidArgument) naming the parameter and the reason when: any count is
/// not positive, weight.size() != layers * logical_experts, a weight is negative, NaN or
/// infinite, num_replicas < logical_experts, num_replicas % num_gpus != 0,
/// num_gpus % num_nodes != 0, or (hierarchical policy only) logical_experts % num_groups != 0.
StaticReplicaPlan rebalance_experts(const std::vector<float>& weight, int layers, int logical_experts, int num_replicas,
                           int num_groups, int num_nodes, int num_gpus);

/// Per-GPU load of `plan`, [layers, num_gpus] (double): the sum over the replicas a GPU holds
/// of weight[expert] / logcnt[expert]. GPU of physical slot p = p / (num_replicas / num_gpus).
/// Throws kInvalidArgument if num_gpus does not divide plan.num_replicas or weight has the wrong size.
std::vector<double> eplb_gpu_load(const StaticReplicaPlan& plan, const std::vector<float>& weight, int num_gpus);

/// Per-GPU load without replicas, [layers, num_gpus] (double): the logical experts split evenly
/// in order across the GPUs, GPU g holding experts [g*E/num_gpus, (g+1)*E/num_gpus) (integer
/// division, so each GPU gets floor or ceil of E/num_gpus experts; some get none if E < num_gpus).
std::vector<double> eplb_gpu_load_without_replicas(const std::vector<float>& weight, int layers, int logical_experts,
                                                   int num_gpus);

/// max / mean of each row of a [rows, cols] load matrix, [rows]; 1.0 for a row whose mean is 0.
std::vector<double> eplb_max_over_avg(const std::vector<double>& load, int rows, int cols);

/// How a (token, slot) picks one of its logical expert's replicas.
enum class ReplicaChoice {
  kSpread,        ///< replica (token index) mod logcnt: tokens spread evenly over the replicas
  kPreferRank,    ///< a replica on the token's own rank if there is one (spread among those)
  kPreferServer,  ///< a replica on the token's own server if there is one (spread among those)
};

/// Where the tokens of `rank` come from, for kPreferRank / kPreferServer. Physical expert
/// slot p lives on rank p / (num_replicas / num_ranks).
struct ReplicaRouting {
  int layer = 0;             ///< which layer of the plan
  int rank = 0;              ///< the rank whose tokens are mapped
  int num_ranks = 1;         ///< P; num_replicas % P == 0
  int ranks_per_server = 1;  ///< for kPreferServer: ranks [k*n, (k+1)*n) form server k
  ReplicaChoice choice = ReplicaChoice::kSpread;
};

/// Maps one rank's logical routing to physical experts before dispatch (local, pure):
/// `topk_idx` is [S, K] int64 with values in [-1, logical_experts); returns [S, K] int64 in
/// [-1, num_replicas) — dispatch it with num_experts = num_replicas. Deterministic: the
/// replica of (t, k) depends only on t, the expert and the options. Distinct logical experts
/// map to distinct physical slots, so a token never names a physical expert twice. The
/// received rows' recv_topk_idx are physical; `plan.phy2log` gives the logical expert each
/// serves. Throws kInvalidArgument on a value outside [-1, logical_experts) (naming the
/// token and slot) or when num_replicas % num_ranks != 0.
std::vector<std::int64_t> map_to_replicas(const std::vector<std::int64_t>& topk_idx, int num_topk,
                                          const StaticReplicaPlan& plan, const ReplicaRouting& routing);

/// The routing of a group that lost ranks (epx/elastic.hpp): physical slots in the
/// survivors' numbering, and what could not be served.
struct MaskedRouting {
  std::vector<std::int64_t> topk_idx;  ///< [S, K] int64 in [-1, num_experts): -1 where dropped (or -1 before)
  int num_experts = 0;                 ///< physical slots of the survivors' group: (num_replicas / P) * survivors
  std::int64_t dropped_pairs = 0;      ///< (t, k) whose logical expert has no replica on a live rank
  std::int64_t dropped_tokens = 0;     ///< tokens with at least one dropped pair
};

/// map_to_replicas for a group that lost `lost_ranks` (ranks of the group the plan was made
/// for, P = routing.num_ranks): each (t, k) picks, by the same rule, among the replicas of its
/// logical expert that live on a surviving rank (ReplicaChoice over those; routing.rank is
/// the token's rank in the old numbering); a pair whose expert has no live replica becomes -1
/// and is counted — never silently. Slots are renumbered densely for the rebuilt group
/// (epx::rebuild_group): the slots of the survivors, rank by rank in ascending old rank, so
/// old slot p of rank r = p / (num_replicas / P) becomes p - (num_replicas / P) * (lost ranks
/// below r). Dispatch the result with num_experts = MaskedRouting::num_experts on the rebuilt
/// group; phy2log of the old slot gives the logical expert. With no lost rank: exactly
/// map_to_replicas. Local and pure. Throws kInvalidArgument as map_to_replicas does, and on a
/// lost rank outside [0, P) or named twice, or a routing.rank that is lost.
MaskedRouting map_to_live_replicas(const std::vector<std::int64_t>& topk_idx, int num_topk, const StaticReplicaPlan& plan,
                                   const ReplicaRouting& routing, const std::vector<int>& lost_ranks);

// -- The vocabulary's names (see the header): the same functions, arguments in the order of
// epx/lb.hpp's route_through_replicas (the plan first, then whose tokens, then the tokens).

/// = rebalance_experts. `weight` [layers, logical_experts] float32; num_ranks is its num_gpus.
inline StaticReplicaPlan plan_static_replicas(const std::vector<float>& weight, int layers, int logical_experts,
                                              int num_replicas, int num_groups, int num_nodes, int num_ranks) {
  return rebalance_experts(weight, layers, logical_experts, num_replicas, num_groups, num_nodes, num_ranks);
}

/// = map_to_replicas(topk_idx, num_topk, plan, routing): [S, K] int64 logical -> physical.
inline std::vector<std::int64_t> route_through_replicas(const StaticReplicaPlan& plan, const ReplicaRouting& routing,
                                                        const std::vector<std::int64_t>& topk_idx, int num_topk) {
  return map_to_replicas(topk_idx, num_topk, plan, routing);
}

/// = map_to_live_replicas(topk_idx, num_topk, plan, routing, lost_ranks).
inline MaskedRouting route_through_live_replicas(const StaticReplicaPlan& plan, const ReplicaRouting& routing,
                                                 const std::vector<int>& lost_ranks,
                                                 const std::vector<std::int64_t>& topk_idx, int num_topk) {
  return map_to_live_replicas(topk_idx, num_topk, plan, routing, lost_ranks);
}

/// = eplb_gpu_load: [layers, num_ranks] load of each rank under `plan`.
inline std::vector<double> replica_load(const StaticReplicaPlan& plan, const std::vector<float>& weight,
                                        int num_ranks) {
  return eplb_gpu_load(plan, weight, num_ranks);
}

/// = eplb_gpu_load_without_replicas: [layers, num_ranks] load with the experts split in order.
inline std::vector<double> load_without_replicas(const std::vector<float>& weight, int layers, int logical_experts,
                                                 int num_ranks) {
  return eplb_gpu_load_without_replicas(weight, layers, logical_experts, num_ranks);
}

/// = eplb_max_over_avg: max / mean of each row of a [rows, cols] load (what
/// DynamicReplicaPlan::imbalance_with / imbalance_without hold for one batch).
inline std::vector<double> load_imbalance(const std::vector<double>& load, int rows, int cols) {
  return eplb_max_over_avg(load, rows, cols);
}

namespace eplb_detail {

/// The building blocks, exposed for tests. `weight` is [rows, n] row-major.
/// balanced_packing: n % num_packs == 0; returns pack_index and rank_in_pack, both [rows, n].
void balanced_packing(const std::vector<float>& weight, int rows, int n, int num_packs,
                      std::vector<std::int64_t>& pack_index, std::vector<std::int64_t>& rank_in_pack);

/// replicate_experts: num_phy >= n; returns phy2log [rows, num_phy], rank [rows, num_phy], logcnt [rows, n].
void replicate_experts(const std::vector<float>& weight, int rows, int n, int num_phy,
                       std::vector<std::int64_t>& phy2log, std::vector<std::int64_t>& rank,
                       std::vector<std::int64_t>& logcnt);

}  // namespace eplb_detail

}  // namespace epx
