// Issue #17 class 6, elastic: 8 shm ranks dispatch and combine through EPLB replicas; one
// rank is SIGKILLed inside a call; the 7 survivors get the collective error naming it, agree
// on who is left (epx::agree_survivors), rebuild the group without it (epx::rebuild_group),
// mask the routing (epx::map_to_live_replicas) and go on, bit for bit against the reference
// dispatch / combine of the masked routing over 7 ranks. The masking is checked against an
// independent plain implementation here (mask_by_hand), its dropped counts too, per rank
// and summed over the group (epx::sum_over_group). Two victims: one that holds the only
// replica of an expert (tokens are dropped and counted), one whose experts all have a
// replica elsewhere (nothing is dropped). Nothing is left behind: every rank is reaped by
// launch(), no /dev/shm segment remains.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <set>

#include "epx/elastic.hpp"
#include "epx/eplb.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

constexpr int kP = 8, kLogical = 8, kReplicas = 24, kTopk = 3, kPerRank = kReplicas / kP;
constexpr int kKillPair = 2;             // the victim dies inside this pair
constexpr int kPairsBefore = kKillPair + 2;  // a survivor may finish the kill pair, never the next one
constexpr int kPairsAfter = 4;

ref::Problem logical_problem(std::uint64_t seed) {
  ref::FixtureOptions f;
  f.num_ranks = kP;
  f.num_experts = kLogical;
  f.num_topk = kTopk;
  f.hidden = 128;
  f.tokens = 24;
  f.zipf = 1.0;
  f.seed = seed;
  return ref::make_problem(f);
}

EplbPlan the_plan() {
  const ref::Problem p = logical_problem(5);
  std::vector<float> load(kLogical, 0.0f);
  for (const auto& r : p.ranks)
    for (std::int64_t e : r.topk_idx)
      if (e >= 0) load[static_cast<std::size_t>(e)] += 1.0f;
  return rebalance_experts(load, 1, kLogical, kReplicas, 1, 1, kP);
}

/// The replicas of logical expert e (physical slots of the 8-rank group), straight from the plan.
std::vector<std::int64_t> replicas_of(const EplbPlan& plan, std::int64_t e) {
  std::vector<std::int64_t> out;
  for (int j = 0; j < plan.logcnt[static_cast<std::size_t>(e)]; ++j)
    out.push_back(plan.log2phy[static_cast<std::size_t>(e * plan.max_replicas + j)]);
  return out;
}

struct HandMasked {
  std::vector<std::int64_t> topk_idx;
  std::int64_t pairs = 0, tokens = 0;
};

/// The masked routing written apart from the library: the live replicas of each pair's
/// expert in plan order, the t-th of them (kSpread), renumbered as the survivors' group
/// numbers its slots (new rank * slots per rank + local slot).
HandMasked mask_by_hand(const std::vector<std::int64_t>& topk_idx, const EplbPlan& plan, int victim) {
  HandMasked m;
  m.topk_idx.assign(topk_idx.size(), -1);
  for (std::size_t t = 0; t < topk_idx.size() / kTopk; ++t) {
    bool token_dropped = false;
    for (int k = 0; k < kTopk; ++k) {
      const std::size_t i = t * kTopk + static_cast<std::size_t>(k);
      if (topk_idx[i] < 0) continue;
      std::vector<std::int64_t> live;
      for (std::int64_t p : replicas_of(plan, topk_idx[i]))
        if (p / kPerRank != victim) live.push_back(p);
      if (live.empty()) {
        ++m.pairs;
        token_dropped = true;
        continue;
      }
      const std::int64_t p = live[t % live.size()];
      const std::int64_t old_rank = p / kPerRank, new_rank = old_rank < victim ? old_rank : old_rank - 1;
      m.topk_idx[i] = new_rank * kPerRank + p % kPerRank;
    }
    m.tokens += token_dropped;
  }
  return m;
}

/// One pair's problem and reference results (dispatch of every rank, combine of every rank).
struct Pair {
  ref::Problem problem;
  ref::DispatchOptions options;
  std::vector<ref::DispatchOut> dispatch;
  std::vector<std::vector<std::uint16_t>> y, combined;
};

Pair reference_pair(ref::Problem p, ref::DispatchOptions o) {
  Pair pair{std::move(p), o, {}, {}, {}};
  pair.dispatch = ref::dispatch_all(pair.problem, o);
  const auto P = pair.problem.ranks.size();
  pair.y.resize(P);
  pair.combined.resize(P);
  for (std::size_t r = 0; r < P; ++r) pair.y[r] = ref::expert_fn(pair.problem, pair.dispatch[r], o);
  for (std::size_t r = 0; r < P; ++r)
    pair.combined[r] = ref::combine(pair.problem, o, pair.dispatch, pair.y, nullptr, nullptr, false, static_cast<int>(r));
  return pair;
}

ref::DispatchOptions options_for(int i) {
  ref::DispatchOptions o;
  o.expanded = i % 2 == 1;
  return o;
}

/// Dispatches `x` of rank r's inputs with `topk_idx` and combines, against `pair` (as rank `pr`).
void run_pair(Buffer& buffer, const Pair& pair, int pr, const RankViews& v, int r) {
  const auto u = static_cast<std::size_t>(pr);
  DispatchResult d = buffer.dispatch(dispatch_args(v, pair.options));
  expect_dispatch(r, pair.problem, pair.options, pair.dispatch[u], d);
  CombineArgs c;
  c.y = TensorView(pair.y[u].data(), DType::kBF16, {pair.dispatch[u].rows, pair.problem.hidden});
  c.handle = &d.handle;
  expect_bits(r, "combined_x", buffer.combine(c).combined_x.data(), pair.combined[u]);
}

/// The victim SIGKILLs itself in its first wait of `phase` once armed: inside a call.
class KillingTransport final : public ForwardingTransport {
 public:
  KillingTransport(Transport& t, const char* phase) : ForwardingTransport(t), t_(t), phase_(phase) {}
  void arm() { armed_.store(true); }
  void wait_signal(std::size_t slot, std::uint64_t v, const WaitPoint& w) override {
    maybe_die(w.phase);
    ForwardingTransport::wait_signal(slot, v, w);
  }
  void wait_flag(std::size_t off, std::uint64_t v, const WaitPoint& w) override {
    maybe_die(w.phase);
    ForwardingTransport::wait_flag(off, v, w);
  }

 private:
  void maybe_die(const char* phase) {
    if (!armed_.load() || std::strcmp(phase, phase_) != 0) return;
    t_.enter_phase(phase);  // the launcher's report names it
    raise(SIGKILL);
  }
  Transport& t_;
  const char* phase_;
  std::atomic<bool> armed_{false};
};

std::set<std::string> segments() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("epx-", 0) == 0) names.emplace(e->d_name);
    closedir(d);
  }
  return names;
}

/// Victims for the two cases: a rank holding the only replica of an expert the routing
/// uses, and a rank all of whose experts have a replica on another rank.
int victim_with_only_copy(const EplbPlan& plan) {
  for (int r = 0; r < kP; ++r)
    for (int s = 0; s < kPerRank; ++s)
      if (plan.logcnt[static_cast<std::size_t>(plan.phy2log[static_cast<std::size_t>(r * kPerRank + s)])] == 1) return r;
  return -1;
}
int victim_covered_by_replicas(const EplbPlan& plan) {
  for (int r = 0; r < kP; ++r) {
    bool covered = true;
    for (int s = 0; s < kPerRank; ++s) {
      bool elsewhere = false;
      for (std::int64_t p : replicas_of(plan, plan.phy2log[static_cast<std::size_t>(r * kPerRank + s)]))
        elsewhere |= p / kPerRank != r;
      covered &= elsewhere;
    }
    if (covered) return r;
  }
  return -1;
}

void kill_and_continue(const EplbPlan& plan, int victim, const char* phase, bool expect_drops) {
  SCOPED_TRACE("victim rank " + std::to_string(victim) + " killed in '" + phase + "'");
  // Before: the 8-rank physical routing. After: the survivors' inputs, masked by hand.
  std::vector<Pair> before, after;
  for (int i = 0; i < kPairsBefore; ++i) {
    ref::Problem q = logical_problem(100 + static_cast<std::uint64_t>(i));
    q.num_experts = kReplicas;
    for (int r = 0; r < kP; ++r) {
      auto& idx = q.ranks[static_cast<std::size_t>(r)].topk_idx;
      idx = map_to_replicas(idx, kTopk, plan, {0, r, kP, 1, ReplicaChoice::kSpread});
    }
    before.push_back(reference_pair(std::move(q), options_for(i)));
  }
  std::vector<std::vector<HandMasked>> hand(kPairsAfter);  // [pair][old rank]
  std::vector<ref::Problem> logical_after;
  std::int64_t total_pairs = 0, total_tokens = 0;
  for (int j = 0; j < kPairsAfter; ++j) {
    const ref::Problem p = logical_problem(200 + static_cast<std::uint64_t>(j));
    ref::Problem q = p;
    q.num_ranks = kP - 1;
    q.num_experts = kPerRank * (kP - 1);
    q.ranks.clear();
    for (int r = 0; r < kP; ++r) {
      hand[static_cast<std::size_t>(j)].push_back(r == victim ? HandMasked{} : mask_by_hand(p.ranks[static_cast<std::size_t>(r)].topk_idx, plan, victim));
      if (r == victim) continue;
      q.ranks.push_back(p.ranks[static_cast<std::size_t>(r)]);
      q.ranks.back().topk_idx = hand[static_cast<std::size_t>(j)][static_cast<std::size_t>(r)].topk_idx;
      total_pairs += hand[static_cast<std::size_t>(j)][static_cast<std::size_t>(r)].pairs;
      total_tokens += hand[static_cast<std::size_t>(j)][static_cast<std::size_t>(r)].tokens;
    }
    logical_after.push_back(p);
    after.push_back(reference_pair(std::move(q), options_for(j)));
  }
  if (expect_drops)
    ASSERT_GT(total_pairs, 0) << "the victim's only-copy experts are never routed to: the case tests nothing";
  else
    ASSERT_EQ(total_pairs, 0) << "the replicas do not cover the victim's experts";

  const auto segments_before = segments();
  std::vector<int> lost;
  LaunchOptions lo{kP, TransportKind::kShm, std::chrono::milliseconds(10000)};
  lo.elastic = true;
  lo.lost = &lost;
  launch(lo, [&](Transport& t) {
    const int r = t.rank();
    int completed = 0;
    try {
      KillingTransport killing(t, phase);
      BufferConfig cfg = config_for(before[0].problem);
      Buffer buffer(killing, cfg);
      for (int i = 0; i < kPairsBefore; ++i, ++completed) {
        if (r == victim && i == kKillPair) killing.arm();
        run_pair(buffer, before[static_cast<std::size_t>(i)], r, views_of(before[static_cast<std::size_t>(i)].problem, r), r);
      }
      fail(r, "every pair completed: the victim's death went unnoticed");
    } catch (const Error& e) {
      const std::string what = e.what();
      if (!is_peer_loss(e) || e.origin_rank() != victim || what.find("peer rank " + std::to_string(victim)) == std::string::npos ||
          what.find("SIGKILL) in phase '" + std::string(phase) + "'") == std::string::npos)
        fail(r, "the error does not name the victim and its phase: " + what);
    }
    if (completed < kKillPair || completed > kKillPair + 1)
      fail(r, "failed after " + std::to_string(completed) + " pairs, not in the victim's pair or the next");

    const Membership m = agree_survivors(t);
    if (m.lost != std::vector<int>{victim} || m.survivors.size() != kP - 1 || m.new_rank != (r < victim ? r : r - 1))
      fail(r, "agree_survivors: lost " + std::to_string(m.lost.size()) + " ranks, new rank " + std::to_string(m.new_rank));
    std::unique_ptr<Transport> group = rebuild_group(t, m);
    if (group->rank() != m.new_rank || group->num_ranks() != kP - 1) fail(r, "the rebuilt group has the wrong rank or size");

    Buffer buffer(*group, config_for(after[0].problem));
    for (int j = 0; j < kPairsAfter; ++j) {
      const ref::Problem& p = logical_after[static_cast<std::size_t>(j)];
      const HandMasked& want = hand[static_cast<std::size_t>(j)][static_cast<std::size_t>(r)];
      const MaskedRouting got = map_to_live_replicas(p.ranks[static_cast<std::size_t>(r)].topk_idx, kTopk, plan,
                                                     {0, r, kP, 1, ReplicaChoice::kSpread}, m.lost);
      expect_bits(r, "masked topk_idx", got.topk_idx.data(), want.topk_idx);
      if (got.num_experts != kPerRank * (kP - 1) || got.dropped_pairs != want.pairs || got.dropped_tokens != want.tokens)
        fail(r, "dropped " + std::to_string(got.dropped_pairs) + " pairs / " + std::to_string(got.dropped_tokens) +
                    " tokens, want " + std::to_string(want.pairs) + " / " + std::to_string(want.tokens));
      const std::vector<std::int64_t> total = sum_over_group(*group, {got.dropped_pairs, got.dropped_tokens});
      std::int64_t want_pairs = 0, want_tokens = 0;
      for (const HandMasked& h : hand[static_cast<std::size_t>(j)]) want_pairs += h.pairs, want_tokens += h.tokens;
      if (total != std::vector<std::int64_t>{want_pairs, want_tokens}) fail(r, "sum_over_group of the dropped counts is wrong");
      RankViews v = views_of(after[static_cast<std::size_t>(j)].problem, m.new_rank);
      v.topk_idx = TensorView(got.topk_idx.data(), DType::kI64, {p.ranks[static_cast<std::size_t>(r)].num_tokens, kTopk});
      run_pair(buffer, after[static_cast<std::size_t>(j)], m.new_rank, v, r);
    }
  });
  EXPECT_EQ(lost, std::vector<int>{victim});
  std::set<std::string> left;
  for (const std::string& n : segments())
    if (segments_before.count(n) == 0) left.insert(n);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left (" << *left.begin()
                            << "; or another job's appeared meanwhile: re-run)";
}

TEST(ElasticTest, SurvivorsRebuildAndContinueWhenTheOnlyCopyOfAnExpertDies) {
  const EplbPlan plan = the_plan();
  const int victim = victim_with_only_copy(plan);
  ASSERT_GE(victim, 0);
  kill_and_continue(plan, victim, "dispatch data", true);
}

TEST(ElasticTest, SurvivorsRebuildAndContinueWhenReplicasCoverTheLostRank) {
  const EplbPlan plan = the_plan();
  const int victim = victim_covered_by_replicas(plan);
  ASSERT_GE(victim, 0) << "the plan has no rank whose experts all have a replica elsewhere";
  kill_and_continue(plan, victim, "combine data", false);
}

TEST(ElasticTest, OnlyLaunchedShmGroups) {
  EXPECT_THROW(launch({2, TransportKind::kThreads, std::chrono::milliseconds(1000), {}, true}, [](Transport&) {}), Error);
  launch({2, TransportKind::kThreads, std::chrono::milliseconds(1000)}, [](Transport& t) {
    try {
      agree_survivors(t);
      fail(t.rank(), "agree_survivors accepted the threads transport");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnsupported) throw;
    }
  });
}

}  // namespace
}  // namespace epx::testing
