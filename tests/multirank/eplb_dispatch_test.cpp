// Dispatch through EPLB replicas: a skewed logical routing is mapped to physical replicas,
// dispatched and combined over them bit for bit as docs/spec.md says for the physical experts,
// every received slot still maps back to its logical expert, and the load evens out.
#include <gtest/gtest.h>

#include <algorithm>

#include "epx/eplb.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

constexpr int kRanks = 4, kLogical = 16, kReplicas = 24, kTopk = 4;

ref::Problem skewed_problem() {
  ref::FixtureOptions f;
  f.num_ranks = kRanks;
  f.num_experts = kLogical;
  f.num_topk = kTopk;
  f.hidden = 128;
  f.tokens = 48;
  f.zipf = 1.2;
  f.seed = 91;
  return ref::make_problem(f);
}

// Planner input: how many slots each logical expert gets over all ranks.
EplbPlan plan_for(const ref::Problem& p) {
  std::vector<float> load(kLogical, 0.0f);
  for (const auto& r : p.ranks)
    for (std::int64_t e : r.topk_idx)
      if (e >= 0) load[static_cast<std::size_t>(e)] += 1.0f;
  return rebalance_experts(load, 1, kLogical, kReplicas, 1, 1, kRanks);
}

ref::Problem physical(const ref::Problem& p, const EplbPlan& plan, ReplicaChoice choice) {
  ref::Problem q = p;
  q.num_experts = kReplicas;
  for (int r = 0; r < kRanks; ++r)
    q.ranks[static_cast<std::size_t>(r)].topk_idx =
        map_to_replicas(p.ranks[static_cast<std::size_t>(r)].topk_idx, kTopk, plan, {0, r, kRanks, 2, choice});
  return q;
}

double max_over_avg_rows(const std::vector<ref::DispatchOut>& outs) {
  double mx = 0, sum = 0;
  for (const auto& o : outs) {
    mx = std::max(mx, static_cast<double>(o.rows));
    sum += static_cast<double>(o.rows);
  }
  return mx / (sum / static_cast<double>(outs.size()));
}

TEST(EplbDispatch, ReplicasEvenTheLoadAndKeepTheLogicalSlot) {
  const ref::Problem logical = skewed_problem();
  const EplbPlan plan = plan_for(logical);
  const ref::Problem phys = physical(logical, plan, ReplicaChoice::kSpread);
  ref::DispatchOptions expanded;
  expanded.expanded = true;
  const auto before = ref::dispatch_all(logical, expanded);
  const auto after = ref::dispatch_all(phys, expanded);
  EXPECT_LT(max_over_avg_rows(after), max_over_avg_rows(before));

  for (ref::DispatchOptions o : {ref::DispatchOptions{}, expanded}) {
    const auto want = ref::dispatch_all(phys, o);
    std::vector<std::vector<std::uint16_t>> y(kRanks), combined(kRanks);
    for (int r = 0; r < kRanks; ++r) y[static_cast<std::size_t>(r)] = ref::expert_fn(phys, want[static_cast<std::size_t>(r)], o);
    for (int r = 0; r < kRanks; ++r)
      combined[static_cast<std::size_t>(r)] = ref::combine(phys, o, want, y, nullptr, nullptr, false, r);
    for (TransportKind kind : kTransports) {
      LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(20000)};
      launch(lo, [&](Transport& t) {
        const int r = t.rank();
        const auto ur = static_cast<std::size_t>(r);
        Buffer buffer(t, config_for(phys));
        DispatchResult d = buffer.dispatch(dispatch_args(views_of(phys, r), o));
        expect_dispatch(r, phys, o, want[ur], d);
        // Every received slot serves the logical expert its source token asked for.
        const auto* src = d.recv_src.as<std::int64_t>();
        for (std::int64_t row = 0; row < d.recv_src.shape()[0]; ++row) {
          const int cols = o.expanded ? 3 : 2;
          const std::int64_t s = src[row * cols], tok = src[row * cols + 1];
          for (int k = 0; k < kTopk; ++k) {
            if (o.expanded && k != src[row * cols + 2]) continue;
            const std::int64_t local = o.expanded ? -2 : d.recv_topk_idx.as<std::int64_t>()[row * kTopk + k];
            if (local == -1) continue;
            const auto flat = static_cast<std::size_t>(tok * kTopk + k);
            const std::int64_t phys_e = phys.ranks[static_cast<std::size_t>(s)].topk_idx[flat];
            if (!o.expanded && phys_e != r * (kReplicas / kRanks) + local) fail(r, "recv_topk_idx is not the physical slot");
            if (plan.phy2log[static_cast<std::size_t>(phys_e)] != logical.ranks[static_cast<std::size_t>(s)].topk_idx[flat])
              fail(r, "a received slot does not map back to its logical expert");
          }
        }
        CombineArgs c;
        c.y = TensorView(y[ur].data(), DType::kBF16, {want[ur].rows, phys.hidden});
        c.handle = &d.handle;
        expect_bits(r, "combined_x", buffer.combine(c).combined_x.data(), combined[ur]);
      });
    }
  }
}

TEST(EplbDispatch, PreferRankPicksALocalReplicaWhenThereIsOne) {
  const ref::Problem logical = skewed_problem();
  const EplbPlan plan = plan_for(logical);
  const ref::Problem phys = physical(logical, plan, ReplicaChoice::kPreferRank);
  const int per_rank = kReplicas / kRanks;
  int local_hits = 0;
  for (int r = 0; r < kRanks; ++r) {
    const auto& in = logical.ranks[static_cast<std::size_t>(r)].topk_idx;
    const auto& out = phys.ranks[static_cast<std::size_t>(r)].topk_idx;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (in[i] < 0) {
        EXPECT_EQ(out[i], -1);
        continue;
      }
      EXPECT_EQ(plan.phy2log[static_cast<std::size_t>(out[i])], in[i]);
      bool has_local = false;
      for (int j = 0; j < plan.logcnt[static_cast<std::size_t>(in[i])]; ++j)
        has_local |= plan.log2phy[static_cast<std::size_t>(in[i] * plan.max_replicas + j)] / per_rank == r;
      if (has_local) {
        EXPECT_EQ(out[i] / per_rank, r) << "slot " << i << " of rank " << r << " skipped its local replica";
        ++local_hits;
      }
    }
  }
  EXPECT_GT(local_hits, 0);
}

TEST(EplbDispatch, SpreadUsesEveryReplicaOfAHotExpert) {
  const ref::Problem logical = skewed_problem();
  const EplbPlan plan = plan_for(logical);
  const ref::Problem phys = physical(logical, plan, ReplicaChoice::kSpread);
  std::vector<int> used(kReplicas, 0);
  for (const auto& r : phys.ranks)
    for (std::int64_t e : r.topk_idx)
      if (e >= 0) used[static_cast<std::size_t>(e)] = 1;
  // Expert 0 is the hottest (zipf): all its replicas must see traffic.
  for (int j = 0; j < plan.logcnt[0]; ++j) EXPECT_TRUE(used[static_cast<std::size_t>(plan.log2phy[static_cast<std::size_t>(j)])]);
  EXPECT_GT(plan.logcnt[0], 1);
  EXPECT_THROW(map_to_replicas({16}, 1, plan, {0, 0, kRanks, 1, ReplicaChoice::kSpread}), Error);
}

}  // namespace
}  // namespace epx::testing
