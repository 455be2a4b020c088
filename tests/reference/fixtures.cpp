// tests/reference/fixtures.cpp — see fixtures.hpp.
#include "reference/fixtures.hpp"

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

namespace epx::ref {
namespace {

std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

/// splitmix64 finaliser: turns (seed, rank, purpose) into well-spread engine seeds.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::mt19937_64 engine(std::uint64_t seed, std::uint64_t rank, std::uint64_t purpose) {
  return std::mt19937_64(mix(mix(mix(seed) ^ rank) ^ purpose));
}

enum Purpose : std::uint64_t { kTopk = 1, kWeights = 2, kX = 3 };

/// Uniform double in [0, 1), a multiple of 2^-53.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

/// Uniform-enough integer in [0, n) (modulo bias is irrelevant for tests).
std::uint64_t below(std::mt19937_64& rng, std::uint64_t n) { return rng() % n; }

/// One random finite bf16 code: 1/64 +0, 1/64 -0, 1/64 subnormal, otherwise a normal value
/// with exponent 2^-12..2^3 (magnitude in [2^-12, 2^4)), random sign and mantissa.
std::uint16_t random_bf16_code(std::mt19937_64& rng) {
  const std::uint64_t kind = below(rng, 64);
  if (kind == 0) return 0x0000;
  if (kind == 1) return 0x8000;
  const std::uint16_t sign = below(rng, 2) != 0 ? 0x8000 : 0x0000;
  if (kind == 2) return static_cast<std::uint16_t>(sign | (1 + below(rng, 127)));  // mantissa 1..127
  const std::uint64_t exponent = 127 - 12 + below(rng, 16);
  const std::uint64_t mantissa = below(rng, 128);
  return static_cast<std::uint16_t>(sign | (exponent << 7) | mantissa);
}

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("epx::ref::make_problem: " + what); }

}  // namespace

std::vector<std::uint16_t> random_bf16(std::uint64_t seed, std::int64_t n) {
  std::mt19937_64 rng = engine(seed, 0xb16, kX);
  std::vector<std::uint16_t> v(idx(n));
  for (auto& b : v) b = random_bf16_code(rng);
  return v;
}

Problem make_problem(const FixtureOptions& o) {
  const int P = o.num_ranks, E = o.num_experts, H = o.hidden, K = o.num_topk;
  if (P < 1 || E < 1 || E % P != 0) bad("need P >= 1 and E % P == 0");
  if (K < 1 || K > E) bad("need 1 <= K <= E");
  if (H < 1 || (o.fp8 && H % 128 != 0)) bad("need H >= 1, and H % 128 == 0 for fp8");
  if (!o.tokens_per_rank.empty() && o.tokens_per_rank.size() != idx(P)) bad("tokens_per_rank needs P entries");
  if (!(o.mask_prob >= 0.0 && o.mask_prob <= 1.0)) bad("mask_prob outside [0, 1]");
  if (!(o.zipf >= 0.0)) bad("zipf < 0");

  // Zipf weights of the experts (all 1 when uniform).
  std::vector<double> popularity(idx(E), 1.0);
  if (o.zipf > 0.0)
    for (int e = 0; e < E; ++e) popularity[idx(e)] = 1.0 / std::pow(static_cast<double>(e + 1), o.zipf);

  Problem p;
  p.num_ranks = P;
  p.num_experts = E;
  p.hidden = H;
  p.num_topk = K;
  p.fp8 = o.fp8;
  p.ranks.resize(idx(P));
  for (int r = 0; r < P; ++r) {
    RankInput& in = p.ranks[idx(r)];
    in.num_tokens = o.tokens_per_rank.empty() ? o.tokens : o.tokens_per_rank[idx(r)];
    if (in.num_tokens < 0) bad("negative token count for rank " + std::to_string(r));
    const std::int64_t S = in.num_tokens;

    // topk_idx: K distinct experts, sampled without replacement, then masked.
    std::mt19937_64 rng = engine(o.seed, static_cast<std::uint64_t>(r), kTopk);
    in.topk_idx.assign(idx(S * K), -1);
    for (std::int64_t t = 0; t < S; ++t) {
      std::vector<bool> taken(idx(E), false);
      for (int k = 0; k < K; ++k) {
        double total = 0.0;
        for (int e = 0; e < E; ++e)
          if (!taken[idx(e)]) total += popularity[idx(e)];
        const double u = uniform01(rng) * total;
        int pick = -1;
        double cumulative = 0.0;
        for (int e = 0; e < E; ++e) {
          if (taken[idx(e)]) continue;
          pick = e;  // the last free expert catches rounding at the top end
          cumulative += popularity[idx(e)];
          if (u < cumulative) break;
        }
        taken[idx(pick)] = true;
        in.topk_idx[idx(t * K + k)] = pick;
      }
      for (int k = 0; k < K; ++k)
        if (uniform01(rng) < o.mask_prob) in.topk_idx[idx(t * K + k)] = -1;
    }

    // topk_weights: (0, 1] in steps of 2^-24, masked slots included.
    std::mt19937_64 wrng = engine(o.seed, static_cast<std::uint64_t>(r), kWeights);
    in.topk_weights.resize(idx(S * K));
    for (auto& w : in.topk_weights) w = static_cast<float>((wrng() >> 40) + 1) * 0x1.0p-24f;

    // x.
    std::mt19937_64 xrng = engine(o.seed, static_cast<std::uint64_t>(r), kX);
    if (!o.fp8) {
      in.x.resize(idx(S * H));
      for (auto& b : in.x) b = random_bf16_code(xrng);
    } else {
      std::vector<float> xf(idx(S * H), 0.0f);
      for (std::int64_t t = 0; t < S; ++t)
        for (int b = 0; b < H / 128; ++b) {
          const bool zero_block = below(xrng, 16) == 0;
          const double factor = std::ldexp(1.0, static_cast<int>(below(xrng, 9)) - 4);
          for (int i = 0; i < 128; ++i) {
            const double u = uniform01(xrng) * 2.0 - 1.0;
            xf[idx(t * H + b * 128 + i)] = zero_block ? 0.0f : static_cast<float>(u * factor);
          }
        }
      cast_to_fp8(xf, S, H, o.ue8m0, in.x_fp8, in.x_scales);
    }
  }
  return p;
}

Problem tiny_problem() {
  Problem p;
  p.num_ranks = 2;
  p.num_experts = 4;
  p.hidden = 128;
  p.num_topk = 2;
  p.fp8 = false;
  p.ranks.resize(2);
  p.ranks[0].num_tokens = 3;
  p.ranks[0].topk_idx = {1, 2, 3, 0, 0, 1};
  p.ranks[0].topk_weights = {0.25f, 0.75f, 0.5f, 0.375f, 0.125f, 0.875f};
  p.ranks[1].num_tokens = 2;
  p.ranks[1].topk_idx = {2, -1, 3, 1};
  p.ranks[1].topk_weights = {1.0f, 0.3f, 0.625f, 0.4375f};
  for (int s = 0; s < 2; ++s) {
    RankInput& in = p.ranks[idx(s)];
    in.x.resize(idx(in.num_tokens * 128));
    for (std::int64_t t = 0; t < in.num_tokens; ++t)
      for (int h = 0; h < 128; ++h) {
        const float id = static_cast<float>(10 * s + t + 1);
        in.x[idx(t * 128 + h)] = f32_to_bf16(id + 0.25f * static_cast<float>(h % 4));
      }
  }
  return p;
}

}  // namespace epx::ref
