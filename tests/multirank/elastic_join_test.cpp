// Ranks joining a running launch (epx/elastic.hpp: request_ranks, admit, joined_admission):
// 8 shm ranks dispatch and combine, one is SIGKILLed inside a call, the 7 survivors rebuild
// and go on, a replacement is started and admitted as rank 7, and the 8 go on; a 6-rank job
// grows to 8 with no loss; a joiner that dies inside its admission leaves the group as it
// was (same Buffer, same windows). Every pair — before, between and after — is checked bit
// for bit against the reference dispatch / combine of a routing over the ranks live at the
// time (the experts split evenly over them: kPerRank slots a rank). Nothing is left behind:
// every process is reaped (by launch(), or by the test's own fork harness), no /dev/shm
// segment remains.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <string>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/elastic.hpp"
#include "fork_harness.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

constexpr int kPerRank = 3, kTopk = 3;
constexpr int kKillPair = 1;  // the victim dies inside this pair
constexpr std::chrono::milliseconds kTimeout(10000);

/// Pair j of a stage over P live ranks: its problem and the reference results.
struct Pair {
  ref::Problem problem;
  ref::DispatchOptions options;
  std::vector<ref::DispatchOut> dispatch;
  std::vector<std::vector<std::uint16_t>> y, combined;
};

Pair reference_pair(int P, std::uint64_t seed, bool expanded) {
  ref::FixtureOptions f;
  f.num_ranks = P;
  f.num_experts = kPerRank * P;
  f.num_topk = kTopk;
  f.hidden = 128;
  f.tokens = 16;
  f.seed = seed;
  Pair pair{ref::make_problem(f), {}, {}, {}, {}};
  pair.options.expanded = expanded;
  pair.dispatch = ref::dispatch_all(pair.problem, pair.options);
  pair.y.resize(static_cast<std::size_t>(P));
  pair.combined.resize(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r)
    pair.y[static_cast<std::size_t>(r)] = ref::expert_fn(pair.problem, pair.dispatch[static_cast<std::size_t>(r)], pair.options);
  for (int r = 0; r < P; ++r)
    pair.combined[static_cast<std::size_t>(r)] =
        ref::combine(pair.problem, pair.options, pair.dispatch, pair.y, nullptr, nullptr, false, r);
  return pair;
}

std::vector<Pair> stage(int P, std::uint64_t seed, int num_pairs) {
  std::vector<Pair> pairs;
  for (int j = 0; j < num_pairs; ++j) pairs.push_back(reference_pair(P, seed + static_cast<std::uint64_t>(j), j % 2 == 1));
  return pairs;
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
    t_.enter_phase(phase);
    raise(SIGKILL);
  }
  Transport& t_;
  const char* phase_;
  std::atomic<bool> armed_{false};
};

/// Pair j on `buffer` of the group `g` (rank g.rank() of the stage's P), bit for bit.
void check_pair(Buffer& buffer, const Transport& g, const Pair& pair, int who) {
  const int me = g.rank();
  if (static_cast<int>(pair.problem.ranks.size()) != g.num_ranks())
    fail(who, "a group of " + std::to_string(g.num_ranks()) + " ranks runs a stage of " + std::to_string(pair.problem.ranks.size()));
  const auto u = static_cast<std::size_t>(me);
  const RankViews v = views_of(pair.problem, me);
  DispatchResult d = buffer.dispatch(dispatch_args(v, pair.options));
  expect_dispatch(who, pair.problem, pair.options, pair.dispatch[u], d);
  CombineArgs c;
  c.y = TensorView(pair.y[u].data(), DType::kBF16, {pair.dispatch[u].rows, pair.problem.hidden});
  c.handle = &d.handle;
  expect_bits(who, "combined_x", buffer.combine(c).combined_x.data(), pair.combined[u]);
}

void run_stage(Transport& g, const std::vector<Pair>& pairs, int who) {
  Buffer buffer(g, config_for(pairs[0].problem));
  for (const Pair& p : pairs) check_pair(buffer, g, p, who);
}

/// A call on a retired group fails at once naming the rebuild.
void expect_retired(Transport& old, int who) {
  try {
    old.barrier("old group");
    fail(who, "a barrier on the group an admission replaced returned");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kBadHandle || std::string(e.what()).find("rebuilt") == std::string::npos) throw;
  }
}

/// The new group as admit made it: old ranks kept, the joiners after them.
void expect_admitted(const Transport& old, const Transport* fresh, const Admission& a, int joiners, std::uint64_t tag, int who) {
  if (fresh == nullptr) fail(who, "admit admitted nobody");
  if (fresh->num_ranks() != old.num_ranks() + joiners || fresh->rank() != old.rank() || a.joined != joiners ||
      a.old_num_ranks != old.num_ranks() || a.new_rank != old.rank() || a.tag != tag)
    fail(who, "admit: rank " + std::to_string(fresh->rank()) + " of " + std::to_string(fresh->num_ranks()) + ", joined " +
                  std::to_string(a.joined) + ", want rank " + std::to_string(old.rank()) + " of " +
                  std::to_string(old.num_ranks() + joiners));
}

void expect_joined(const Transport& t, int old_P, int joiners, std::uint64_t tag) {
  const Admission* j = joined_admission();
  if (j == nullptr || j->old_num_ranks != old_P || j->joined != joiners || j->tag != tag || j->new_rank != t.rank() ||
      t.rank() < old_P || t.num_ranks() != old_P + joiners)
    fail(t.rank(), "a joiner's group or admission is not the one the members made");
}

// 8 ranks, one killed inside a call, the 7 go on, a replacement joins, the 8 go on.
TEST(ElasticJoinTest, AReplacementJoinsAfterARankIsLost) {
  constexpr int kP = 8, kVictim = 5;
  constexpr std::uint64_t kTag = 77;
  const std::vector<Pair> before = stage(8, 10, kKillPair + 2), between = stage(7, 20, 2), after = stage(8, 30, 2);
  const auto segments_before = epx_segments();
  std::vector<int> lost;
  LaunchOptions lo{kP, TransportKind::kShm, kTimeout};
  lo.elastic = true;
  lo.lost = &lost;
  lo.spare_ranks = 1;
  launch(lo, [&](Transport& t) {
    if (joined_admission() != nullptr) {  // the replacement: rank 7 of the 8
      expect_joined(t, 7, 1, kTag);
      run_stage(t, after, 100 + t.rank());
      return;
    }
    const int orig = t.rank();
    int completed = 0;
    try {
      KillingTransport killing(t, "dispatch data");
      Buffer buffer(killing, config_for(before[0].problem));
      for (int j = 0; j < static_cast<int>(before.size()); ++j, ++completed) {
        if (orig == kVictim && j == kKillPair) killing.arm();
        check_pair(buffer, t, before[static_cast<std::size_t>(j)], orig);
      }
      fail(orig, "every pair completed: the victim's death went unnoticed");
    } catch (const Error& e) {
      if (!is_peer_loss(e) || e.origin_rank() != kVictim) throw;
    }
    if (completed < kKillPair || completed > kKillPair + 1) fail(orig, "failed after " + std::to_string(completed) + " pairs");
    const Membership m = agree_survivors(t);
    if (m.lost != std::vector<int>{kVictim}) fail(orig, "agree_survivors lost the wrong ranks");
    std::unique_ptr<Transport> seven = rebuild_group(t, m);
    if (seven->rank() == 0) request_ranks(*seven, 1);  // the replacement starts while the 7 work
    run_stage(*seven, between, orig);
    Admission a;
    std::unique_ptr<Transport> eight = admit(*seven, {1, std::chrono::milliseconds(0), kTag}, &a);
    expect_admitted(*seven, eight.get(), a, 1, kTag, orig);
    expect_retired(*seven, orig);
    run_stage(*eight, after, orig);
  });
  EXPECT_EQ(lost, std::vector<int>{kVictim});
  const std::set<std::string> left = segments_left(segments_before);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left: " << *left.begin();
}

// 6 -> 8 with no loss: two ranks asked for at once join as ranks 6 and 7.
TEST(ElasticJoinTest, ASixRankJobGrowsToEight) {
  constexpr std::uint64_t kTag = 5;
  const std::vector<Pair> six = stage(6, 40, 2), eight_pairs = stage(8, 50, 2);
  const auto segments_before = epx_segments();
  std::vector<int> lost{42};
  LaunchOptions lo{6, TransportKind::kShm, kTimeout};
  lo.elastic = true;
  lo.lost = &lost;
  lo.spare_ranks = 2;
  launch(lo, [&](Transport& t) {
    if (joined_admission() != nullptr) {
      expect_joined(t, 6, 2, kTag);
      run_stage(t, eight_pairs, 100 + t.rank());
      return;
    }
    if (t.rank() == 0) request_ranks(t, 2);
    run_stage(t, six, t.rank());
    Admission a;
    std::unique_ptr<Transport> eight = admit(t, {2, std::chrono::milliseconds(0), kTag}, &a);
    expect_admitted(t, eight.get(), a, 2, kTag, t.rank());
    run_stage(*eight, eight_pairs, t.rank());
  });
  EXPECT_TRUE(lost.empty());
  const std::set<std::string> left = segments_left(segments_before);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left: " << *left.begin();
}

/// Sets an environment variable for one scope (the forked ranks inherit it).
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

// A joiner SIGKILLed inside its admission (invited, before the new group's first barrier):
// the members abandon the new group, admit returns null, and the 4 go on with the same
// Buffer on the same group. The joiner is lost by its root number, 4.
TEST(ElasticJoinTest, AJoinerThatDiesWhileJoiningLeavesTheJobAsItWas) {
  const std::vector<Pair> pairs = stage(4, 60, 4);
  const auto segments_before = epx_segments();
  ScopedEnv fault("EPX_FAULT_INJECT", "4:elastic admit:KILL");
  std::vector<int> lost;
  LaunchOptions lo{4, TransportKind::kShm, kTimeout};
  lo.elastic = true;
  lo.lost = &lost;
  lo.spare_ranks = 1;
  launch(lo, [&](Transport& t) {
    if (joined_admission() != nullptr) fail(t.rank(), "the joiner that died was admitted");
    Buffer buffer(t, config_for(pairs[0].problem));
    check_pair(buffer, t, pairs[0], t.rank());
    check_pair(buffer, t, pairs[1], t.rank());
    if (t.rank() == 0) request_ranks(t, 1);
    Admission a;
    std::unique_ptr<Transport> bigger = admit(t, {1, std::chrono::milliseconds(0), 0}, &a);
    if (bigger != nullptr || a.joined != 0) fail(t.rank(), "a group with the dead joiner was made");
    check_pair(buffer, t, pairs[2], t.rank());  // the same buffer, windows and group
    check_pair(buffer, t, pairs[3], t.rank());
  });
  EXPECT_EQ(lost, std::vector<int>{4});
  const std::set<std::string> left = segments_left(segments_before);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left: " << *left.begin();
}

constexpr int kDoorReady = 0, kFirstAdmitted = 1;  // the test's flags in its ForkHub

// A connect()-ed group of 3 (no launcher: the test forks the ranks and bootstraps them) opens
// its door; a process the test starts later joins through it as rank 3 and the 4 go on; then
// a joiner SIGKILLed inside its admission (seat 1: root number 3 + 1) leaves the 4 going on
// with the same Buffer.
TEST(ElasticJoinTest, AConnectedGroupGrowsThroughItsDoor) {
  constexpr std::uint64_t kTag = 9;
  const std::vector<Pair> three = stage(3, 70, 2), four = stage(4, 80, 4);
  constexpr int kMembers = 3;
  const auto segments_before = epx_segments();
  ForkHub hub(kMembers);
  ForkedRanks procs;
  std::vector<pid_t> members;
  for (int r = 0; r < kMembers; ++r)
    members.push_back(procs.start([&, r] {
      std::unique_ptr<Transport> t = hub.connect_shm(r, kTimeout);
      const std::string door = open_door(*t, 2);
      if (t->rank() == 0) {  // the rendezvous: the joiners read the name there
        hub.set_text(door);
        hub.set_flag(kDoorReady);
        request_ranks(*t, 1);
      }
      run_stage(*t, three, t->rank());
      Admission a;
      std::unique_ptr<Transport> bigger = admit(*t, {1, std::chrono::milliseconds(0), kTag}, &a);
      expect_admitted(*t, bigger.get(), a, 1, kTag, t->rank());
      expect_retired(*t, t->rank());
      if (original_ranks(*bigger) != std::vector<int>{0, 1, 2, 3}) fail(t->rank(), "the joiner's number is not 3");
      Buffer buffer(*bigger, config_for(four[0].problem));
      check_pair(buffer, *bigger, four[0], t->rank());
      check_pair(buffer, *bigger, four[1], t->rank());
      if (bigger->rank() == 0) request_ranks(*bigger, 1);  // the one that dies while joining
      std::unique_ptr<Transport> none = admit(*bigger, {1, std::chrono::milliseconds(0), 0}, &a);
      if (none != nullptr || a.joined != 0) fail(t->rank(), "a group with the dead joiner was made");
      check_pair(buffer, *bigger, four[2], t->rank());  // the same buffer, windows and group
      check_pair(buffer, *bigger, four[3], t->rank());
      bigger->barrier("done");
      close_door(*bigger);
    }));
  auto wait_for_door = [&] {
    hub.wait_flag(kDoorReady, "the door's name never came");
    return hub.text();
  };
  const pid_t joiner = procs.start([&] {
    Admission a;
    std::unique_ptr<Transport> g = join_door(wait_for_door(), JoinOptions{kTimeout, {}}, &a);
    if (g == nullptr) fail(-1, "the joiner was not admitted");
    expect_joined(*g, 3, 1, kTag);
    if (a.new_rank != 3 || original_ranks(*g) != std::vector<int>{0, 1, 2, 3}) fail(3, "the joiner's admission");
    hub.set_flag(kFirstAdmitted);  // the next joiner may knock
    Buffer buffer(*g, config_for(four[0].problem));
    check_pair(buffer, *g, four[0], 3);
    check_pair(buffer, *g, four[1], 3);
    std::unique_ptr<Transport> none = admit(*g, {1, std::chrono::milliseconds(0), 0}, &a);  // a member now
    if (none != nullptr) fail(3, "a group with the dead joiner was made");
    check_pair(buffer, *g, four[2], 3);
    check_pair(buffer, *g, four[3], 3);
    g->barrier("done");
    close_door(*g);
  });
  const pid_t dying = procs.start([&] {
    hub.wait_flag(kFirstAdmitted, "the first joiner was never admitted");
    setenv("EPX_FAULT_INJECT", "4:elastic admit:KILL", 1);
    join_door(wait_for_door(), JoinOptions{kTimeout, {}}, nullptr);
    fail(4, "the joiner that was to die returned from join_door");
  });
  EXPECT_TRUE(ForkedRanks::exited_0(procs.wait(joiner))) << "the joiner failed (its stderr says why)";
  EXPECT_TRUE(ForkedRanks::killed(procs.wait(dying))) << "the dying joiner was not killed";
  for (pid_t pid : members)
    EXPECT_TRUE(ForkedRanks::exited_0(procs.wait(pid))) << "a member failed (its stderr says why)";
  const std::set<std::string> left = segments_left(segments_before);
  EXPECT_TRUE(left.empty()) << "a /dev/shm segment was left: " << *left.begin();
}

TEST(ElasticJoinTest, OnlyAnElasticLaunchWithSpareRanksAdmits) {
  LaunchOptions lo{2, TransportKind::kShm, std::chrono::milliseconds(2000)};
  lo.spare_ranks = 1;
  EXPECT_THROW(launch(lo, [](Transport&) {}), Error);  // spare ranks need elastic
  lo.elastic = true;
  lo.spare_ranks = 0;
  launch(lo, [](Transport& t) {
    try {
      request_ranks(t, 1);
      fail(t.rank(), "request_ranks accepted a launch without spare ranks");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnsupported) throw;
    }
  });
  lo.spare_ranks = 1;
  launch(lo, [](Transport& t) {
    if (t.rank() != 0) return;
    try {
      request_ranks(t, 2);
      fail(t.rank(), "request_ranks accepted more ranks than the spare ones");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) throw;
    }
  });
}

}  // namespace
}  // namespace epx::testing
