// planner.cpp — redundant experts chosen from this batch's routing (plan_dynamic_replicas)
// and the routing through them (route_through_replicas). See epx/lb.hpp.
#include <algorithm>
#include <limits>
#include <string>

#include "epx/error.hpp"
#include "epx/lb.hpp"

namespace epx {

namespace {

using std::size_t;
size_t at(std::int64_t i) { return static_cast<size_t>(i); }

[[noreturn]] void invalid(const std::string& m) { throw Error(ErrorCode::kInvalidArgument, m); }

double max_over_mean(const std::vector<std::int64_t>& v) {
  std::int64_t mx = 0, sum = 0;
  for (std::int64_t x : v) {
    mx = std::max(mx, x);
    sum += x;
  }
  return sum > 0 ? static_cast<double>(mx) * static_cast<double>(v.size()) / static_cast<double>(sum) : 1.0;
}

// Max flow (Dinic) on the small graph source -> expert e (n_e) -> the ranks holding e -> sink (T).
class Flow {
 public:
  explicit Flow(int nodes) : adj_(at(nodes)), level_(at(nodes)), next_(at(nodes)) {}
  int add(int a, int b, std::int64_t cap) {
    edges_.push_back({b, cap});
    adj_[at(a)].push_back(static_cast<int>(edges_.size() - 1));
    edges_.push_back({a, 0});
    adj_[at(b)].push_back(static_cast<int>(edges_.size() - 1));
    return static_cast<int>(edges_.size() - 2);
  }
  std::int64_t flow_on(int edge) const { return edges_[at(edge + 1)].cap; }
  std::int64_t run(int s, int t) {
    std::int64_t total = 0;
    while (levels(s, t)) {
      std::fill(next_.begin(), next_.end(), 0);
      while (const std::int64_t f = push(s, t, std::numeric_limits<std::int64_t>::max())) total += f;
    }
    return total;
  }

 private:
  struct Edge {
    int to;
    std::int64_t cap;
  };
  bool levels(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<int> queue{s};
    level_[at(s)] = 0;
    for (size_t i = 0; i < queue.size(); ++i)
      for (int id : adj_[at(queue[i])])
        if (edges_[at(id)].cap > 0 && level_[at(edges_[at(id)].to)] < 0) {
          level_[at(edges_[at(id)].to)] = level_[at(queue[i])] + 1;
          queue.push_back(edges_[at(id)].to);
        }
    return level_[at(t)] >= 0;
  }
  std::int64_t push(int v, int t, std::int64_t f) {
    if (v == t) return f;
    for (int& i = next_[at(v)]; i < static_cast<int>(adj_[at(v)].size()); ++i) {
      const int id = adj_[at(v)][at(i)];
      Edge& e = edges_[at(id)];
      if (e.cap <= 0 || level_[at(e.to)] != level_[at(v)] + 1) continue;
      if (const std::int64_t got = push(e.to, t, std::min(f, e.cap))) {
        e.cap -= got;
        edges_[at(id ^ 1)].cap += got;
        return got;
      }
    }
    return 0;
  }
  std::vector<Edge> edges_;
  std::vector<std::vector<int>> adj_;
  std::vector<int> level_, next_;
};

// The state of the greedy: which ranks hold each expert.
struct Placement {
  int P, L, B;
  std::vector<std::vector<std::int64_t>> slots;  // [E] global slots holding e, ascending
  std::vector<int> used;                         // [P] slots taken on each rank
  // Replica j of e: j = 0 the home expert, then its slots in ascending global slot.
  int rank_of(std::int64_t e, size_t j) const {
    return j == 0 ? static_cast<int>(e / L) : static_cast<int>(slots[at(e)][j - 1] / B);
  }
  bool holds(int rank, std::int64_t e) const {
    for (size_t j = 0; j <= slots[at(e)].size(); ++j)
      if (rank_of(e, j) == rank) return true;
    return false;
  }
  // The most rows that fit with every rank at <= cap; `rows` ([E] lists, replica order) gets
  // how many rows each replica takes.
  std::int64_t fit(const std::vector<std::int64_t>& n, std::int64_t cap, std::vector<std::vector<std::int64_t>>* rows) const {
    const int E = static_cast<int>(n.size()), sink = E + P + 1;
    Flow g(E + P + 2);
    std::vector<std::vector<int>> edge(at(E));
    for (int e = 0; e < E; ++e) {
      if (n[at(e)] == 0) continue;
      g.add(0, 1 + e, n[at(e)]);
      for (size_t j = 0; j <= slots[at(e)].size(); ++j) edge[at(e)].push_back(g.add(1 + e, 1 + E + rank_of(e, j), n[at(e)]));
    }
    for (int d = 0; d < P; ++d) g.add(1 + E + d, sink, cap);
    const std::int64_t f = g.run(0, sink);
    if (rows != nullptr) {
      rows->assign(at(E), {});
      for (int e = 0; e < E; ++e) {
        (*rows)[at(e)].assign(slots[at(e)].size() + 1, 0);
        for (size_t j = 0; j < edge[at(e)].size(); ++j) (*rows)[at(e)][j] = g.flow_on(edge[at(e)][j]);
      }
    }
    return f;
  }
};

// The best balance of a placement: the least max rank load T that fits every row, the rows
// that do not fit under T - 1 (how far from the next step), and the rows of each replica at T.
struct Balance {
  std::int64_t peak = 0, excess = 0;
  std::vector<std::vector<std::int64_t>> rows;
};
Balance balance(const Placement& st, const std::vector<std::int64_t>& n, std::int64_t total, std::int64_t hi) {
  Balance b;
  std::int64_t lo = (total + st.P - 1) / st.P - 1;  // lo never fits (unless total == 0), hi does
  if (total == 0) lo = -1, hi = 0;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (st.fit(n, mid, nullptr) == total ? hi : lo) = mid;
  }
  b.peak = hi;
  b.excess = hi > 0 ? total - st.fit(n, hi - 1, nullptr) : 0;
  st.fit(n, hi, &b.rows);
  return b;
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

namespace {

// Each logical expert's slots over all ranks (counts: [P][E]), validating each count.
std::vector<std::int64_t> sum_counts(const std::vector<std::int64_t>& counts, int P, std::int64_t E) {
  std::vector<std::int64_t> n(at(E), 0);
  for (int r = 0; r < P; ++r)
    for (std::int64_t e = 0; e < E; ++e) {
      const std::int64_t c = counts[at(r) * at(E) + at(e)];
      if (c < 0)
        invalid("plan_dynamic_replicas: counts[" + std::to_string(r) + "][" + std::to_string(e) + "] = " + std::to_string(c) +
                " is negative");
      n[at(e)] += c;
    }
  return n;
}

// The replicas on the ranks at the peak (a max flow puts some there that could move, so every
// such rank is tried, lowest index first), by the rows they take there (most first, lowest
// expert on ties): (rows, e).
std::vector<std::pair<std::int64_t, std::int64_t>> peak_candidates(const Placement& st, const Balance& cur,
                                                                   const std::vector<std::int64_t>& load) {
  const auto E = static_cast<std::int64_t>(cur.rows.size());
  const std::int64_t peak = *std::max_element(load.begin(), load.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> cand;
  for (int heavy = 0; heavy < st.P; ++heavy) {
    if (load[at(heavy)] != peak) continue;
    const size_t first = cand.size();
    for (std::int64_t e = 0; e < E; ++e)
      for (size_t j = 0; j < cur.rows[at(e)].size(); ++j)
        if (st.rank_of(e, j) == heavy && cur.rows[at(e)][j] > 0) cand.emplace_back(cur.rows[at(e)][j], e);
    std::stable_sort(cand.begin() + static_cast<std::ptrdiff_t>(first), cand.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
  }
  return cand;
}

// One greedy step: a replica of the first candidate that lowers the balance, on the least
// loaded rank with a free slot that lacks that expert. False when none helps.
bool place_one_replica(Placement& st, Balance& cur, const std::vector<std::int64_t>& n, std::int64_t total) {
  const int P = st.P, B = st.B;
  const auto E = static_cast<std::int64_t>(n.size());
  std::vector<std::int64_t> load(at(P), 0);
  for (std::int64_t e = 0; e < E; ++e)
    for (size_t j = 0; j < cur.rows[at(e)].size(); ++j) load[at(st.rank_of(e, j))] += cur.rows[at(e)][j];
  for (const auto& [rows, e] : peak_candidates(st, cur, load)) {
    int target = -1;
    for (int d = 0; d < P; ++d)
      if (st.used[at(d)] < B && !st.holds(d, e) && (target < 0 || load[at(d)] < load[at(target)])) target = d;
    if (target < 0) continue;
    const std::int64_t g = std::int64_t{target} * B + st.used[at(target)];
    auto& s = st.slots[at(e)];
    s.insert(std::upper_bound(s.begin(), s.end(), g), g);
    ++st.used[at(target)];
    // A replica only adds freedom: accept it if the peak falls, or the rows above peak - 1 do.
    const std::int64_t excess = total - st.fit(n, cur.peak - 1, nullptr);
    if (excess < cur.excess) {
      cur = balance(st, n, total, cur.peak);
      return true;
    }
    s.erase(std::find(s.begin(), s.end(), g));
    --st.used[at(target)];
  }
  return false;
}

// The plan's placement, replica tables and per-rank rows from the final placement.
void write_placement(DynamicReplicaPlan& plan, const Placement& st, const Balance& cur) {
  const int P = st.P, L = st.L, B = st.B;
  const std::int64_t E = std::int64_t{P} * L;
  plan.placement.home_experts = L;
  plan.placement.slots = B;
  plan.placement.mapping.assign(at(P) * at(B), -1);
  plan.replica_offsets.assign(at(E) + 1, 0);
  plan.rows_with.assign(at(P), 0);
  for (std::int64_t e = 0; e < E; ++e) {
    plan.replica_phys.push_back((e / L) * (L + B) + e % L);
    for (std::int64_t g : st.slots[at(e)]) {
      plan.placement.mapping[at(g)] = e;
      plan.replica_phys.push_back((g / B) * (L + B) + L + g % B);
      ++plan.replicas_used;
    }
    for (size_t j = 0; j < cur.rows[at(e)].size(); ++j) {
      plan.replica_rows.push_back(cur.rows[at(e)][j]);
      plan.rows_with[at(st.rank_of(e, j))] += cur.rows[at(e)][j];
    }
    plan.replica_offsets[at(e) + 1] = static_cast<std::int64_t>(plan.replica_phys.size());
  }
}

}  // namespace

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
  plan.expert_slots = sum_counts(counts, P, E);
  const std::vector<std::int64_t>& n = plan.expert_slots;

  Placement st{P, L, B, std::vector<std::vector<std::int64_t>>(at(E)), std::vector<int>(at(P), 0)};
  std::int64_t total = 0;
  plan.rows_without.assign(at(P), 0);
  for (std::int64_t e = 0; e < E; ++e) {
    total += n[at(e)];
    plan.rows_without[at(e / L)] += n[at(e)];
  }
  Balance cur = balance(st, n, total, total);
  for (int step = 0; step < P * B; ++step)
    if (!place_one_replica(st, cur, n, total)) break;
  write_placement(plan, st, cur);
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
    // Replica j takes e's global positions [sum of rows of replicas < j, + its rows).
    const std::int64_t q = pos[at(e)]++;
    std::int64_t j = plan.replica_offsets[at(e)], begin = 0;
    while (q >= begin + plan.replica_rows[at(j)]) begin += plan.replica_rows[at(j++)];
    out[i] = plan.replica_phys[at(j)];
  }
  return out;
}

}  // namespace epx
