// `epx bench --eplb`: plan redundant experts (EPLB) from the routing's own expert load, map
// every rank's logical topk_idx to physical replicas before the timed run, check the mapping,
// and compare the per-rank received rows without and with the replicas.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"
#include "epx/bench/routing.hpp"
#include "epx/launch.hpp"

namespace epx::tools {

/// What one routing (logical or physical) gives every rank to receive, counted from topk_idx
/// (count_routes, compact rows).
struct EplbSide {
  std::vector<std::int64_t> recv_rows;   ///< [P] compact rows received ((token, rank) pairs)
  std::vector<std::int64_t> recv_slots;  ///< [P] (t, k) slots routed to the rank's experts
  std::vector<std::int64_t> sent_rows;   ///< [P] rows sent
  std::int64_t total_rows = 0, total_slots = 0, local_rows = 0;  ///< all ranks; local = sender is the receiver
  double rows_imbalance = 0, slots_imbalance = 0;  ///< max / avg over the ranks (1 when nothing is received)
  int max_rows_rank = 0, max_slots_rank = 0;       ///< the most loaded rank (first on ties)
  std::vector<double> planned_load;                ///< [P] the planner's per-GPU load (slots)
  double planned_imbalance = 0;                    ///< max / avg of planned_load
};

struct EplbReport {
  bool enabled = false;
  int ranks = 0, logical_experts = 0, replicas = 0;
  std::string choice;        ///< spread | rank | server
  int ranks_per_server = 1;  ///< for choice server
  std::vector<float> expert_load;    ///< [E] planner input: slots per logical expert, all ranks (oracle)
  std::vector<std::int64_t> logcnt;  ///< [E] replicas per logical expert
  std::vector<std::int64_t> phy2log; ///< [R] logical expert of each physical slot
  std::int64_t mapped_slots = 0;     ///< valid (t, k) slots checked against phy2log
  bool mapping_verified = false;
  EplbSide without, with;            ///< logical routing / physical routing (the timed one)
  int measured_slowest_rank = -1;    ///< highest avg dispatch + combine latency of the timed (physical) run
  /// --eplb-choice dynamic (plan_dynamic_replicas on this batch's counts):
  bool dynamic = false;
  int slots_per_rank = 0;            ///< B = (R - E) / P
  int replicas_used = 0;             ///< slots the planner filled (<= P * B): expert weights moved by prefetch
  std::vector<std::int64_t> mapping; ///< [P, B] logical expert of each slot, -1 unused
  /// The weights the plan moves, timed (time_lb_transfers; empty when not timed):
  std::uint64_t expert_bytes = 0;    ///< --eplb-expert-bytes
  std::vector<double> prefetch_us;   ///< per iteration: barrier to barrier around prefetch_weights
  std::vector<double> reduce_us;     ///< the same around reduce_grads (float32 gradients of expert_bytes)
};

/// --eplb: plans R replicas (--eplb-choice dynamic: plan_dynamic_replicas from the batch's own
/// per-rank counts, B = (R - E) / P slots per rank, routed with route_through_replicas) with rebalance_experts(load, 1, E, R, 1, 1, P) from the problem's
/// own logical routing, maps every rank's topk_idx with map_to_replicas IN PLACE (p.experts
/// becomes R, p.source says so), checks that every physical slot maps back to the logical
/// expert it came from and counts both routings. Throws epx::Error(kInvalidArgument) for
/// --eplb-* values that do not fit the shape, kInternal if the mapping check fails.
EplbReport apply_eplb(const BenchOptions& o, BenchProblem& p);

/// --eplb-choice dynamic with --eplb-expert-bytes > 0: on P fresh ranks of `launch` (a
/// Buffer of the run's shape), times prefetch_weights of one weight tensor of expert_bytes
/// per expert into e.mapping's slots, then reduce_grads of float32 gradients of the same
/// size back, `iters` times each (after one untimed pair), into e.prefetch_us / e.reduce_us.
/// The moved bytes are checked (every slot holds its expert's weights) and the reduced
/// gradient against the count of replicas (all gradients 1.0f). Collective inside.
void time_lb_transfers(const BenchOptions& o, const BenchProblem& p, const LaunchOptions& launch, int iters,
                       const std::string& scratch_dir, EplbReport& e);

}  // namespace epx::tools
