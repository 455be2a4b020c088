// Elastic recovery (docs/reliability.md): 8 shm ranks (launched, or connect()-ed by a fork
// here) dispatch and combine through EPLB replicas; one
// rank is SIGKILLed inside a call; the 7 survivors get the collective error naming it, agree
// on who is left (epx::agree_survivors), rebuild the group without it (epx::rebuild_group),
// mask the routing (epx::map_to_live_replicas) and go on, bit for bit against the reference
// dispatch / combine of the masked routing over 7 ranks. The masking is checked against an
// independent plain implementation here (mask_by_hand), its dropped counts too, per rank
// and summed over the group (epx::sum_over_group). Two victims: one that holds the only
// replica of an expert (tokens are dropped and counted), one whose experts all have a
// replica elsewhere (nothing is dropped). Nothing is left behind: every rank is reaped (by
// launch(), or by the test's own fork harness), no /dev/shm segment remains.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <string>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/elastic.hpp"
#include "epx/eplb.hpp"
#include "fork_harness.hpp"
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
/// numbers its slots (new rank * slots per rank + local slot). `lost`: launched-group ranks.
HandMasked mask_by_hand(const std::vector<std::int64_t>& topk_idx, const EplbPlan& plan, const std::vector<int>& lost) {
  auto is_lost = [&](std::int64_t r) { return std::find(lost.begin(), lost.end(), r) != lost.end(); };
  HandMasked m;
  m.topk_idx.assign(topk_idx.size(), -1);
  for (std::size_t t = 0; t < topk_idx.size() / kTopk; ++t) {
    bool token_dropped = false;
    for (int k = 0; k < kTopk; ++k) {
      const std::size_t i = t * kTopk + static_cast<std::size_t>(k);
      if (topk_idx[i] < 0) continue;
      std::vector<std::int64_t> live;
      for (std::int64_t p : replicas_of(plan, topk_idx[i]))
        if (!is_lost(p / kPerRank)) live.push_back(p);
      if (live.empty()) {
        ++m.pairs;
        token_dropped = true;
        continue;
      }
      const std::int64_t p = live[t % live.size()];
      std::int64_t new_rank = p / kPerRank;
      for (int l : lost) new_rank -= l < p / kPerRank;
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

/// The victim SIGKILLs (or SIGSTOPs) itself in its first wait of `phase` once armed: inside a call.
class KillingTransport final : public ForwardingTransport {
 public:
  KillingTransport(Transport& t, const char* phase, bool stop) : ForwardingTransport(t), t_(t), phase_(phase), stop_(stop) {}
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
    if (stop_ && !armed_.exchange(false)) return;  // one worker stops the rank
    raise(stop_ ? SIGSTOP : SIGKILL);
  }
  Transport& t_;
  const char* phase_;
  bool stop_;
  std::atomic<bool> armed_{false};
};

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

/// A rank lost inside pair kKillPair of a stage: `victim` is its rank in the launched group.
struct Fault {
  int victim;
  const char* phase;
  bool stop = false;  ///< SIGSTOP instead of SIGKILL: the survivors time out and leave it out
};

/// What one stage (one group) runs: the survivors' inputs masked by hand and the reference
/// results over them.
struct Stage {
  std::vector<int> survivors;  // launched-group ranks, ascending
  std::vector<int> lost;       // launched-group ranks, ascending
  std::vector<ref::Problem> logical;
  std::vector<std::vector<HandMasked>> hand;  // [pair][new rank]
  std::vector<Pair> pairs;
  std::int64_t dropped_pairs = 0;
};

Stage make_stage(const EplbPlan& plan, std::vector<int> lost, std::uint64_t seed, int num_pairs) {
  Stage st;
  std::sort(lost.begin(), lost.end());
  st.lost = lost;
  for (int r = 0; r < kP; ++r)
    if (!std::binary_search(lost.begin(), lost.end(), r)) st.survivors.push_back(r);
  for (int j = 0; j < num_pairs; ++j) {
    const ref::Problem p = logical_problem(seed + static_cast<std::uint64_t>(j));
    ref::Problem q = p;
    q.num_ranks = static_cast<int>(st.survivors.size());
    q.num_experts = kPerRank * q.num_ranks;
    q.ranks.clear();
    st.hand.emplace_back();
    for (int r : st.survivors) {
      st.hand.back().push_back(mask_by_hand(p.ranks[static_cast<std::size_t>(r)].topk_idx, plan, lost));
      q.ranks.push_back(p.ranks[static_cast<std::size_t>(r)]);
      q.ranks.back().topk_idx = st.hand.back().back().topk_idx;
      st.dropped_pairs += st.hand.back().back().pairs;
    }
    st.logical.push_back(p);
    st.pairs.push_back(reference_pair(std::move(q), options_for(j)));
  }
  return st;
}

/// Every rank checks the library's masking against the hand-made one (topk_idx, dropped
/// counts, their sum over the group), then dispatches and combines bit for bit.
void check_pair(Buffer& buffer, Transport& group, const EplbPlan& plan, const Stage& st, int j, int orig) {
  const int me = group.rank();
  const ref::Problem& p = st.logical[static_cast<std::size_t>(j)];
  const HandMasked& want = st.hand[static_cast<std::size_t>(j)][static_cast<std::size_t>(me)];
  const MaskedRouting got = map_to_live_replicas(p.ranks[static_cast<std::size_t>(orig)].topk_idx, kTopk, plan,
                                                 {0, orig, kP, 1, ReplicaChoice::kSpread}, st.lost);
  expect_bits(orig, "masked topk_idx", got.topk_idx.data(), want.topk_idx);
  if (got.num_experts != kPerRank * group.num_ranks() || got.dropped_pairs != want.pairs || got.dropped_tokens != want.tokens)
    fail(orig, "dropped " + std::to_string(got.dropped_pairs) + " pairs / " + std::to_string(got.dropped_tokens) +
                   " tokens, want " + std::to_string(want.pairs) + " / " + std::to_string(want.tokens));
  const std::vector<std::int64_t> total = sum_over_group(group, {got.dropped_pairs, got.dropped_tokens});
  std::int64_t want_pairs = 0, want_tokens = 0;
  for (const HandMasked& h : st.hand[static_cast<std::size_t>(j)]) want_pairs += h.pairs, want_tokens += h.tokens;
  if (total != std::vector<std::int64_t>{want_pairs, want_tokens}) fail(orig, "sum_over_group of the dropped counts is wrong");
  RankViews v = views_of(st.pairs[static_cast<std::size_t>(j)].problem, me);
  v.topk_idx = TensorView(got.topk_idx.data(), DType::kI64, {p.ranks[static_cast<std::size_t>(orig)].num_tokens, kTopk});
  run_pair(buffer, st.pairs[static_cast<std::size_t>(j)], me, v, orig);
}

/// One rank's run over the stages: before each fault, pairs until the victim is lost inside
/// pair kKillPair; then the survivors agree, rebuild and go on; after the last fault
/// kPairsAfter pairs. `connected`: a connect()-ed group, whose survivors see the death
/// themselves (no launcher's "killed by signal" words in the message).
void run_stages(Transport& t, const EplbPlan& plan, const std::vector<Stage>& stages, const std::vector<Fault>& faults,
                bool connected) {
  const int orig = t.rank();
  std::vector<std::unique_ptr<Transport>> groups;  // each rebuilt from the one before: kept alive
  Transport* now = &t;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const Stage& st = stages[s];
    const bool last = s + 1 == stages.size();
    const auto pos = std::find(st.survivors.begin(), st.survivors.end(), orig) - st.survivors.begin();
    if (now->rank() != pos || now->num_ranks() != static_cast<int>(st.survivors.size()))
      fail(orig, "stage " + std::to_string(s) + ": rank " + std::to_string(now->rank()) + " of " +
                     std::to_string(now->num_ranks()) + ", want " + std::to_string(pos) + " of " +
                     std::to_string(st.survivors.size()));
    const Fault* f = last ? nullptr : &faults[s];
    // The victim's rank in this group.
    const int victim = f ? static_cast<int>(std::find(st.survivors.begin(), st.survivors.end(), f->victim) - st.survivors.begin()) : -1;
    int completed = 0;
    try {
      KillingTransport killing(*now, f ? f->phase : "", f && f->stop);
      Buffer buffer(killing, config_for(st.pairs[0].problem));
      for (int j = 0; j < static_cast<int>(st.pairs.size()); ++j, ++completed) {
        if (f && orig == f->victim && j == kKillPair) killing.arm();
        check_pair(buffer, *now, plan, st, j, orig);
      }
      if (last) break;
      fail(orig, "every pair completed: the victim's death went unnoticed");
    } catch (const Error& e) {
      if (last) throw;
      const std::string what = e.what(), peer = "rank " + std::to_string(victim);
      // A kill is named (the rank and, by the launcher, the phase it died in) by every
      // survivor; a stop makes some rank time out waiting for it and the others, maybe, for
      // that rank.
      if (!is_peer_loss(e) ||
          (!f->stop && (e.origin_rank() != victim || what.find("peer " + peer) == std::string::npos ||
                        (!connected && what.find("SIGKILL) in phase '" + std::string(f->phase) + "'") == std::string::npos))))
        fail(orig, "the error does not name the victim and its phase: " + what);
    }
    if (completed < kKillPair || completed > kKillPair + 1)
      fail(orig, "failed after " + std::to_string(completed) + " pairs, not in the victim's pair or the next");

    const Membership m = agree_survivors(*now);
    if (m.lost != std::vector<int>{victim} || m.new_rank != m.new_rank_of(now->rank()) ||
        m.new_rank != (now->rank() < victim ? now->rank() : now->rank() - 1))
      fail(orig, "agree_survivors: lost " + std::to_string(m.lost.size()) + " ranks, new rank " + std::to_string(m.new_rank));
    groups.push_back(rebuild_group(*now, m));
    // The old group is retired: a call on it fails at once naming the rebuild, never waits.
    try {
      now->barrier("old group");
      fail(orig, "a barrier on the retired group returned");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kBadHandle || std::string(e.what()).find("rebuilt") == std::string::npos) throw;
    }
    now = groups.back().get();
  }
}

std::vector<Stage> stages_for(const EplbPlan& plan, const std::vector<Fault>& faults, std::vector<int>& lost) {
  std::vector<Stage> stages;
  for (std::size_t s = 0; s <= faults.size(); ++s) {
    const bool last = s == faults.size();
    stages.push_back(make_stage(plan, lost, 100 * (s + 1), last ? kPairsAfter : kPairsBefore));
    if (!last) lost.push_back(faults[s].victim);
  }
  std::sort(lost.begin(), lost.end());
  return stages;
}

/// 8 ranks of an elastic launch lose the faults' victims and go on. Returns the last stage
/// (its dropped count is the caller's to check).
Stage lose_ranks_and_continue(const EplbPlan& plan, const std::vector<Fault>& faults, std::chrono::milliseconds timeout) {
  std::vector<int> lost;
  const std::vector<Stage> stages = stages_for(plan, faults, lost);
  const auto segments_before = epx_segments();
  std::vector<int> lost_reported;
  LaunchOptions lo{kP, TransportKind::kShm, timeout};
  lo.elastic = true;
  lo.lost = &lost_reported;
  launch(lo, [&](Transport& t) { run_stages(t, plan, stages, faults, false); });
  EXPECT_EQ(lost_reported, lost);
  const std::set<std::string> left = segments_left(segments_before);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left: " << *left.begin();
  return stages.back();
}

/// 8 forked ranks of a connect()-ed shm group (no launcher records deaths: the survivors see
/// the victims' processes end) lose the faults' victims and go on, as in a launch.
Stage lose_ranks_and_continue_connected(const EplbPlan& plan, const std::vector<Fault>& faults,
                                        std::chrono::milliseconds timeout) {
  std::vector<int> lost;
  const std::vector<Stage> stages = stages_for(plan, faults, lost);
  const auto segments_before = epx_segments();
  ForkHub hub(kP);
  ForkedRanks ranks;
  std::vector<pid_t> pids;
  for (int r = 0; r < kP; ++r)
    pids.push_back(ranks.start([&, r] {
      std::unique_ptr<Transport> t = hub.connect_shm(r, timeout);
      run_stages(*t, plan, stages, faults, true);
    }, "rank " + std::to_string(r)));
  for (int r = 0; r < kP; ++r) {
    const int status = ranks.wait(pids[static_cast<std::size_t>(r)]);
    if (std::binary_search(lost.begin(), lost.end(), r))
      EXPECT_TRUE(ForkedRanks::killed(status)) << "rank " << r << " should have been killed";
    else
      EXPECT_TRUE(ForkedRanks::exited_0(status)) << "rank " << r << " failed (its stderr says why)";
  }
  const std::set<std::string> left = segments_left(segments_before);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left: " << *left.begin();
  return stages.back();
}

constexpr std::chrono::milliseconds kTimeout(10000);

TEST(ElasticTest, SurvivorsRebuildAndContinueWhenTheOnlyCopyOfAnExpertDies) {
  const EplbPlan plan = the_plan();
  const int victim = victim_with_only_copy(plan);
  ASSERT_GE(victim, 0);
  const Stage st = lose_ranks_and_continue(plan, {{victim, "dispatch data"}}, kTimeout);
  EXPECT_GT(st.dropped_pairs, 0) << "the victim's only-copy experts are never routed to: nothing was dropped";
}

TEST(ElasticTest, SurvivorsRebuildAndContinueWhenReplicasCoverTheLostRank) {
  const EplbPlan plan = the_plan();
  const int victim = victim_covered_by_replicas(plan);
  ASSERT_GE(victim, 0) << "the plan has no rank whose experts all have a replica elsewhere";
  const Stage st = lose_ranks_and_continue(plan, {{victim, "combine data"}}, kTimeout);
  EXPECT_EQ(st.dropped_pairs, 0);
}

// A rebuilt group loses a rank too: 8 -> 7 -> 6, the second victim's death read from the
// launch's record through the rebuilt group.
TEST(ElasticTest, ARebuiltGroupLosesASecondRank) {
  const EplbPlan plan = the_plan();
  const int first = victim_covered_by_replicas(plan), second = victim_with_only_copy(plan);
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  ASSERT_NE(first, second);
  const Stage st = lose_ranks_and_continue(plan, {{first, "combine data"}, {second, "dispatch data"}}, kTimeout);
  EXPECT_EQ(st.survivors.size(), 6u);
  EXPECT_GT(st.dropped_pairs, 0);
}

// A rank that stops (SIGSTOP) inside a call: the survivors time out, agree without it after
// the timeout and go on; the launcher kills it once every other rank has ended.
TEST(ElasticTest, AStoppedRankIsLeftOut) {
  const EplbPlan plan = the_plan();
  lose_ranks_and_continue(plan, {{3, "dispatch data", true}}, std::chrono::milliseconds(1500));
}

// Elastic is about ranks that die: a rank that throws still fails the launch, with its error.
TEST(ElasticTest, ARankThatThrowsStillFailsTheLaunch) {
  std::vector<int> lost{42};
  LaunchOptions lo{3, TransportKind::kShm, std::chrono::milliseconds(2000)};
  lo.elastic = true;
  lo.lost = &lost;
  try {
    launch(lo, [](Transport& t) {
      if (t.rank() == 1) throw Error(ErrorCode::kInvalidArgument, "rank 1: a bad input", 1);
    });
    ADD_FAILURE() << "the launch returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.origin_rank(), 1);
    EXPECT_NE(std::string(e.what()).find("a bad input"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(lost.empty());
}

// A connect()-ed group (ranks forked here, a bootstrap of the test's own): no launcher
// records deaths, the survivors see the victims' processes end (their identities in the
// control block), agree, rebuild and go on; a second loss in the rebuilt group too.
TEST(ElasticTest, AConnectedGroupLosesTwoRanksAndGoesOn) {
  const EplbPlan plan = the_plan();
  const int first = victim_covered_by_replicas(plan), second = victim_with_only_copy(plan);
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  ASSERT_NE(first, second);
  const Stage st = lose_ranks_and_continue_connected(plan, {{first, "dispatch data"}, {second, "combine data"}}, kTimeout);
  EXPECT_EQ(st.survivors.size(), 6u);
  EXPECT_GT(st.dropped_pairs, 0);
}

TEST(ElasticTest, OnlyShmGroups) {
  EXPECT_THROW(launch({2, TransportKind::kThreads, std::chrono::milliseconds(1000), true}, [](Transport&) {}), Error);
  launch({2, TransportKind::kThreads, std::chrono::milliseconds(1000)}, [](Transport& t) {
    try {
      agree_survivors(t);
      fail(t.rank(), "agree_survivors accepted the threads transport");
    } catch (const Error& e) {
      // The message names the transport (so a user of another one knows why).
      if (e.code() != ErrorCode::kUnsupported || std::string(e.what()).find("'threads'") == std::string::npos) throw;
    }
  });
}

}  // namespace
}  // namespace epx::testing
