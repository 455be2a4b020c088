// The names of docs/cpp.md, "Names": every buffer kind built as `Kind(Transport&, KindConfig)`
// gives what its first constructor gives (bit for bit, against the reference), the aliases are
// the same types, and the load-balancing vocabulary's functions return what their first names
// return.
#include <gtest/gtest.h>

#include <cstring>
#include <type_traits>

#include "epx/bucket.hpp"
#include "epx/buffer.hpp"
#include "epx/engram.hpp"
#include "epx/eplb.hpp"
#include "epx/lb.hpp"
#include "epx/pp.hpp"
#include "multirank_support.hpp"
#include "pp_engram_checks.hpp"
#include "round_trip_cases.hpp"

namespace epx::testing {
namespace {

// One name per concept; the first names are the same types, so code written against either
// builds and links against the same library.
static_assert(std::is_same_v<EPBuffer, Buffer>);
static_assert(std::is_same_v<EPConfig, BufferConfig>);
static_assert(std::is_same_v<LbPlacement, ReplicaPlacement>);
static_assert(std::is_same_v<LbDirection, ReplicaDirection>);
static_assert(std::is_same_v<LbToken, ReplicaToken>);
static_assert(std::is_same_v<LbTransfer, ReplicaTransfer>);
static_assert(std::is_same_v<LbEvent, ReplicaEvent>);
static_assert(std::is_same_v<EplbPlan, StaticReplicaPlan>);
// Every kind is a BufferBase built from (Transport&, its config).
static_assert(std::is_base_of_v<BufferBase, EPBuffer> && std::is_constructible_v<EPBuffer, Transport&, const EPConfig&>);
static_assert(std::is_base_of_v<BufferBase, BucketBuffer> &&
              std::is_constructible_v<BucketBuffer, Transport&, const BucketConfig&>);
static_assert(std::is_base_of_v<BufferBase, PPBuffer> && std::is_constructible_v<PPBuffer, Transport&, const PPConfig&>);
static_assert(std::is_base_of_v<BufferBase, EngramBuffer> &&
              std::is_constructible_v<EngramBuffer, Transport&, const EngramConfig&>);

// A call after destroy() throws the base's error in the contract's words: "rank r:
// <kind>.<call>: the buffer was destroyed" (docs/cpp.md), the kind named once.
template <class F>
void expect_destroyed_error(int r, const char* kind, const char* call, F&& f) {
  try {
    f();
    fail(r, std::string(kind) + "." + call + " after destroy() did not throw");
  } catch (const Error& e) {
    const std::string want = "rank " + std::to_string(r) + ": " + kind + "." + call + ": the buffer was destroyed";
    if (e.code() != ErrorCode::kInvalidArgument || e.what() != want)
      fail(r, std::string("wrong error after destroy: ") + e.what() + ", want " + want);
  }
}

// The lifecycle every kind shares: destroy() twice, destroyed(), no window, calls refused.
void expect_lifecycle(int r, BufferBase& b, const char* kind) {
  if (b.destroyed() || b.window_bytes() == 0) fail(r, std::string(kind) + ": a new buffer is destroyed or has no window");
  b.destroy();
  b.destroy();
  if (!b.destroyed() || b.window_bytes() != 0) fail(r, std::string(kind) + ": destroy() left a window");
  if (std::string(b.kind()) != kind) fail(r, std::string("kind() is ") + b.kind() + ", want " + kind);
}

TEST(Names, EPBufferFromEPConfigDispatchesAsBufferFromBufferConfig) {
  const Expected e = expect(fixture(false, 21), true, true);  // expanded, weighted
  const auto before = epx_segments();
  launch({.num_ranks = kCaseRanks, .transport = TransportKind::kThreads}, [&](Transport& t) {
    const int r = t.rank();
    const BufferConfig old_config = config_for(e.p);
    Buffer first(t, old_config);
    EPBuffer named(t, EPConfig{.num_experts = old_config.num_experts, .hidden = old_config.hidden,
                               .num_topk = old_config.num_topk, .max_tokens_per_rank = old_config.max_tokens_per_rank,
                               .num_workers = old_config.num_workers});
    for (EPBuffer* b : {&first, &named}) {
      const char* which = b == &first ? "Buffer(t, BufferConfig)" : "EPBuffer(t, EPConfig)";
      const RankViews v = views_of(e.p, r);
      const DispatchResult d = b->dispatch(dispatch_args(v, e.d));
      expect_dispatch(r, e.p, e.d, e.out[static_cast<std::size_t>(r)], d);
      const auto& y = e.y[static_cast<std::size_t>(r)];
      CombineArgs ca;
      ca.y = TensorView(y.data(), DType::kBF16, {d.handle.num_recv_rows(), e.p.hidden});
      ca.handle = &d.handle;
      ca.weighted = true;
      const CombineResult c = b->combine(ca);
      expect_bits(r, std::string(which) + ": combined_x", c.combined_x.data(), e.combined[static_cast<std::size_t>(r)]);
    }
    if (first.window_bytes() != named.window_bytes()) fail(r, "the two constructors made windows of different sizes");
    expect_lifecycle(r, first, "ep");
    expect_lifecycle(r, named, "ep");
    expect_destroyed_error(r, "ep", "dispatch", [&] { named.dispatch(dispatch_args(views_of(e.p, r), e.d)); });
  });
  EXPECT_TRUE(segments_left(before).empty());
}

// all_reduce of rank-dependent values on every rank, checked against the sum computed here.
void all_reduce_and_check(int r, int P, BucketBuffer& b, const char* which) {
  const std::int64_t n = 300;
  auto* x = reinterpret_cast<float*>(b.storage());
  for (std::int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * 1000 + i);
  b.all_reduce({MutableView{x, DType::kF32, Shape{n}}});
  for (std::int64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int p = 0; p < P; ++p) want += static_cast<float>((p + 1) * 1000 + i);
    if (x[i] != want)
      fail(r, std::string(which) + ": element " + std::to_string(i) + " is " + std::to_string(x[i]) + ", want " +
                  std::to_string(want));
  }
}

TEST(Names, BucketBufferFromBucketConfigReducesAsTheFirstConstructors) {
  const int P = 3;
  const auto before = epx_segments();
  launch({.num_ranks = P, .transport = TransportKind::kThreads}, [&](Transport& t) {
    const int r = t.rank();
    BucketBuffer first(t, {world_ranks(P)}, 4096);
    BucketBuffer named(t, {.num_bytes = 4096});  // groups {}: the world
    if (named.num_groups() != 1 || named.group_ranks(0) != world_ranks(P))
      fail(r, "BucketConfig without groups is not the world");
    all_reduce_and_check(r, P, first, "BucketBuffer(t, groups, n)");
    all_reduce_and_check(r, P, named, "BucketBuffer(t, BucketConfig)");
    if (first.window_bytes() != named.window_bytes()) fail(r, "the two constructors made windows of different sizes");

    BufferAllocator plan;
    plan.allocate("grads", Shape{300}, DType::kF32);
    BucketBuffer planned(t, BucketConfig{}, plan);  // groups {}: the world; num_bytes 0: the plan's
    if (planned.num_bytes() != plan.total_bytes() || planned.tensor("grads").data != planned.storage())
      fail(r, "BucketBuffer(t, config, plan) does not hold the plan's storage");
    all_reduce_and_check(r, P, planned, "BucketBuffer(t, BucketConfig, plan)");
    // Pairs of groups through the config: {0, 1} and {2}.
    BucketBuffer pairs(t, {.groups = {{0, 1}, {2}}, .num_bytes = 1024});
    if (pairs.num_groups() != 2 || pairs.group_rank(0) != (r < 2 ? r : -1)) fail(r, "BucketConfig::groups not kept");

    try {  // a num_bytes that contradicts the plan: refused on every rank before any collective
      BucketBuffer bad(t, BucketConfig{.num_bytes = plan.total_bytes() + 1}, plan);
      fail(r, "BucketConfig::num_bytes other than the plan's was accepted");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument || std::string(e.what()).find("num_bytes") == std::string::npos)
        fail(r, std::string("wrong error for num_bytes against the plan: ") + e.what());
    }
    expect_lifecycle(r, first, "bucket");
    expect_lifecycle(r, named, "bucket");
    expect_lifecycle(r, planned, "bucket");
    expect_lifecycle(r, pairs, "bucket");
    expect_destroyed_error(r, "bucket", "all_reduce",
                           [&] { named.all_reduce({MutableView{nullptr, DType::kF32, Shape{4}}}); });
  });
  EXPECT_TRUE(segments_left(before).empty());
}

TEST(Names, PPBufferFromPPConfigSendsAroundTheRing) {
  const int P = 3;
  const auto before = epx_segments();
  launch({.num_ranks = P, .transport = TransportKind::kThreads}, [&](Transport& t) {
    const int r = t.rank();
    PPBuffer pp(t, {.num_max_tensor_bytes = 256, .num_max_inflight_tensors = 2, .links = pp_ring_links(P)});
    std::vector<std::int32_t> out(40), in(40);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = r * 100 + static_cast<std::int32_t>(i);
    pp.send(TensorView(out.data(), DType::kI32, {40}), (r + 1) % P);
    pp.recv(MutableView{in.data(), DType::kI32, Shape{40}}, (r + P - 1) % P);
    const int src = (r + P - 1) % P;
    for (std::size_t i = 0; i < in.size(); ++i)
      if (in[i] != src * 100 + static_cast<std::int32_t>(i)) fail(r, "element " + std::to_string(i) + " from the ring");
    expect_lifecycle(r, pp, "pp");
    expect_destroyed_error(r, "pp", "send", [&] { pp.send(TensorView(out.data(), DType::kI32, {40}), (r + 1) % P); });
  });
  EXPECT_TRUE(segments_left(before).empty());
}

TEST(Names, EngramBufferFromEngramConfigFetchesAsTheTwoSteps) {
  const int P = 3;
  const auto before = epx_segments();
  for (const DType dt : {DType::kBF16, DType::kFP8E4M3}) {
    SCOPED_TRACE(to_string(dt));
    const EngramConfig c = engram_config(dt);
    launch({.num_ranks = P, .transport = TransportKind::kThreads}, [&](Transport& t) {
      const int r = t.rank();
      const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
      EngramBuffer first(t, z.num_bytes, z.num_storage_bytes);
      first.set_config(c);
      EngramBuffer named(t, c);
      EngramBuffer sized(t, z);  // the window alone, as the first constructor
      sized.set_config(c);
      for (EngramBuffer* b : {&first, &named, &sized}) {
        write_engram_shards(*b, c, r);
        fetch_and_check(*b, c, P, r, 9, 5, false);  // every layer against the reference tables
      }
      if (named.window_bytes() != first.window_bytes() || sized.window_bytes() != first.window_bytes())
        fail(r, "the constructors made windows of different sizes");
      if (named.config().num_entries_per_layer != c.num_entries_per_layer || named.config().hidden != c.hidden)
        fail(r, "EngramBuffer(t, config) did not set the config");
      expect_lifecycle(r, first, "engram");
      expect_lifecycle(r, named, "engram");
      expect_lifecycle(r, sized, "engram");
    });
  }
  EngramConfig bad = engram_config(DType::kBF16);
  bad.hidden = 0;
  launch({.num_ranks = 2, .transport = TransportKind::kThreads}, [&](Transport& t) {
    try {  // refused locally, alike on every rank, before any collective
      EngramBuffer b(t, bad);
      fail(t.rank(), "EngramBuffer(t, config) accepted hidden = 0");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) fail(t.rank(), std::string("wrong error: ") + e.what());
    }
  });
  EXPECT_TRUE(segments_left(before).empty());
}

// The load-balancing names: each new one returns exactly what its first name returns.
TEST(Names, ReplicaVocabularyEqualsTheFirstNames) {
  const int layers = 2, E = 8, R = 12, P = 4;
  std::vector<float> weight(static_cast<std::size_t>(layers * E));
  for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = static_cast<float>((i * 37) % 11 + 1);
  const StaticReplicaPlan a = plan_static_replicas(weight, layers, E, R, 2, 2, P);
  const EplbPlan b = rebalance_experts(weight, layers, E, R, 2, 2, P);
  EXPECT_EQ(a.phy2log, b.phy2log);
  EXPECT_EQ(a.log2phy, b.log2phy);
  EXPECT_EQ(a.logcnt, b.logcnt);
  // Every logical expert has a replica and the counts add up to the physical slots.
  for (int l = 0; l < layers; ++l) {
    std::int64_t sum = 0;
    for (int e = 0; e < E; ++e) sum += a.logcnt[static_cast<std::size_t>(l * E + e)];
    EXPECT_EQ(sum, R);
  }
  EXPECT_EQ(replica_load(a, weight, P), eplb_gpu_load(b, weight, P));
  EXPECT_EQ(load_without_replicas(weight, layers, E, P), eplb_gpu_load_without_replicas(weight, layers, E, P));
  const std::vector<double> load = replica_load(a, weight, P);
  EXPECT_EQ(load_imbalance(load, layers, P), eplb_max_over_avg(load, layers, P));

  const std::vector<std::int64_t> topk = {0, 3, 7, -1, 5, 1, 2, 6, 4, 0, 1, 7};  // [6, 2]
  for (const ReplicaChoice choice : {ReplicaChoice::kSpread, ReplicaChoice::kPreferRank}) {
    const ReplicaRouting routing{.layer = 1, .rank = 2, .num_ranks = P, .choice = choice};
    const auto routed = route_through_replicas(a, routing, topk, 2);
    EXPECT_EQ(routed, map_to_replicas(topk, 2, b, routing));
    for (std::size_t i = 0; i < topk.size(); ++i)  // each physical slot serves its token's logical expert
      EXPECT_EQ(topk[i] < 0 ? -1 : a.phy2log[static_cast<std::size_t>(R + routed[i])], topk[i]);
    const MaskedRouting live = route_through_live_replicas(a, routing, {1}, topk, 2);
    const MaskedRouting masked = map_to_live_replicas(topk, 2, b, routing, {1});
    EXPECT_EQ(live.topk_idx, masked.topk_idx);
    EXPECT_EQ(live.num_experts, masked.num_experts);
    EXPECT_EQ(live.dropped_pairs, masked.dropped_pairs);
  }

  const ReplicaPlacement placement{.home_experts = 2, .slots = 1, .mapping = {3, -1, 0, 5}};
  for (const ReplicaDirection d : {ReplicaDirection::kToReplicas, ReplicaDirection::kToHome}) {
    const ReplicaTransfer x = plan_replica_transfer(d, placement, P, 1000, 256, 2, 3);
    const LbTransfer y = plan_lb_transfer(d, placement, P, 1000, 256, 2, 3);
    EXPECT_EQ(x.rounds, y.rounds);
    EXPECT_EQ(x.offsets, y.offsets);
    EXPECT_EQ(x.dests, y.dests);
    EXPECT_EQ(x.fingerprint, y.fingerprint);
    ASSERT_EQ(x.tokens.size(), y.tokens.size());
    EXPECT_EQ(x.rows_per_expert, 4);  // ceil(1000 / 256)
    // Three used slots, four rows each: 12 tokens either way (one destination each).
    EXPECT_EQ(x.tokens.size(), 12u);
  }
}

}  // namespace
}  // namespace epx::testing
