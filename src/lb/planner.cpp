// planner.cpp — redundant experts chosen from this batch's routing (plan_dynamic_replicas)
// and the routing through them (route_through_replicas). See epx/lb.hpp.
#include <algorithm>
#include <string>

#include "epx/error.hpp"
#include "epx/lb.hpp"

namespace epx {

namespace {

using std::size_t;
size_t at(std::int64_t i) { return static_cast<size_t>(i); }

[[noreturn]] void invalid(const std::string& m) { throw Error(ErrorCode::kInvalidArgument, m); }

// Replica j of m takes e's slots [floor(j n / m), floor((j+1) n / m)): the one owner of the share rule.
std::int64_t share_begin(std::int64_t j, std::int64_t n, std::int64_t m) { return j * n / m; }
// The replica of global position q in [0, n): the largest j with share_begin(j) <= q.
std::int64_t replica_of(std::int64_t q, std::int64_t n, std::int64_t m) { return ((q + 1) * m - 1) / n; }

double max_over_mean(const std::vector<std::int64_t>& v) {
  std::int64_t mx = 0, sum = 0;
  for (std::int64_t x : v) {
    mx = std::max(mx, x);
    sum += x;
  }
  return sum > 0 ? static_cast<double>(mx) * static_cast<double>(v.size()) / static_cast<double>(sum) : 1.0;
}

// The state of the greedy: the ranks of each expert's replicas in replica order.
struct Placement {
  int P, L, B;
  std::vector<std::vector<std::int64_t>> slots;  // [E] global slots holding e, ascending
  std::vector<int> used;                         // [P] slots taken on each rank
  std::vector<std::int64_t> loads(const std::vector<std::int64_t>& n) const {
    std::vector<std::int64_t> load(at(P), 0);
    for (size_t e = 0; e < slots.size(); ++e) {
      const std::int64_t m = 1 + static_cast<std::int64_t>(slots[e].size());
      for (std::int64_t j = 0; j < m; ++j) {
        const int rank = j == 0 ? static_cast<int>(e) / L : static_cast<int>(slots[e][at(j - 1)] / B);
        load[at(rank)] += share_begin(j + 1, n[e], m) - share_begin(j, n[e], m);
      }
    }
    return load;
  }
  bool holds(int rank, std::int64_t e) const {
    if (e / L == rank) return true;
    for (std::int64_t g : slots[at(e)])
      if (g / B == rank) return true;
    return false;
  }
};

std::pair<std::int64_t, int> peak(const std::vector<std::int64_t>& load) {
  const std::int64_t mx = *std::max_element(load.begin(), load.end());
  return {mx, static_cast<int>(std::count(load.begin(), load.end(), mx))};
}

}  // namespace

std::vector<std::int64_t> count_expert_slots(const std::vector<std::int64_t>& topk_idx, int num_experts) {
  std::vector<std::int64_t> c(at(std::max(0, num_experts)), 0);
  for (size_t i = 0; i < topk_idx.size(); ++i) {
    const std::int64_t e = topk_idx[i];
    if (e == -1) continue;
    if (e < -1 || e >= num_experts)
      invalid("count_expert_slots: topk_idx flat index " + std::to_string(i) + " = " + std::to_string(e) +
              " is outside [-1, " + std::to_string(num_experts) + ")");
    ++c[at(e)];
  }
  return c;
}

DynamicReplicaPlan plan_dynamic_replicas(const std::vector<std::int64_t>& counts, int num_ranks, int home_experts,
                                         int slots_per_rank) {
  const int P = num_ranks, L = home_experts, B = slots_per_rank;
  if (P < 1 || L < 1 || B < 0)
    invalid("plan_dynamic_replicas: need num_ranks >= 1, home_experts >= 1, slots_per_rank >= 0; got " +
            std::to_string(P) + ", " + std::to_string(L) + ", " + std::to_string(B));
  const std::int64_t E = std::int64_t{P} * L;
  if (counts.size() != at(P) * at(E))
    invalid("plan_dynamic_replicas: counts has " + std::to_string(counts.size()) + " values, expected P * E_log = " +
            std::to_string(P) + " * " + std::to_string(E));
  DynamicReplicaPlan plan;
  plan.ranks = P;
  plan.home_experts = L;
  plan.slots = B;
  plan.counts = counts;
  plan.expert_slots.assign(at(E), 0);
  for (int r = 0; r < P; ++r)
    for (std::int64_t e = 0; e < E; ++e) {
      const std::int64_t c = counts[at(r) * at(E) + at(e)];
      if (c < 0)
        invalid("plan_dynamic_replicas: counts[" + std::to_string(r) + "][" + std::to_string(e) + "] = " + std::to_string(c) +
                " is negative");
      plan.expert_slots[at(e)] += c;
    }
  const std::vector<std::int64_t>& n = plan.expert_slots;

  Placement st{P, L, B, std::vector<std::vector<std::int64_t>>(at(E)), std::vector<int>(at(P), 0)};
  std::vector<std::int64_t> load = st.loads(n);
  plan.rows_without = load;
  for (int step = 0; step < P * B; ++step) {
    const auto before = peak(load);
    const int heavy = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    // The heavy rank's experts, heaviest per replica first (n_e / m_e, lowest e on ties).
    std::vector<std::int64_t> cand;
    for (std::int64_t e = 0; e < E; ++e)
      if (n[at(e)] > 0 && st.holds(heavy, e)) cand.push_back(e);
    std::stable_sort(cand.begin(), cand.end(), [&](std::int64_t a, std::int64_t b) {
      const std::int64_t ma = 1 + static_cast<std::int64_t>(st.slots[at(a)].size());
      const std::int64_t mb = 1 + static_cast<std::int64_t>(st.slots[at(b)].size());
      return n[at(a)] * mb > n[at(b)] * ma;
    });
    bool placed = false;
    for (std::int64_t e : cand) {
      int target = -1;
      for (int d = 0; d < P; ++d)
        if (st.used[at(d)] < B && !st.holds(d, e) && (target < 0 || load[at(d)] < load[at(target)])) target = d;
      if (target < 0) continue;
      const std::int64_t g = std::int64_t{target} * B + st.used[at(target)];
      auto& s = st.slots[at(e)];
      s.insert(std::upper_bound(s.begin(), s.end(), g), g);
      ++st.used[at(target)];
      std::vector<std::int64_t> next = st.loads(n);
      if (peak(next) < before) {
        load = std::move(next);
        placed = true;
        break;
      }
      s.erase(std::find(s.begin(), s.end(), g));
      --st.used[at(target)];
    }
    if (!placed) break;
  }

  plan.placement.home_experts = L;
  plan.placement.slots = B;
  plan.placement.mapping.assign(at(P) * at(B), -1);
  plan.replica_offsets.assign(at(E) + 1, 0);
  for (std::int64_t e = 0; e < E; ++e) {
    plan.replica_phys.push_back((e / L) * (L + B) + e % L);
    for (std::int64_t g : st.slots[at(e)]) {
      plan.placement.mapping[at(g)] = e;
      plan.replica_phys.push_back((g / B) * (L + B) + L + g % B);
      ++plan.replicas_used;
    }
    plan.replica_offsets[at(e) + 1] = static_cast<std::int64_t>(plan.replica_phys.size());
  }
  plan.rows_with = load;
  plan.imbalance_without = max_over_mean(plan.rows_without);
  plan.imbalance_with = max_over_mean(plan.rows_with);
  return plan;
}

std::vector<std::int64_t> route_through_replicas(const DynamicReplicaPlan& plan, int rank,
                                                 const std::vector<std::int64_t>& topk_idx, int num_topk) {
  const std::int64_t E = std::int64_t{plan.ranks} * plan.home_experts;
  if (rank < 0 || rank >= plan.ranks)
    invalid("route_through_replicas: rank " + std::to_string(rank) + " outside [0, " + std::to_string(plan.ranks) + ")");
  if (num_topk < 1 || topk_idx.size() % at(num_topk) != 0)
    invalid("route_through_replicas: rank " + std::to_string(rank) + ": topk_idx size " + std::to_string(topk_idx.size()) +
            " is not a multiple of num_topk = " + std::to_string(num_topk));
  const std::vector<std::int64_t> mine = count_expert_slots(topk_idx, static_cast<int>(E));
  std::vector<std::int64_t> pos(at(E), 0);  // global position of rank's next slot of e: rank-major prefix
  for (std::int64_t e = 0; e < E; ++e) {
    if (mine[at(e)] != plan.counts[at(rank) * at(E) + at(e)])
      invalid("route_through_replicas: rank " + std::to_string(rank) + " routes " + std::to_string(mine[at(e)]) +
              " slots to expert " + std::to_string(e) + ", the plan was made for " +
              std::to_string(plan.counts[at(rank) * at(E) + at(e)]));
    for (int r = 0; r < rank; ++r) pos[at(e)] += plan.counts[at(r) * at(E) + at(e)];
  }
  std::vector<std::int64_t> out(topk_idx.size(), -1);
  for (size_t i = 0; i < topk_idx.size(); ++i) {
    const std::int64_t e = topk_idx[i];
    if (e < 0) continue;
    const std::int64_t first = plan.replica_offsets[at(e)], m = plan.replica_offsets[at(e) + 1] - first;
    out[i] = plan.replica_phys[at(first + replica_of(pos[at(e)]++, plan.expert_slots[at(e)], m))];
  }
  return out;
}

}  // namespace epx
