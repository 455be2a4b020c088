// What the recipe examples share: a round trip checked bit for bit against the reference
// (tests/multirank's small routings), with the path every call took, and an error that must
// reach every rank.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "round_trip_cases.hpp"

namespace epx::testing {

inline void expect_path_key(int r, const Buffer& b, const std::string& want, const std::string& call) {
  const std::string got = b.last_stats().path;
  if (got != want) fail(r, call + " took path '" + got + "', want '" + want + "'");
}

/// Fresh dispatch, combine, cached dispatch, combine: every output against the reference's
/// bits, every call on path `key`.
inline void round_trip(Buffer& b, int r, const Expected& e, const std::string& key) {
  const auto ur = static_cast<std::size_t>(r);
  const RankViews v = views_of(e.p, r);
  auto combine = [&](DispatchResult& from, const std::string& what) {
    CombineArgs ca;
    ca.handle = &from.handle;
    ca.weighted = e.weighted;
    ca.y = TensorView(e.y[ur].data(), DType::kBF16, {e.out[ur].rows, e.p.hidden});
    const CombineResult got = b.combine(ca);
    expect_path_key(r, b, key, what);
    expect_bits(r, what + ": combined_x", got.combined_x.data(), e.combined[ur]);
  };
  DispatchResult d = b.dispatch(dispatch_args(v, e.d));
  expect_path_key(r, b, key, "fresh dispatch");
  expect_dispatch(r, e.p, e.d, e.out[ur], d);
  combine(d, "combine");
  DispatchArgs cached = dispatch_args(v, e.d);
  cached.handle = &d.handle;
  DispatchResult dc = b.dispatch(cached);
  expect_path_key(r, b, key, "cached dispatch");
  expect_dispatch(r, e.p, e.d, e.out[ur], dc);
  combine(dc, "combine after the cached dispatch");
}

/// The three small problems every example runs: compact bf16, expanded with weights, FP8.
inline std::vector<Expected> recipe_problems() {
  std::vector<Expected> v;
  v.push_back(expect(fixture(false, 90), false, false));
  v.push_back(expect(fixture(false, 91), true, true));
  v.push_back(expect(fixture(true, 92), false, false));
  return v;
}

/// Runs `body` on kCaseRanks thread ranks and checks that every rank threw an epx::Error of
/// `code` whose message holds `words` (the collective refusal, not one rank's).
inline void expect_error_on_every_rank(const std::function<void(Transport&)>& body, ErrorCode code, const std::string& words) {
  std::mutex mu;
  std::vector<std::string> got(kCaseRanks, "returned without an error");
  try {
    launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      try {
        body(t);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        got[static_cast<std::size_t>(t.rank())] =
            e.code() == code ? std::string(e.what()) : "code " + std::to_string(static_cast<int>(e.code())) + ": " + e.what();
      }
    });
  } catch (const Error& e) {
    ADD_FAILURE() << "the launch itself failed: " << e.what();
  }
  for (int r = 0; r < kCaseRanks; ++r)
    EXPECT_NE(got[static_cast<std::size_t>(r)].find(words), std::string::npos) << "rank " << r << ": " << got[static_cast<std::size_t>(r)];
}

}  // namespace epx::testing
