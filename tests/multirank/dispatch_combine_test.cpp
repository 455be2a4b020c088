// Dispatch and combine across P ranks on every transport, bit for bit against the
// independent reference (tests/reference), for every routing shape docs/spec.md §3–4 describe.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "deferred_put_transport.hpp"
#include "epx/spi/support.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

struct Case {
  std::string name;
  ref::FixtureOptions fx;
  ref::DispatchOptions d;
  bool weighted = false;
  bool bias = false;
  int workers = 2;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ref::FixtureOptions fx(int P, int E, int K, std::vector<std::int64_t> tokens, std::uint64_t seed) {
  ref::FixtureOptions f;
  f.num_ranks = P;
  f.num_experts = E;
  f.num_topk = K;
  f.hidden = 256;
  f.tokens_per_rank = std::move(tokens);
  f.seed = seed;
  return f;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int P : {1, 2, 3, 4, 8}) {
    std::vector<std::int64_t> tokens;
    for (int r = 0; r < P; ++r) tokens.push_back(r == 1 ? 0 : 5 + 7 * r);  // uneven, rank 1 empty
    for (bool expanded : {false, true}) {
      Case c{"P" + std::to_string(P) + (expanded ? "_expanded" : "_compact"), fx(P, 4 * P, std::min(4, 4 * P), tokens, 10 + P), {}};
      c.d.expanded = expanded;
      c.d.alignment = expanded ? 4 : 1;
      v.push_back(c);
    }
  }
  Case k1{"K1", fx(4, 8, 1, {9, 3, 0, 6}, 21), {}};
  v.push_back(k1);
  Case l1{"L1_expanded", fx(4, 4, 3, {8, 8, 8, 8}, 22), {}};
  l1.d.expanded = true;
  v.push_back(l1);
  Case skew{"zipf_expanded_a128", fx(4, 16, 4, {40, 10, 25, 3}, 23), {}};
  skew.fx.zipf = 1.5;
  skew.d.expanded = true;
  skew.d.alignment = 128;
  v.push_back(skew);
  Case masked{"heavily_masked", fx(3, 6, 4, {12, 12, 12}, 24), {}};
  masked.fx.mask_prob = 0.7;
  v.push_back(masked);
  Case worst_c{"worst_compact", fx(4, 8, 3, {10, 4, 0, 7}, 25), {}};
  worst_c.d.worst = 4 * 10;
  v.push_back(worst_c);
  Case worst_e{"worst_expanded", fx(4, 8, 3, {10, 4, 0, 7}, 26), {}};
  worst_e.d.expanded = true;
  worst_e.d.alignment = 2;
  worst_e.d.worst = 4 * 10 * 3 + 8;
  v.push_back(worst_e);
  Case fp8c{"fp8_compact", fx(4, 8, 3, {6, 9, 2, 0}, 27), {}};
  fp8c.fx.fp8 = true;
  v.push_back(fp8c);
  Case fp8e{"fp8_expanded_worst", fx(2, 8, 4, {7, 5}, 28), {}};
  fp8e.fx.fp8 = true;
  fp8e.d.expanded = true;
  fp8e.d.worst = 64;
  v.push_back(fp8e);
  Case weighted{"weighted_expanded", fx(4, 8, 4, {11, 6, 3, 9}, 29), {}};
  weighted.d.expanded = true;
  weighted.weighted = true;
  v.push_back(weighted);
  Case bias_c{"bias_compact", fx(3, 6, 2, {5, 0, 8}, 30), {}};
  bias_c.bias = true;
  v.push_back(bias_c);
  Case bias_e{"bias_expanded_one_worker", fx(3, 6, 3, {5, 7, 8}, 31), {}};
  bias_e.d.expanded = true;
  bias_e.bias = true;
  bias_e.workers = 1;
  v.push_back(bias_e);
  Case many{"four_workers_P2", fx(2, 8, 4, {33, 17}, 32), {}};
  many.workers = 4;
  v.push_back(many);
  return v;
}

// One case: fresh dispatch, combine, cached dispatch of the same x and of new x, combine
// through the cached handle — every output against the reference. `pool` -1: one-copy
// outputs (the default, with a pool for every output the case holds); 0: no output pool:
// copies, and calls right after one of the other kind go rows first.
void run_case(const TestTransport& where, const Case& c, std::int64_t pool) {
  const ref::Problem p = ref::make_problem(c.fx);
  const int P = p.num_ranks;
  const auto want = ref::dispatch_all(p, c.d);
  std::vector<std::vector<std::uint16_t>> y(static_cast<std::size_t>(P)), b0, b1;
  for (int r = 0; r < P; ++r) y[static_cast<std::size_t>(r)] = ref::expert_fn(p, want[static_cast<std::size_t>(r)], c.d);
  if (c.bias)
    for (int r = 0; r < P; ++r) {
      const std::int64_t n = p.ranks[static_cast<std::size_t>(r)].num_tokens * p.hidden;
      b0.push_back(ref::random_bf16(100 + static_cast<std::uint64_t>(r), n));
      b1.push_back(ref::random_bf16(200 + static_cast<std::uint64_t>(r), n));
    }
  std::vector<std::vector<std::uint16_t>> combined(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r)
    combined[static_cast<std::size_t>(r)] =
        ref::combine(p, c.d, want, y, c.bias ? &b0 : nullptr, c.bias ? &b1 : nullptr, c.weighted, r);

  // y whose sums show the order of additions (padding rows are ignored by combine).
  std::vector<std::vector<std::uint16_t>> y_wide(static_cast<std::size_t>(P)), combined_wide(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) y_wide[static_cast<std::size_t>(r)] = wide_bf16(500 + static_cast<std::uint64_t>(r), want[static_cast<std::size_t>(r)].rows * p.hidden);
  for (int r = 0; r < P; ++r)
    combined_wide[static_cast<std::size_t>(r)] = ref::combine(p, c.d, want, y_wide, nullptr, nullptr, c.weighted, r);

  // The same routing with new x, for the cached dispatch.
  ref::Problem p2 = p;
  for (int r = 0; r < P && !p.fp8; ++r)
    p2.ranks[static_cast<std::size_t>(r)].x = ref::random_bf16(300 + static_cast<std::uint64_t>(r),
                                                               p.ranks[static_cast<std::size_t>(r)].num_tokens * p.hidden);
  const auto want2 = ref::dispatch_all(p2, c.d);

  LaunchOptions lo;
  lo.num_ranks = P;
  lo.timeout = std::chrono::milliseconds(20000);
  launch_on(where, lo, [&](Transport& t) {
    const int r = t.rank();
    const auto ur = static_cast<std::size_t>(r);
    BufferConfig cfg = config_for(p, c.workers);
    // Room for the (at most five) outputs this case holds at once; exhaustion has its own tests.
    cfg.output_pool_bytes = pool == 0 ? 0 : 8 * p.num_ranks * cfg.max_tokens_per_rank * 2 * p.hidden + (1 << 20);
    Buffer buffer(t, cfg);
    const RecvLayout layout = c.d.expanded ? RecvLayout::kExpanded : RecvLayout::kCompact;
    const bool first = spi::allows(spi::Path::kRowsFirst, cfg);  // no output pool: rows first
    // Replies first without a pool, where nobody can pull (the simulator), and otherwise where
    // every rank's output is at most replies_first_max_bytes (the expanded a128 outputs are not).
    std::int64_t largest = 0;
    for (const auto& w : want) largest = std::max<std::int64_t>(largest, w.rows * p.hidden * 2);
    const bool can_pull = buffer.transport().peer_window(r) != nullptr;
    const bool replies_first = spi::allows_replies_first(cfg) &&
                               (pool == 0 || !can_pull || static_cast<std::size_t>(largest) <= cfg.dataplane.replies_first_max_bytes);
    const RankViews v = views_of(p, r);
    DispatchResult d = buffer.dispatch(dispatch_args(v, c.d));
    expect_dispatch(r, p, c.d, want[ur], d);
    expect_output(r, buffer, layout, "fresh dispatch");
    const ref::Layout lay = ref::layout(p, r);
    expect_bits(r, "num_tokens_per_rank", d.layout.num_tokens_per_rank.data(), lay.num_tokens_per_rank);
    expect_bits(r, "num_tokens_per_expert", d.layout.num_tokens_per_expert.data(), lay.num_tokens_per_expert);
    expect_bits(r, "is_token_in_rank", d.layout.is_token_in_rank.data(), lay.is_token_in_rank);
    const DispatchLayout local = buffer.get_dispatch_layout(v.topk_idx);
    expect_bits(r, "get_dispatch_layout", local.is_token_in_rank.data(), lay.is_token_in_rank);

    CombineArgs ca;
    ca.y = TensorView(y[ur].data(), DType::kBF16, {want[ur].rows, p.hidden});
    ca.handle = &d.handle;
    ca.weighted = c.weighted;
    const std::int64_t S = p.ranks[ur].num_tokens;
    if (c.bias) {
      ca.bias0 = TensorView(b0[ur].data(), DType::kBF16, {S, p.hidden});
      ca.bias1 = TensorView(b1[ur].data(), DType::kBF16, {S, p.hidden});
    }
    const CombineResult out = buffer.combine(ca);
    expect_bits(r, "combined_x", out.combined_x.data(), combined[ur]);
    EXPECT_EQ(buffer.last_stats().data_first, replies_first) << "rank " << r;  // right after a dispatch: replies first
    expect_bits(r, "combine topk_weights", out.topk_weights.data(), p.ranks[ur].topk_weights);

    // Cached dispatch: same x gives the same bits; new x lands exactly where the
    // reference puts it for the same routing. Right after the combine its rows go before
    // the header exchange; right after a dispatch they wait for it.
    DispatchArgs cached = dispatch_args(v, c.d);
    cached.handle = &d.handle;
    expect_dispatch(r, p, c.d, want[ur], buffer.dispatch(cached));
    EXPECT_EQ(buffer.last_stats().data_first, first) << "rank " << r;
    expect_output(r, buffer, layout, "cached dispatch");
    cached.x = views_of(p2, r).x;
    DispatchResult d2 = buffer.dispatch(cached);
    expect_dispatch(r, p2, c.d, want2[ur], d2);
    EXPECT_FALSE(buffer.last_stats().data_first) << "rank " << r;
    expect_output(r, buffer, layout, "cached dispatch while the previous output is held", true);
    const CombineResult out2 = buffer.combine(ca);  // the first handle again
    expect_bits(r, "combined_x (second combine)", out2.combined_x.data(), combined[ur]);
    EXPECT_EQ(buffer.last_stats().data_first, replies_first) << "rank " << r;
    CombineArgs wide;
    wide.y = TensorView(y_wide[ur].data(), DType::kBF16, {want[ur].rows, p.hidden});
    wide.handle = &d.handle;
    wide.weighted = c.weighted;
    expect_bits(r, "combined_x (wide-range y)", buffer.combine(wide).combined_x.data(), combined_wide[ur]);

    // A fresh dispatch right after a combine goes rows first as well, each source's rows in
    // its own stretch of the receive area; its handle serves combine like any other.
    d2 = DispatchResult();  // its block goes back: the pool has room for two outputs again
    DispatchResult d3 = buffer.dispatch(dispatch_args(v, c.d));
    expect_dispatch(r, p, c.d, want[ur], d3);
    EXPECT_EQ(buffer.last_stats().data_first, first) << "rank " << r;
    expect_output(r, buffer, layout, "fresh dispatch after a combine");
    expect_dispatch(r, p, c.d, want[ur], d);  // every output held so far is still intact
    CombineArgs c3 = ca;
    c3.handle = &d3.handle;
    expect_bits(r, "combined_x (handle of a rows-first fresh dispatch)", buffer.combine(c3).combined_x.data(), combined[ur]);

    // Zero-copy: the compact output as a view of the window, fresh and cached; a combine
    // in between must leave it alone.
    if (!c.d.expanded) {
      DispatchArgs zc = dispatch_args(v, c.d);
      zc.recv_in_window = true;
      DispatchResult dz = buffer.dispatch(zc);
      expect_dispatch(r, p, c.d, want[ur], dz);
      CombineArgs cz = ca;
      cz.handle = &dz.handle;
      expect_bits(r, "combined_x (recv_in_window)", buffer.combine(cz).combined_x.data(), combined[ur]);
      EXPECT_FALSE(buffer.last_stats().data_first) << "rank " << r;  // views: the exchange decides push or pull
      expect_dispatch(r, p, c.d, want[ur], dz);
      zc.handle = &dz.handle;
      zc.x = views_of(p2, r).x;
      expect_dispatch(r, p2, c.d, want2[ur], buffer.dispatch(zc));
      // Every rank held a view of its receive area through that combine: the rows wait.
      EXPECT_FALSE(buffer.last_stats().data_first) << "rank " << r;
    }

    // Pull mode: the experts overwrite the zero-copy recv_x with y in place, and combine
    // reads every rank's rows where they lie (mapped transports; the simulator pushes).
    // Twice with different y (the second overwrite must wait for every reader of the
    // first), then once with rank 0's y elsewhere, which makes every rank push.
    if (!c.d.expanded && !p.fp8) {
      DispatchArgs zc = dispatch_args(v, c.d);
      zc.recv_in_window = true;
      DispatchResult dz = buffer.dispatch(zc);
      const std::size_t bytes = y[ur].size() * sizeof(std::uint16_t);
      auto* in_place = static_cast<std::uint16_t*>(dz.recv_x.data());
      CombineArgs pull = ca;
      pull.handle = &dz.handle;
      pull.y = TensorView(in_place, DType::kBF16, {want[ur].rows, p.hidden});
      const bool mapped = buffer.transport().peer_window(r) != nullptr;
      for (const auto* y_now : {&y, &y_wide, &y}) {
        if (bytes > 0) std::memcpy(in_place, (*y_now)[ur].data(), bytes);
        const auto& expected = y_now == &y_wide ? combined_wide[ur] : combined[ur];
        if (y_now == &y_wide) pull.bias0 = pull.bias1 = TensorView();
        else pull.bias0 = ca.bias0, pull.bias1 = ca.bias1;
        expect_bits(r, "combined_x (pull, y in place)", buffer.combine(pull).combined_x.data(), expected);
        EXPECT_EQ(buffer.last_stats().pulled, mapped) << "rank " << r;
      }
      CombineArgs mixed = pull;
      if (r == 0) mixed.y = ca.y;
      expect_bits(r, "combined_x (rank 0's y not in the window)", buffer.combine(mixed).combined_x.data(), combined[ur]);
      EXPECT_FALSE(buffer.last_stats().pulled) << "rank " << r;
      // The same with a one-copy recv_x (a block of the output pool) overwritten in place.
      DispatchResult d1 = buffer.dispatch(dispatch_args(v, c.d));
      expect_dispatch(r, p, c.d, want[ur], d1);
      const bool one_copy = buffer.last_stats().output == OutputKind::kOneCopy && want[ur].rows > 0;
      if (bytes > 0) std::memcpy(d1.recv_x.data(), y[ur].data(), bytes);
      CombineArgs pull1 = ca;
      pull1.handle = &d1.handle;
      pull1.y = d1.recv_x.view();
      expect_bits(r, "combined_x (pull, y over a one-copy recv_x)", buffer.combine(pull1).combined_x.data(), combined[ur]);
      if (one_copy) {  // right after its dispatch: replies first at these sizes, else pulled where mapped
        EXPECT_EQ(buffer.last_stats().data_first, replies_first) << "rank " << r;
        EXPECT_EQ(buffer.last_stats().pulled, mapped && pool != 0 && !replies_first) << "rank " << r;
      }
    }
  });
}

class DispatchCombine : public ::testing::TestWithParam<std::tuple<TestTransport, Case, std::int64_t>> {};

TEST_P(DispatchCombine, MatchesReferenceBitForBit) {
  const auto& [where, c, pool] = GetParam();
  run_case(where, c, pool);
}

INSTANTIATE_TEST_SUITE_P(AllTransports, DispatchCombine,
                         ::testing::Combine(::testing::ValuesIn(kConformanceTransports), ::testing::ValuesIn(cases()),
                                            ::testing::Values<std::int64_t>(-1, 0)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name() + "_" + std::get<1>(info.param).name +
                                  (std::get<2>(info.param) == 0 ? "_copy" : "");
                         });

// A receive area sized by the user below P·C rows (max_recv_rows) has no stretch per
// source: dispatches (copies: no output pool) exchange headers first, combines still put
// their replies first, and
// every result is exact. One row fewer than a rank receives fails every rank, naming it.
TEST(DispatchCombine, ReceiveAreaBelowPTimesC) {
  const ref::Problem p = ref::make_problem(fx(4, 16, 4, {20, 13, 0, 9}, 31));
  const auto want = ref::dispatch_all(p, {});
  std::vector<std::vector<std::uint16_t>> y;
  for (int r = 0; r < 4; ++r) y.push_back(ref::expert_fn(p, want[static_cast<std::size_t>(r)], {}));
  std::int64_t most = 0;
  int busiest = 0;
  for (int r = 0; r < 4; ++r)
    if (want[static_cast<std::size_t>(r)].rows > most) most = want[static_cast<std::size_t>(r)].rows, busiest = r;
  ASSERT_LT(most, 4 * max_tokens(p));
  for (const TestTransport& where : kConformanceTransports) {
    SCOPED_TRACE(where.name());
    launch_on(where, {4, where.kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      const int r = t.rank();
      const auto ur = static_cast<std::size_t>(r);
      BufferConfig cfg = config_for(p);
      cfg.max_recv_rows = most;
      cfg.output_pool_bytes = 0;  // copies: combines may go replies first
      Buffer buffer(t, cfg);
      const RankViews v = views_of(p, r);
      CombineArgs ca;
      ca.y = TensorView(y[ur].data(), DType::kBF16, {want[ur].rows, p.hidden});
      const std::vector<std::uint16_t> combined = ref::combine(p, {}, want, y, nullptr, nullptr, false, r);
      DispatchArgs args = dispatch_args(v, {});
      DispatchHandle kept;
      for (int round = 0; round < 3; ++round) {  // fresh, fresh, cached: each right after a combine but the first
        DispatchResult d = buffer.dispatch(args);
        expect_dispatch(r, p, {}, want[ur], d);
        EXPECT_FALSE(buffer.last_stats().data_first) << "rank " << r << ", round " << round;
        if (round == 1) kept = d.handle, args.handle = &kept;
        ca.handle = &d.handle;
        expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), combined);
        EXPECT_TRUE(buffer.last_stats().data_first) << "rank " << r << ", round " << round;
      }
    });
    launch_on(where, {4, where.kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      BufferConfig cfg = config_for(p);
      cfg.max_recv_rows = most - 1;
      Buffer buffer(t, cfg);
      try {
        buffer.dispatch(dispatch_args(views_of(p, t.rank()), {}));
        fail(t.rank(), "a receive area one row short was accepted");
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kCapacityExceeded) << e.what();
        EXPECT_EQ(e.origin_rank(), busiest) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(busiest)), std::string::npos) << e.what();
      }
    });
  }
}

// With the output pool, a combine right after its dispatch pushes its replies before the
// exchange (one synchronisation) when every rank's dispatch output is at most
// replies_first_max_bytes, and exchanges first — pulling y in place, on mapped transports —
// when one is bigger; both give the reference's bits, and the limit is agreed at construction.
TEST(DispatchCombine, SmallCombinesGoRepliesFirstWithThePool) {
  const ref::Problem p = ref::make_problem(fx(4, 16, 4, {20, 13, 0, 9}, 43));
  ref::DispatchOptions compact;
  const auto want = ref::dispatch_all(p, compact);
  std::vector<std::vector<std::uint16_t>> y;
  for (int r = 0; r < 4; ++r) y.push_back(ref::expert_fn(p, want[static_cast<std::size_t>(r)], compact));
  std::int64_t largest = 0;  // the biggest dispatch output, in bytes
  for (const auto& w : want) largest = std::max<std::int64_t>(largest, w.rows * p.hidden * 2);
  for (const std::size_t limit : {static_cast<std::size_t>(largest), static_cast<std::size_t>(largest) - 1}) {
    launch({4, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      const int r = t.rank();
      const auto ur = static_cast<std::size_t>(r);
      BufferConfig cfg = config_for(p);
      cfg.dataplane.replies_first_max_bytes = limit;
      Buffer buffer(t, cfg);
      DispatchResult d = buffer.dispatch(dispatch_args(views_of(p, r), compact));
      if (!y[ur].empty()) std::memcpy(d.recv_x.data(), y[ur].data(), y[ur].size() * sizeof(std::uint16_t));
      CombineArgs ca;
      ca.y = d.recv_x.view();  // y over the one-copy recv_x: pullable where the combine exchanges first
      ca.handle = &d.handle;
      const auto combined = ref::combine(p, compact, want, y, nullptr, nullptr, false, r);
      expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), combined);
      const bool small = limit == static_cast<std::size_t>(largest);
      EXPECT_EQ(buffer.last_stats().data_first, small) << "rank " << r << ", limit " << limit;
      EXPECT_EQ(buffer.last_stats().pulled, !small) << "rank " << r << ", limit " << limit;
    });
  }
  try {  // a limit that differs between ranks would split them between the two paths
    launch({4, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      BufferConfig cfg = config_for(p);
      if (t.rank() == 2) cfg.dataplane.replies_first_max_bytes = 1;
      Buffer buffer(t, cfg);
    });
    ADD_FAILURE() << "ranks with different replies_first_max_bytes made a buffer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replies_first_max_bytes"), std::string::npos) << e.what();
  }
}

// One-copy outputs are the caller's: a Buffer's outputs (blocks of its output pool) stay
// exact across any number of later calls — fresh, cached, compact, expanded, FP8, combines
// reading them in place — while the caller holds them. When the pool has no room for the
// next output, that output is a copy and the stats say so; once the caller drops what it
// holds (from another thread), outputs are one copy again.
TEST(DispatchCombine, HeldOutputsStayExactAndThePoolFallsBackToCopies) {
  const ref::Problem p = ref::make_problem(fx(4, 16, 4, {20, 13, 0, 9}, 41));
  ref::FixtureOptions f8 = fx(4, 16, 4, {20, 13, 0, 9}, 41);
  f8.fp8 = true;
  const ref::Problem pf = ref::make_problem(f8);
  ref::DispatchOptions compact, expanded;
  expanded.expanded = true;
  expanded.alignment = 4;
  const auto want_c = ref::dispatch_all(p, compact), want_e = ref::dispatch_all(p, expanded), want_f = ref::dispatch_all(pf, compact);
  ref::Problem p2 = p;  // the same routing, new x (cached dispatches)
  for (int r = 0; r < 4; ++r)
    p2.ranks[static_cast<std::size_t>(r)].x = ref::random_bf16(900 + static_cast<std::uint64_t>(r), p.ranks[static_cast<std::size_t>(r)].num_tokens * p.hidden);
  const auto want_c2 = ref::dispatch_all(p2, compact);
  std::vector<std::vector<std::uint16_t>> y;
  for (int r = 0; r < 4; ++r) y.push_back(ref::expert_fn(p, want_c[static_cast<std::size_t>(r)], compact));
  for (const TestTransport& where : std::vector<TestTransport>{{TransportKind::kThreads}, {TransportKind::kShm}}) {
    SCOPED_TRACE(where.name());
    launch_on(where, {4, where.kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      const int r = t.rank();
      const auto ur = static_cast<std::size_t>(r);
      BufferConfig cfg = config_for(p);  // the default output pool: one output of the largest size
      cfg.dataplane.replies_first_max_bytes = 0;  // a combine right after its dispatch pulls (not replies first)
      Buffer buffer(t, cfg);
      struct Held {
        DispatchResult d;
        const ref::Problem* p;
        ref::DispatchOptions o;
        const ref::DispatchOut* want;
      };
      std::vector<Held> held;
      int one_copy = 0, exhausted = 0, expanded_one_copy = 0;
      auto dispatch = [&](const ref::Problem& q, const ref::DispatchOptions& o, const ref::DispatchOut& want,
                          const DispatchHandle* handle) -> DispatchResult& {
        DispatchArgs a = dispatch_args(views_of(q, r), o);
        a.handle = handle;
        held.push_back({buffer.dispatch(a), &q, o, &want});
        const CallStats& st = buffer.last_stats();
        expect_dispatch(r, q, o, want, held.back().d);
        if (o.expanded && st.output == OutputKind::kOneCopy) {  // the senders put each row at its slots' rows
          ++expanded_one_copy;
          if (st.epilogue_copy_bytes != 0) fail(r, "a one-copy expanded output whose epilogue copied bytes");
        } else if (st.output == OutputKind::kOneCopy) {
          ++one_copy;
          if (st.epilogue_copy_bytes != 0) fail(r, "a one-copy output whose epilogue copied bytes");
        } else if (st.output == OutputKind::kCopy && std::string(st.output_why) == "output pool exhausted") {
          ++exhausted;
          if (st.epilogue_copy_bytes == 0) fail(r, "an output the stats call a copy, but the epilogue copied nothing");
        } else {
          fail(r, std::string("unexpected output kind ") + to_string(st.output) + " (" + st.output_why + ")");
        }
        return held.back().d;
      };
      dispatch(p, expanded, want_e[ur], nullptr);  // into the empty pool: one copy, a row per slot
      for (int round = 0; round < 4; ++round) {
        DispatchResult& fresh = dispatch(p, compact, want_c[ur], nullptr);
        const DispatchHandle h = fresh.handle;
        dispatch(p2, compact, want_c2[ur], &h);
        dispatch(p, expanded, want_e[ur], nullptr);
        const DispatchHandle hf = dispatch(pf, compact, want_f[ur], nullptr).handle;
        dispatch(pf, compact, want_f[ur], &hf);
        CombineArgs c;
        c.y = TensorView(y[ur].data(), DType::kBF16, {want_c[ur].rows, p.hidden});
        c.handle = &h;
        expect_bits(r, "combined_x", buffer.combine(c).combined_x.data(),
                    ref::combine(p, compact, want_c, y, nullptr, nullptr, false, r));
      }
      // Every held output, bit for bit, after all those calls.
      for (const Held& x : held) expect_dispatch(r, *x.p, x.o, *x.want, x.d);
      if (one_copy == 0) fail(r, "no output was one copy");
      if (expanded_one_copy == 0) fail(r, "no expanded output was one copy");
      if (exhausted == 0) fail(r, "holding 16 compact outputs never exhausted the output pool");
      // Dropped on another thread, every block returns: the next outputs are one copy again.
      std::thread([&] { held.clear(); }).join();
      for (int i = 0; i < 2; ++i) {
        one_copy = exhausted = 0;
        dispatch(p, compact, want_c[ur], nullptr);
        if (one_copy != 1) fail(r, "after every output was dropped, a dispatch was not one copy");
        held.clear();
      }
      // A hole too small for the next output: hold bf16, FP8, bf16 outputs, drop the FP8
      // one (its block is smaller than a bf16 output's); the next bf16 dispatch must not
      // spill out of the hole into the output after it.
      dispatch(p, compact, want_c[ur], nullptr);
      DispatchResult& small = dispatch(pf, compact, want_f[ur], nullptr);
      dispatch(p, compact, want_c[ur], nullptr);
      small = DispatchResult();
      one_copy = exhausted = 0;
      dispatch(p, compact, want_c[ur], nullptr);
      for (const Held& x : held)
        if (x.d.recv_x.defined()) expect_dispatch(r, *x.p, x.o, *x.want, x.d);
      held.clear();
      // An output and the combine that reads it in place (its y) after the Buffer is used
      // for more calls: still exact.
      DispatchResult& kept = dispatch(p, compact, want_c[ur], nullptr);
      const std::size_t bytes = y[ur].size() * sizeof(std::uint16_t);
      if (bytes > 0) std::memcpy(kept.recv_x.data(), y[ur].data(), bytes);
      CombineArgs in_place;
      in_place.y = kept.recv_x.view();
      in_place.handle = &kept.handle;
      const std::vector<std::uint16_t> combined = ref::combine(p, compact, want_c, y, nullptr, nullptr, false, r);
      expect_bits(r, "combined_x (y over the one-copy recv_x)", buffer.combine(in_place).combined_x.data(), combined);
      if (buffer.last_stats().pulled != (buffer.transport().peer_window(r) != nullptr)) fail(r, "y in the output pool was not pulled in place");
      dispatch(p, expanded, want_e[ur], nullptr);
      expect_bits(r, "recv_x held across a combine and a dispatch (now y)", kept.recv_x.data(), y[ur]);
    });
  }
}

// zero_padding (docs/spec.md §3.2): asked for, padding rows of recv_x are zero bits even in a
// recycled output block that held other bytes; not asked for, their bytes are unspecified
// and everything else is still exact.
TEST(DispatchCombine, ZeroPaddingOnlyWhenAsked) {
  const ref::Problem p = ref::make_problem(fx(4, 16, 4, {20, 13, 0, 9}, 33));
  ref::DispatchOptions o;
  o.expanded = true;
  o.alignment = 8;
  o.worst = 4 * max_tokens(p) * 4;
  const auto want = ref::dispatch_all(p, o);
  launch_on({TransportKind::kThreads}, {4, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    const int r = t.rank();
    const auto ur = static_cast<std::size_t>(r);
    Buffer buffer(t, config_for(p));
    DispatchArgs a = dispatch_args(views_of(p, r), o);
    const std::size_t row = static_cast<std::size_t>(p.hidden);
    for (int round = 0; round < 3; ++round) {
      a.zero_padding = round == 2;
      DispatchResult d = buffer.dispatch(a);
      auto* x = d.recv_x.as<std::uint16_t>();
      std::int64_t padding = 0;
      for (std::int64_t i = 0; i < want[ur].rows; ++i) {
        const bool pad = want[ur].recv_src[static_cast<std::size_t>(i) * 3] < 0;
        padding += pad;
        if (pad && !a.zero_padding) continue;  // unspecified
        if (std::memcmp(x + static_cast<std::size_t>(i) * row, want[ur].recv_x.data() + static_cast<std::size_t>(i) * row,
                        row * sizeof(std::uint16_t)) != 0)
          fail(r, "recv_x row " + std::to_string(i) + (pad ? " (padding, zero_padding on)" : "") + " differs, round " +
                      std::to_string(round));
      }
      if (padding == 0) fail(r, "the case has no padding rows");
      expect_bits(r, "recv_src", d.recv_src.data(), want[ur].recv_src);
      expect_bits(r, "recv_weights", d.recv_weights.data(), want[ur].recv_weights);
      // Dirty the whole block before it goes back to the pool: the next call may get it.
      std::memset(x, 0xab, static_cast<std::size_t>(d.recv_x.nbytes()));
    }
  });
}

// Zero padding is the default, and a cached dispatch keeps its handle's choice: with a
// handle whose dispatch padded, its padding rows are zero though this call says false and
// its output block is a recycled one full of other bytes.
TEST(DispatchCombine, ZeroPaddingByDefaultAndKeptByCachedDispatch) {
  static_assert(DispatchArgs{}.zero_padding, "padding rows are zero unless the caller opts out");
  const ref::Problem p = ref::make_problem(fx(4, 16, 4, {20, 13, 0, 9}, 34));
  ref::DispatchOptions o;
  o.expanded = true;
  o.alignment = 8;
  const auto want = ref::dispatch_all(p, o);
  launch_on({TransportKind::kThreads}, {4, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    const int r = t.rank();
    const auto ur = static_cast<std::size_t>(r);
    Buffer buffer(t, config_for(p));
    DispatchArgs a = dispatch_args(views_of(p, r), o);
    a.zero_padding = true;
    DispatchHandle h;
    {
      DispatchResult d = buffer.dispatch(a);
      h = d.handle;
      std::memset(d.recv_x.data(), 0xab, static_cast<std::size_t>(d.recv_x.nbytes()));  // back to the pool dirty
    }
    DispatchArgs c = a;
    c.handle = &h;
    c.zero_padding = false;
    DispatchResult d = buffer.dispatch(c);
    expect_bits(r, "cached recv_x (padding rows zero as the handle's)", d.recv_x.data(), want[ur].recv_x);
  });
}

// Deterministic mode: the same inputs give the same bits across independent runs.
TEST(DispatchCombine, RepeatedRunsAreIdentical) {
  Case c{"repeat", fx(4, 16, 4, {20, 13, 0, 9}, 40), {}};
  c.d.expanded = true;
  c.d.alignment = 8;
  for (int i = 0; i < 3; ++i) run_case({TransportKind::kShm}, c, -1);
}

}  // namespace
}  // namespace epx::testing
