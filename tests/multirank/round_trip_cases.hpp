// The small round-trip cases the data-plane suites share (dataplane_conformance_test.cpp,
// path_units_test.cpp): one routing of 4 ranks whose rows fill a full and a padded flag
// block, with the reference's dispatch outputs and the combine of wide-range y (so the
// order of additions shows).
#pragma once

#include <cstdint>
#include <vector>

#include "multirank_support.hpp"

namespace epx::testing {

/// Ranks of the small routing (one of them sends nothing).
inline constexpr int kCaseRanks = 4;

/// A small routing: 4 ranks (9, 0, 14 and 5 tokens), 16 experts (4 per rank), top-5: a
/// token's group of slots on one rank holds up to 4, so the order inside a group shows
/// (with 2 per rank a group of two adds the same either way).
inline ref::FixtureOptions fixture(bool fp8, std::uint64_t seed) {
  ref::FixtureOptions f;
  f.num_ranks = kCaseRanks;
  f.num_experts = 16;
  f.num_topk = 5;
  f.hidden = 384;  // bf16 rows of 768 bytes: a full and a padded flag block
  f.fp8 = fp8;
  f.tokens_per_rank = {9, 0, 14, 5};
  f.seed = seed;
  return f;
}

// Expected outputs of one routing: dispatch per layout, combine of wide-range y.
struct Expected {
  ref::Problem p;
  ref::DispatchOptions d;
  std::vector<ref::DispatchOut> out;
  std::vector<std::vector<std::uint16_t>> y, combined;
  bool weighted = false;
  // Weighted expanded: the same y combined unweighted too (a weight per term hides the order
  // of a group's additions: w1 * 2^30 and w2 * -2^30 do not cancel).
  std::vector<std::vector<std::uint16_t>> combined_unweighted;
};

/// `nodes` ([P], the node of each rank): the combine in docs/spec.md §4's node-first order instead
/// of the flat one.
inline Expected expect(const ref::FixtureOptions& f, bool expanded, bool weighted, const std::vector<int>* nodes = nullptr) {
  Expected e{ref::make_problem(f), {}, {}, {}, {}, weighted, {}};
  e.d.expanded = expanded;
  e.d.alignment = expanded ? 4 : 1;
  e.out = ref::dispatch_all(e.p, e.d);
  for (int r = 0; r < e.p.num_ranks; ++r)
    e.y.push_back(wide_bf16(700 + static_cast<std::uint64_t>(r), e.out[static_cast<std::size_t>(r)].rows * f.hidden));
  for (int r = 0; r < e.p.num_ranks; ++r) e.combined.push_back(ref::combine(e.p, e.d, e.out, e.y, nullptr, nullptr, weighted, r, nodes));
  if (expanded && weighted)
    for (int r = 0; r < e.p.num_ranks; ++r)
      e.combined_unweighted.push_back(ref::combine(e.p, e.d, e.out, e.y, nullptr, nullptr, false, r, nodes));
  return e;
}

}  // namespace epx::testing
