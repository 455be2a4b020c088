// The bucket collectives' test cases, shared by tests/multirank/bucket_test.cpp and the
// multi-machine rank program (tests/multinode/bucket_rank.cpp): DeepEP-style sizes, 1-8
// tensors, every group, scales {1, 0, 0.25, -0.5, 2}; run_case checks the whole storage
// bit for bit against tests/reference/bucket_reference.hpp (outputs) and a snapshot (every
// other byte: the guards around and between the tensors, the other shards).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "epx/bucket.hpp"
#include "reference/bucket_reference.hpp"

namespace epx::testing::bucket {

// Under the sanitizers (CI's sanitize job: ThreadSanitizer on the threads transport, ASan on
// all) the suites run three of the six size sets: the same paths, a fraction of the time.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

enum class Op { kAllGather, kReduceScatter, kAllReduce };

inline const char* name(Op op) { return op == Op::kAllGather ? "all_gather" : op == Op::kReduceScatter ? "reduce_scatter" : "all_reduce"; }

inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Element e of tensor t on world rank r: signs and exponents from 2^-12 to 2^12, so that
/// a sum in another order than the members' rounds differently.
inline float input(std::uint64_t seed, int r, int t, std::int64_t e) {
  const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(r) << 40 ^ static_cast<std::uint64_t>(t) << 32 ^
                                         static_cast<std::uint64_t>(e)));
  const float mant = 1.0f + static_cast<float>(h & 0xffffff) / 16777216.0f;
  const int ex = static_cast<int>((h >> 24) % 25) - 12;
  return ((h >> 40) & 1 ? -1.0f : 1.0f) * std::ldexp(mant, ex);
}

inline std::uint8_t input_byte(std::uint64_t seed, int r, int t, std::int64_t e) {
  return static_cast<std::uint8_t>(mix(seed * 31 + static_cast<std::uint64_t>(r * 977 + t) * 1000003 + static_cast<std::uint64_t>(e)));
}

struct Case {
  Op op = Op::kAllReduce;
  int group = 0;
  std::vector<std::int64_t> numels;  ///< per tensor (float32 elements; all_gather: bytes of a src)
  float scale = 1.0f;
  bool bf16 = false;
  bool dsts = false;            ///< all_gather into separate dsts
  bool srcs_outside = false;    ///< all_gather's srcs in private memory (with dsts)
  std::uint64_t seed = 1;
};

inline std::string describe(const Case& c) {
  std::ostringstream s;
  s << name(c.op) << " group " << c.group << " scale " << c.scale << (c.bf16 ? " bf16" : "") << (c.dsts ? " dsts" : "")
    << (c.srcs_outside ? " srcs outside" : "") << " numels";
  for (auto n : c.numels) s << ' ' << n;
  return s.str();
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

/// Where a case's tensors lie in the storage: 64-byte guards between them, and a shift that
/// differs per rank (offsets need not be the same on every member).
struct Placement {
  std::vector<std::size_t> in, out;  ///< byte offsets
  std::size_t end = 0;
};

inline Placement place(const Case& c, int n, int world_rank) {
  Placement p;
  std::size_t at = 64 + static_cast<std::size_t>(world_rank % 3) * 64;
  for (std::int64_t numel : c.numels) {
    const std::size_t bytes = static_cast<std::size_t>(numel) * (c.op == Op::kAllGather ? 1 : 4);
    const std::size_t whole = c.op == Op::kAllGather ? bytes * static_cast<std::size_t>(n) : bytes;
    p.in.push_back(at);
    p.out.push_back(at);
    at += (whole + 63) / 64 * 64 + 64;
    if (c.dsts) {
      p.out.back() = at;
      at += (whole + 63) / 64 * 64 + 64;
    }
  }
  p.end = at;
  return p;
}

/// Runs case `c` on this rank and checks the storage bit for bit (and, unless kNone, that
/// the call ran `want`).
inline void run_case(BucketBuffer& b, const Case& c, BucketAlgorithm algo = BucketAlgorithm::kNone) {
  const std::vector<int>& members = b.group_ranks(c.group);
  const int me = b.group_rank(c.group);
  if (me < 0) return;
  const int n = static_cast<int>(members.size());
  const int r = b.rank();
  const Placement p = place(c, n, r);
  expect(p.end <= b.num_bytes(), "storage too small for " + describe(c));
  // The bytes checked: the case's tensors and guards, and 64 KiB past them (a stray write).
  const std::size_t checked = std::min(b.num_bytes(), p.end + (std::size_t{64} << 10));
  std::byte* s = b.storage();
  for (std::size_t i = 0; i < checked; ++i) s[i] = static_cast<std::byte>(0xA5 ^ (i * 7));
  std::vector<std::vector<std::uint8_t>> outside(c.numels.size());
  std::vector<TensorView> srcs;
  std::vector<MutableView> dsts, xs;
  for (std::size_t t = 0; t < c.numels.size(); ++t) {
    const std::int64_t numel = c.numels[t];
    if (c.op == Op::kAllGather) {
      std::uint8_t* src = reinterpret_cast<std::uint8_t*>(s + p.in[t]) + (c.dsts ? 0 : static_cast<std::size_t>(me) * numel);
      if (c.srcs_outside) outside[t].resize(static_cast<std::size_t>(numel)), src = outside[t].data();
      for (std::int64_t e = 0; e < numel; ++e) src[e] = input_byte(c.seed, r, static_cast<int>(t), e);
      srcs.emplace_back(src, DType::kFP8E4M3, Shape{numel});
      if (c.dsts) dsts.push_back({s + p.out[t], DType::kFP8E4M3, Shape{numel * n}});
    } else {
      float* x = reinterpret_cast<float*>(s + p.in[t]);
      for (std::int64_t e = 0; e < numel; ++e) x[e] = input(c.seed, r, static_cast<int>(t), e);
      xs.push_back({x, DType::kF32, Shape{numel}});
    }
  }
  // What the storage must hold afterwards: the snapshot with the outputs replaced.
  std::vector<std::byte> want(s, s + checked);
  for (std::size_t t = 0; t < c.numels.size(); ++t) {
    const std::int64_t numel = c.numels[t];
    if (c.op == Op::kAllGather) {
      std::vector<std::vector<std::uint8_t>> all(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j)
        for (std::int64_t e = 0; e < numel; ++e) all[static_cast<std::size_t>(j)].push_back(input_byte(c.seed, members[j], static_cast<int>(t), e));
      const auto g = ref::bucket_all_gather(all);
      std::memcpy(want.data() + p.out[t], g.data(), g.size());
      continue;
    }
    std::vector<std::vector<float>> all(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j)
      for (std::int64_t e = 0; e < numel; ++e) all[static_cast<std::size_t>(j)].push_back(input(c.seed, members[j], static_cast<int>(t), e));
    if (c.op == Op::kAllReduce) {
      const auto v = ref::bucket_all_reduce(all, c.scale);
      std::memcpy(want.data() + p.out[t], v.data(), v.size() * 4);
    } else {
      const auto v = ref::bucket_reduce_scatter(all, me, c.scale, c.bf16);
      std::memcpy(want.data() + p.out[t] + static_cast<std::size_t>(me) * v.size() * 4, v.data(), v.size() * 4);
    }
  }
  std::vector<MutableView> res;
  if (c.op == Op::kAllGather) res = b.all_gather(srcs, dsts, c.group);
  else if (c.op == Op::kAllReduce) res = b.all_reduce(xs, c.scale, c.group);
  else res = b.reduce_scatter(xs, c.bf16 ? CommPrecision::kBF16 : CommPrecision::kFP32, c.scale, c.group);
  expect(res.size() == c.numels.size(), "rank " + std::to_string(r) + ": " + describe(c) + ": wrong number of results");
  expect(algo == BucketAlgorithm::kNone || b.last_algorithm() == algo,
         "rank " + std::to_string(r) + ": " + describe(c) + ": ran " + to_string(b.last_algorithm()) + ", expected " + to_string(algo));
  for (std::size_t i = 0; i < checked; ++i)
    if (s[i] != want[i]) {
      std::ostringstream m;
      m << "rank " << r << " (" << to_string(b.last_algorithm()) << "): " << describe(c)
        << ": storage byte " << i << " is " << int(s[i]) << ", expected " << int(want[i]);
      for (std::size_t t = 0; t < c.numels.size(); ++t) m << " [tensor " << t << " in " << p.in[t] << " out " << p.out[t] << "]";
      throw std::runtime_error(m.str());
    }
  // The results are the outputs.
  for (std::size_t t = 0; t < res.size(); ++t) {
    const std::size_t off = static_cast<std::size_t>(static_cast<std::byte*>(res[t].data) - s);
    const std::size_t shard = c.op == Op::kReduceScatter ? static_cast<std::size_t>(me) * static_cast<std::size_t>(c.numels[t]) / n * 4 : 0;
    expect(off == p.out[t] + shard, "rank " + std::to_string(r) + ": " + describe(c) + ": result " + std::to_string(t) + " at the wrong offset");
  }
}

/// Groups of P ranks: the world, halves, pairs, strided rails (at most 8).
inline std::vector<std::vector<int>> groups_of(int P) {
  std::vector<std::vector<int>> g{world_ranks(P)};
  if (P >= 2) {
    std::vector<int> lo, hi, even, odd;
    for (int r = 0; r < P; ++r) (r < P / 2 ? lo : hi).push_back(r), (r % 2 ? odd : even).push_back(r);
    g.push_back(lo), g.push_back(hi), g.push_back(even), g.push_back(odd);
  }
  if (P >= 4) g.push_back({0, 1}), g.push_back({P - 2, P - 1});
  if (P >= 3) g.push_back({1});
  return g;
}

/// `big`: also a tensor of more than kReduceBlock elements per member (on pairs and single
/// ranks), the mapped algorithm's multi-block path; off where small chunks would make it
/// hundreds of pipelined rounds.
inline std::vector<Case> cases_of(int num_groups, std::uint64_t seed, bool big = true) {
  std::vector<std::vector<std::int64_t>> sizes = {{8}, {1, 7, 16}, {1000}, {4099, 16, 3, 160}, {65536}, {24000, 8, 4096, 1, 96, 512, 10000, 64}};
  if (big) sizes.push_back({200003});
  if (kSanitized) sizes = {{1, 7, 16}, {4099, 16, 3, 160}, {24000, 8, 4096, 1, 96, 512, 10000, 64}};
  const float scales[] = {1.0f, 0.0f, 0.25f, -0.5f, 2.0f};
  std::vector<Case> cases;
  int k = 0;
  for (int g = 0; g < num_groups; ++g)
    for (const auto& sz : sizes) {
      const float sc = scales[k % 5];
      ++k;
      cases.push_back({Op::kAllReduce, g, sz, sc, false, false, false, seed + static_cast<std::uint64_t>(k)});
      cases.push_back({Op::kReduceScatter, g, sz, sc, k % 2 == 1, false, false, seed + 100 + static_cast<std::uint64_t>(k)});
      cases.push_back({Op::kAllGather, g, sz, 1.0f, false, k % 3 != 0, k % 3 == 2, seed + 200 + static_cast<std::uint64_t>(k)});
    }
  return cases;
}

/// Small calls for the one-shot algorithm: 1..64 tensors of odd and even sizes, single
/// tensors around the 64 KiB board slot (16384 float32 fill it exactly), every group, the
/// scales, bf16 reduce_scatter, all_gather in place / into dsts / from private srcs.
inline std::vector<Case> one_shot_cases(int num_groups, std::uint64_t seed) {
  std::vector<std::vector<std::int64_t>> sizes;
  for (int count : {1, 2, 3, 7, 16, 33, 64}) {
    std::vector<std::int64_t> s;
    for (int i = 0; i < count; ++i) s.push_back(1 + (i * 131 + count * 17) % 61);
    sizes.push_back(s);
  }
  for (std::int64_t n : {1, 3, 255, 1023, 4096, 4097, 16383, 16384, 16400}) sizes.push_back({n});
  if (kSanitized) sizes = {sizes[0], sizes[3], sizes[6], sizes[10]};
  const float scales[] = {1.0f, 0.0f, 0.25f, -0.5f, 2.0f};
  std::vector<Case> cases;
  int k = 0;
  for (int g = 0; g < num_groups; ++g)
    for (const auto& sz : sizes) {
      const float sc = scales[k % 5];
      ++k;
      cases.push_back({Op::kAllReduce, g, sz, sc, false, false, false, seed + static_cast<std::uint64_t>(k)});
      cases.push_back({Op::kReduceScatter, g, sz, sc, k % 2 == 1, false, false, seed + 100 + static_cast<std::uint64_t>(k)});
      cases.push_back({Op::kAllGather, g, sz, 1.0f, false, k % 3 != 0, k % 3 == 2, seed + 200 + static_cast<std::uint64_t>(k)});
    }
  return cases;
}

/// Reduce-scatter needs numel % n == 0: round each tensor up for its group.
inline Case fit(Case c, int n) {
  if (c.op == Op::kReduceScatter)
    for (auto& e : c.numels) e = (e + n - 1) / n * n;
  return c;
}

}  // namespace epx::testing::bucket
