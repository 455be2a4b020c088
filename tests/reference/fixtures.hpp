// tests/reference/fixtures.hpp — the one input generator every multi-rank test shares,
// plus a tiny hand-made problem whose results are worked out by hand below.
//
// Everything here is deterministic across standard libraries and platforms: one
// std::mt19937_64 (whose output sequence the C++ standard fixes) per rank and purpose,
// seeded through splitmix64, and hand-written sampling (no std::*_distribution, whose
// output the standard does not fix). The only libm call is std::pow for the Zipf weights.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/reference.hpp"

namespace epx::ref {

struct FixtureOptions {
  int num_ranks = 4;     ///< P
  int num_experts = 16;  ///< E (E % P == 0)
  int hidden = 256;      ///< H (multiple of 128 when fp8)
  int num_topk = 4;      ///< K (<= E)
  bool fp8 = false;      ///< give x as FP8 (cast_to_fp8 of random floats) instead of bf16
  std::vector<std::int64_t> tokens_per_rank;  ///< size P; empty → every rank gets `tokens`
  std::int64_t tokens = 32;
  double mask_prob = 0.1;  ///< probability that a slot is -1
  double zipf = 0.0;       ///< 0 = uniform experts; > 0 = P(expert e) ∝ 1/(e+1)^zipf (expert 0 hottest,
                           ///< so the low ranks get the most rows)
  std::uint64_t seed = 1;
  bool ue8m0 = false;      ///< fp8 only: power-of-two scales
};

/// A random problem (deterministic for the same options):
/// - topk_idx: K distinct experts per token (uniform, or Zipf-weighted without replacement),
///   then each slot independently replaced by -1 with probability mask_prob (so some tokens
///   may have no valid slot at all).
/// - topk_weights: random floats in (0, 1] (multiples of 2^-24) for every slot, masked slots
///   included (the library must not pass those on).
/// - x (bf16): random_bf16 values: finite, both signs, magnitudes ~2^-12..2^4, about 1/64
///   each +0.0, -0.0 and subnormals.
/// - x_fp8 / x_scales (fp8): epx::ref::cast_to_fp8 of random floats uniform in [-f, f) with a
///   per-(row, 128-block) factor f = 2^(-4..4); about 1/16 of the blocks all zero.
/// Throws std::invalid_argument on inconsistent options.
Problem make_problem(const FixtureOptions& o);

/// n random bf16 values (same distribution as make_problem's x), for y / bias inputs.
std::vector<std::uint16_t> random_bf16(std::uint64_t seed, std::int64_t n);

/// The tiny hand-made problem: P = 2, E = 4 (L = 2: experts 0,1 on rank 0; 2,3 on rank 1),
/// H = 128, K = 2, bf16.
///
///   rank 0:  t0: topk_idx [1, 2]   weights [0.25,  0.75  ]
///            t1: topk_idx [3, 0]   weights [0.5,   0.375 ]
///            t2: topk_idx [0, 1]   weights [0.125, 0.875 ]
///   rank 1:  t0: topk_idx [2, -1]  weights [1.0,   0.3   ]   (slot 1 unused)
///            t1: topk_idx [3, 1]   weights [0.625, 0.4375]
///   x_s[t][h] = bf16(id + 0.25 * (h % 4)) with id = 10*s + t + 1 (1, 2, 3 / 11, 12), exact.
///
/// Expected layout:
///   rank 0: num_tokens_per_rank [3, 2], num_tokens_per_expert [2, 2, 1, 1],
///           is_token_in_rank [[1,1], [1,1], [1,0]]
///   rank 1: num_tokens_per_rank [1, 2], num_tokens_per_expert [0, 1, 1, 1],
///           is_token_in_rank [[0,1], [1,1]]
/// Compact dispatch (rows (s,t) : recv_topk_idx / recv_topk_weights):
///   rank 0: (0,0) [1,-1] [.25,0]; (0,1) [-1,0] [0,.375]; (0,2) [0,1] [.125,.875];
///           (1,1) [-1,1] [0,.4375];  num_recv_tokens_per_expert [2, 3]
///   rank 1: (0,0) [-1,0] [0,.75]; (0,1) [1,-1] [.5,0]; (1,0) [0,-1] [1,0];
///           (1,1) [1,-1] [.625,0];   num_recv_tokens_per_expert [2, 2]
/// Expanded dispatch, alignment 2 (rows (s,t,k) weight):
///   rank 0: expert 0: (0,1,1) .375, (0,2,0) .125; expert 1: (0,0,0) .25, (0,2,1) .875,
///           (1,1,1) .4375, padding;  offsets [0, 2, 6], n [2, 3], aligned [2, 4]
///   rank 1: expert 0: (0,0,1) .75, (1,0,0) 1.0; expert 1: (0,1,0) .5, (1,1,0) .625;
///           offsets [0, 2, 4], n [2, 2], aligned [2, 2]
///   Rows needed: compact 4 and 4; expanded (alignment 2) 6 and 4.
Problem tiny_problem();

}  // namespace epx::ref
