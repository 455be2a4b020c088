// Redundant experts at work (epx/lb.hpp) on P ranks of every transport: prefetch lands the
// exact bytes at every replica slot, reduce equals a plain loop bit for bit, and a forward +
// backward of a linear expert through dynamically planned replicas gives the same expert
// gradients as without replicas.
#include <gtest/gtest.h>

#include <cstring>

#include "epx/lb.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

using std::size_t;
size_t at(std::int64_t i) { return static_cast<size_t>(i); }

constexpr int kP = 4, kL = 3, kB = 3;
// Several kinds, none a multiple of the row (2 * H = 128 bytes), one empty.
const std::vector<size_t> kKindBytes = {1000, 77, 0, 4099};

// Slot placement: expert 0 on three ranks (more than K = 2 destinations), expert 4 twice on
// rank 0 and once on rank 3, expert 11 on its own home rank, unused slots, and experts with
// no replica at all.
const std::vector<std::int64_t> kMapping = {4, 4, 0,    // rank 0
                                            0, -1, 7,   // rank 1
                                            -1, 0, -1,  // rank 2
                                            11, 4, 2};  // rank 3

std::uint8_t weight_byte(std::int64_t expert, size_t kind, size_t i) {
  return static_cast<std::uint8_t>((expert * 131 + kind * 29 + i * 7 + (i >> 8)) & 0xff);
}

BufferConfig lb_config(std::int64_t max_tokens, int topk) {
  BufferConfig c;
  c.num_experts = kP * 2;
  c.hidden = 64;
  c.num_topk = topk;
  c.max_tokens_per_rank = max_tokens;
  c.num_workers = 1;
  return c;
}

struct RankWeights {
  std::vector<std::vector<std::uint8_t>> home, slots;
  std::vector<ExpertTensors> home_t, slot_t;
};
RankWeights make_weights(int r, const std::vector<size_t>& kinds, int L, int B) {
  RankWeights w;
  for (size_t k = 0; k < kinds.size(); ++k) {
    w.home.emplace_back(kinds[k] * at(L));
    for (int i = 0; i < L; ++i)
      for (size_t j = 0; j < kinds[k]; ++j) w.home[k][at(i) * kinds[k] + j] = weight_byte(std::int64_t{r} * L + i, k, j);
    w.slots.emplace_back(kinds[k] * at(B), std::uint8_t{0xA5});  // sentinel: unused slots keep it
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    w.home_t.push_back({w.home[k].data(), kinds[k]});
    w.slot_t.push_back({w.slots[k].data(), kinds[k]});
  }
  return w;
}

void check_slots(int r, const RankWeights& w, const std::vector<size_t>& kinds, const std::vector<std::int64_t>& mapping,
                 int B) {
  for (int b = 0; b < B; ++b) {
    const std::int64_t e = mapping[at(r) * at(B) + at(b)];
    for (size_t k = 0; k < kinds.size(); ++k)
      for (size_t j = 0; j < kinds[k]; ++j) {
        const std::uint8_t want = e < 0 ? std::uint8_t{0xA5} : weight_byte(e, k, j);
        if (w.slots[k][at(b) * kinds[k] + j] != want)
          fail(r, "slot " + std::to_string(b) + " (expert " + std::to_string(e) + ") kind " + std::to_string(k) + " byte " +
                      std::to_string(j) + ": got " + std::to_string(w.slots[k][at(b) * kinds[k] + j]) + ", want " +
                      std::to_string(want));
      }
  }
}

TEST(Lb, TransferTableCoversEveryRowOnce) {
  LbPlacement pl{kL, kB, kMapping};
  const size_t bytes = 5176;
  const LbTransfer pre = plan_lb_transfer(LbDirection::kToReplicas, pl, kP, bytes, 128, 2, 16);
  EXPECT_EQ(pre.rows_per_expert, 41);
  // Every (expert, row, rank holding it) exactly once; at most T tokens per rank and round.
  std::vector<int> seen(at(kP * kL) * 41 * kP, 0);
  for (int s = 0; s < kP; ++s)
    for (int r = 0; r < pre.rounds; ++r) {
      EXPECT_LE(pre.end(s, r) - pre.begin(s, r), 16);
      for (std::int64_t t = pre.begin(s, r); t < pre.end(s, r); ++t) {
        const LbToken& tok = pre.tokens[at(t)];
        EXPECT_EQ(tok.item / kL, s);
        EXPECT_LE(tok.num_dests, 2);
        for (int k = 0; k < tok.num_dests; ++k) ++seen[(at(tok.item) * 41 + at(tok.row)) * kP + at(pre.dests[at(tok.first_dest + k)])];
      }
    }
  for (std::int64_t e = 0; e < kP * kL; ++e)
    for (int d = 0; d < kP; ++d) {
      bool holds = false;
      for (int b = 0; b < kB; ++b) holds |= kMapping[at(d * kB + b)] == e;
      for (int c = 0; c < 41; ++c) EXPECT_EQ(seen[(at(e) * 41 + at(c)) * kP + at(d)], holds ? 1 : 0) << e << " " << d << " " << c;
    }
  const LbTransfer red = plan_lb_transfer(LbDirection::kToHome, pl, kP, bytes, 128, 2, 16);
  std::int64_t used = 0;
  for (std::int64_t m : kMapping) used += m >= 0;
  EXPECT_EQ(static_cast<std::int64_t>(red.tokens.size()), used * 41);
  EXPECT_EQ(red.wire_bytes(), used * 41 * 128);
  EXPECT_THROW(plan_lb_transfer(LbDirection::kToHome, {kL, kB, {1, 2}}, kP, bytes, 128, 2, 16), Error);
  EXPECT_THROW(plan_lb_transfer(LbDirection::kToHome, {kL, 1, {0, 0, 0, 12}}, kP, bytes, 128, 2, 16), Error);
}

TEST(Lb, PrefetchLandsExactBytesAtEveryReplica) {
  for (TransportKind kind : kDataTransports) {
    launch({kP, kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      const int r = t.rank();
      Buffer buffer(t, lb_config(16, 2));  // 16 tokens per round: several rounds
      RankWeights w = make_weights(r, kKindBytes, kL, kB);
      prefetch_weights(buffer, w.slot_t, w.home_t, {kL, kB, kMapping});
      check_slots(r, w, kKindBytes, kMapping, kB);
      // No slots at all: one empty round, nothing written.
      RankWeights v = make_weights(r, {300, 5}, kL, kB);
      prefetch_weights(buffer, v.slot_t, v.home_t, {kL, 0, {}});
      check_slots(r, v, {300, 5}, std::vector<std::int64_t>(kMapping.size(), -1), kB);
    });
  }
  // Every receive mode of the Buffer: a bounded ring (a copy), the flag protocol, and a
  // receive area of 10 rows (2 tokens per rank and round: many rounds).
  for (int mode = 0; mode < 3; ++mode) {
    launch({kP, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      BufferConfig c = lb_config(16, 2);
      if (mode == 0) c.ring_rows = 8;
      if (mode == 1) c.dataplane.protocol = Protocol::kFlag;
      if (mode == 2) c.max_recv_rows = 10;
      Buffer buffer(t, c);
      RankWeights w = make_weights(t.rank(), kKindBytes, kL, kB);
      prefetch_weights(buffer, w.slot_t, w.home_t, {kL, kB, kMapping});
      check_slots(t.rank(), w, kKindBytes, kMapping, kB);
    });
  }
}

// Async on the threads transport (the ThreadSanitizer run picks "threads" names): issue, do
// other work, wait; then a second async call whose error comes out of wait().
TEST(Lb, threads_PrefetchAsyncCompletesOnWait) {
  launch({kP, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    const int r = t.rank();
    Buffer buffer(t, lb_config(16, 2));
    RankWeights v = make_weights(r, {300, 5}, kL, kB);
    LbEvent ev = prefetch_weights_async(buffer, v.slot_t, v.home_t, {kL, kB, kMapping});
    std::vector<std::uint8_t> other(1 << 16, 1);  // the caller's own work meanwhile
    for (auto& b : other) b = static_cast<std::uint8_t>(b * 3 + 1);
    ev.wait();
    check_slots(r, v, {300, 5}, kMapping, kB);
    std::vector<ExpertTensors> wrong = v.slot_t;
    wrong.pop_back();  // kinds differ on every rank: every rank's wait() throws
    LbEvent bad = prefetch_weights_async(buffer, wrong, v.home_t, {kL, kB, kMapping});
    try {
      bad.wait();
    } catch (const Error& e) {
      if (std::string(e.what()).find("kinds") == std::string::npos && e.origin_rank() == r) fail(r, e.what());
      return;
    }
    fail(r, "no error from wait()");
  });
}

TEST(Lb, BadArgumentsFailOnEveryRank) {
  launch({kP, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    const int r = t.rank();
    Buffer buffer(t, lb_config(16, 2));
    RankWeights w = make_weights(r, kKindBytes, kL, kB);
    std::vector<std::int64_t> m = kMapping;
    if (r == 2) m[0] = 99;  // rank 2 alone is wrong
    try {
      prefetch_weights(buffer, w.slot_t, w.home_t, {kL, kB, m});
    } catch (const Error& e) {
      if (e.origin_rank() != 2) fail(r, std::string("origin rank should be 2: ") + e.what());
      if (r == 2 && std::string(e.what()).find("mapping") == std::string::npos) fail(r, e.what());
      return;
    }
    fail(r, "no error");
  });
}

// Float32 values whose exponents span 2^-30..2^30: their sums depend on the order.
float wide_float(std::uint64_t seed) {
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
  s ^= s >> 31;
  s *= 0xbf58476d1ce4e5b9ull;
  s ^= s >> 29;
  const auto bits = static_cast<std::uint32_t>(s);
  const std::uint32_t f = ((bits & 1u) << 31) | ((127 - 30 + (bits >> 1) % 61) << 23) | ((bits >> 8) & 0x7fffffu);
  float v;
  std::memcpy(&v, &f, 4);
  return v;
}

TEST(Lb, ReduceEqualsAPlainLoopBitForBit) {
  const std::vector<size_t> kinds = {4 * 70, 4 * 33};  // float32, not multiples of the row
  const auto grad = [&](bool home, std::int64_t who, size_t k, size_t i) {
    return wide_float((home ? 1u : 2u) * 1000003u + static_cast<std::uint64_t>(who) * 7919u + k * 104729u + i);
  };
  // Reference: home[i] = ((home[i] + g_0[i]) + g_1[i]) ... over ascending global slots.
  std::vector<std::vector<float>> want(at(kP * kL) * kinds.size());
  for (std::int64_t e = 0; e < kP * kL; ++e)
    for (size_t k = 0; k < kinds.size(); ++k) {
      auto& v = want[at(e) * kinds.size() + k];
      for (size_t i = 0; i < kinds[k] / 4; ++i) v.push_back(grad(true, e, k, i));
      for (size_t g = 0; g < kMapping.size(); ++g)
        if (kMapping[g] == e)
          for (size_t i = 0; i < v.size(); ++i) v[i] = v[i] + grad(false, static_cast<std::int64_t>(g), k, i);
    }
  for (TransportKind kind : kDataTransports) {
    launch({kP, kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      const int r = t.rank();
      Buffer buffer(t, lb_config(7, 1));  // K = 1, 7 tokens per round
      std::vector<std::vector<float>> home(kinds.size()), slots(kinds.size());
      std::vector<ExpertTensors> ht, st;
      for (size_t k = 0; k < kinds.size(); ++k) {
        const size_t n = kinds[k] / 4;
        for (int i = 0; i < kL; ++i)
          for (size_t j = 0; j < n; ++j) home[k].push_back(grad(true, std::int64_t{r} * kL + i, k, j));
        for (int b = 0; b < kB; ++b)
          for (size_t j = 0; j < n; ++j) slots[k].push_back(grad(false, std::int64_t{r} * kB + b, k, j));
        ht.push_back({home[k].data(), kinds[k]});
        st.push_back({slots[k].data(), kinds[k]});
      }
      reduce_grads(buffer, st, ht, {kL, kB, kMapping});
      for (int i = 0; i < kL; ++i)
        for (size_t k = 0; k < kinds.size(); ++k) {
          const auto& v = want[at(std::int64_t{r} * kL + i) * kinds.size() + k];
          expect_bits(r, "expert " + std::to_string(r * kL + i) + " kind " + std::to_string(k),
                      home[k].data() + at(i) * v.size(), v);
        }
    });
  }
}

// A linear expert y = W x (W [O, H] float32) through dynamically planned replicas: forward
// with the prefetched weights, backward dW = sum over its rows of y x^T (loss 0.5 |y|^2),
// reduce_grads home. Small integers: every float32 sum is exact, so the gradients with
// replicas equal those without bit for bit; and each rank receives exactly the planned rows.
TEST(Lb, ForwardBackwardThroughReplicasGivesTheSameGradients) {
  constexpr int P = 4, L = 2, B = 2, H = 16, O = 4, K = 3, E = P * L;
  ref::FixtureOptions f;
  f.num_ranks = P;
  f.num_experts = E;
  f.num_topk = K;
  f.hidden = H;
  f.tokens = 40;
  f.zipf = 1.3;
  f.seed = 5;
  ref::Problem prob = ref::make_problem(f);
  std::vector<std::int64_t> counts;
  for (int r = 0; r < P; ++r) {
    auto c = count_expert_slots(prob.ranks[at(r)].topk_idx, E);
    counts.insert(counts.end(), c.begin(), c.end());
  }
  const DynamicReplicaPlan plan = plan_dynamic_replicas(counts, P, L, B);
  ASSERT_GT(plan.replicas_used, 0);
  ASSERT_LT(plan.imbalance_with, plan.imbalance_without);
  const auto small = [](std::int64_t a, std::int64_t b) { return static_cast<float>(((a * 7 + b * 3) % 5) - 2); };
  for (auto& rk : prob.ranks)  // x: small integers in bf16 (exact)
    for (size_t i = 0; i < rk.x.size(); ++i) {
      const float v = small(static_cast<std::int64_t>(i), rk.num_tokens);
      std::uint32_t u;
      std::memcpy(&u, &v, 4);
      rk.x[i] = static_cast<std::uint16_t>(u >> 16);
    }

  for (TransportKind kind : kTransports) {
    launch({P, kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      const int r = t.rank();
      BufferConfig c;
      c.num_experts = P * (L + B);
      c.hidden = H;
      c.num_topk = K;
      c.max_tokens_per_rank = f.tokens;
      c.num_workers = 1;
      Buffer buffer(t, c);
      std::vector<float> w_home(at(L) * O * H), w_slots(at(B) * O * H, 0.0f);
      for (int i = 0; i < L; ++i)
        for (int j = 0; j < O * H; ++j) w_home[at(i) * O * H + at(j)] = small(r * L + i, j) + 1.0f;
      const size_t wb = O * H * 4;
      prefetch_weights(buffer, {{w_slots.data(), wb}}, {{w_home.data(), wb}}, plan.placement);

      const auto run = [&](bool replicas) {
        const auto& logical = prob.ranks[at(r)].topk_idx;
        std::vector<std::int64_t> phys(logical.size(), -1);
        if (replicas) {
          phys = route_through_replicas(plan, r, logical, K);
        } else {
          for (size_t i = 0; i < logical.size(); ++i)
            if (logical[i] >= 0) phys[i] = (logical[i] / L) * (L + B) + logical[i] % L;
        }
        RankViews v = views_of(prob, r);
        DispatchArgs a;
        a.x = v.x;
        a.topk_idx = TensorView(phys.data(), DType::kI64, {prob.ranks[at(r)].num_tokens, K});
        a.topk_weights = v.topk_weights;
        a.layout = RecvLayout::kExpanded;
        DispatchResult d = buffer.dispatch(a);
        std::int64_t rows = 0;
        for (std::int64_t n : d.num_recv_tokens_per_expert) rows += n;
        if (replicas && rows != plan.rows_with[at(r)]) fail(r, "rows received differ from the plan's rows_with");
        if (!replicas && rows != plan.rows_without[at(r)]) fail(r, "rows received differ from the plan's rows_without");
        std::vector<float> g_home(at(L) * O * H, 0.0f), g_slots(at(B) * O * H, 0.0f);
        const auto* xr = d.recv_x.as<std::uint16_t>();
        for (int j = 0; j < L + B; ++j) {
          const float* W = j < L ? &w_home[at(j) * O * H] : &w_slots[at(j - L) * O * H];
          float* G = j < L ? &g_home[at(j) * O * H] : &g_slots[at(j - L) * O * H];
          for (std::int64_t row = d.expert_offsets[at(j)]; row < d.expert_offsets[at(j)] + d.num_recv_tokens_per_expert[at(j)]; ++row) {
            float x[H];
            for (int h = 0; h < H; ++h) {
              const std::uint32_t u = std::uint32_t{xr[row * H + h]} << 16;
              std::memcpy(&x[h], &u, 4);
            }
            for (int o = 0; o < O; ++o) {
              float y = 0;
              for (int h = 0; h < H; ++h) y += W[o * H + h] * x[h];
              for (int h = 0; h < H; ++h) G[o * H + h] += y * x[h];
            }
          }
        }
        if (replicas) reduce_grads(buffer, {{g_slots.data(), wb}}, {{g_home.data(), wb}}, plan.placement);
        return g_home;
      };
      const std::vector<float> with = run(true), without = run(false);
      expect_bits(r, "home expert gradients with replicas vs without", with.data(), without);
      bool nonzero = false;
      for (float g : with) nonzero |= g != 0.0f;
      if (!nonzero && plan.rows_without[at(r)] > 0) fail(r, "all gradients are zero");
    });
  }
}

}  // namespace
}  // namespace epx::testing
