// A BucketBuffer next to EP Buffers on the same ranks (epx/buffer_base.hpp): dispatch and
// combine interleaved with bucket collectives (an asynchronous all_reduce in flight across a
// dispatch + combine), every call bit-exact; explicit and implicit destroy in any order; the
// bucket's storage kept mapped by storage_ref() after destroy.
#include <gtest/gtest.h>

#include "epx/bucket.hpp"
#include "multirank/bucket_cases.hpp"
#include "multirank_support.hpp"
#include "round_trip_cases.hpp"

namespace epx::testing {
namespace {

class BucketWithEp : public ::testing::TestWithParam<TransportKind> {};

void ep_round_trip(int r, Buffer& b, const Expected& e) {
  const RankViews v = views_of(e.p, r);
  const DispatchResult d = b.dispatch(dispatch_args(v, e.d));
  expect_dispatch(r, e.p, e.d, e.out[static_cast<std::size_t>(r)], d);
  const auto& y = e.y[static_cast<std::size_t>(r)];
  CombineArgs ca;
  ca.y = TensorView(y.data(), DType::kBF16, {d.handle.num_recv_rows(), e.p.hidden});
  ca.handle = &d.handle;
  ca.weighted = e.weighted;
  const CombineResult c = b.combine(ca);
  expect_bits(r, "combined_x", c.combined_x.data(), e.combined[static_cast<std::size_t>(r)]);
}

/// An all_reduce of 3 tensors in flight while `between` runs, then checked.
void all_reduce_around(BucketBuffer& b, std::uint64_t seed, const std::function<void()>& between) {
  const int r = b.rank(), P = b.num_ranks();
  const std::int64_t sizes[] = {70000, 5, 4096};
  std::vector<MutableView> xs;
  std::size_t off = 0;
  for (int t = 0; t < 3; ++t) {
    float* x = reinterpret_cast<float*>(b.storage() + off);
    for (std::int64_t e = 0; e < sizes[t]; ++e) x[e] = bucket::input(seed, r, t, e);
    xs.push_back({x, DType::kF32, Shape{sizes[t]}});
    off += (static_cast<std::size_t>(sizes[t]) * 4 + 63) / 64 * 64;
  }
  BucketEvent ev = b.all_reduce_async(xs, 0.25f);
  between();
  ev.wait();
  for (int t = 0; t < 3; ++t) {
    std::vector<std::vector<float>> all(static_cast<std::size_t>(P));
    for (int j = 0; j < P; ++j)
      for (std::int64_t e = 0; e < sizes[t]; ++e) all[static_cast<std::size_t>(j)].push_back(bucket::input(seed, j, t, e));
    const auto want = ref::bucket_all_reduce(all, 0.25f);
    if (std::memcmp(xs[static_cast<std::size_t>(t)].data, want.data(), want.size() * 4) != 0)
      fail(r, "all_reduce tensor " + std::to_string(t) + " differs from the reference");
  }
}

TEST_P(BucketWithEp, InterleavedBitExactAndDestroyedInAnyOrder) {
  const Expected a = expect(fixture(false, 21), false, false);
  const auto before = epx_segments();
  launch({.num_ranks = kCaseRanks, .transport = GetParam()}, [&](Transport& t) {
    const int r = t.rank();
    auto ep = std::make_unique<Buffer>(t, config_for(a.p));
    auto bucket = std::make_unique<BucketBuffer>(t, std::vector<std::vector<int>>{world_ranks(t.num_ranks())}, std::size_t{1} << 20);
    for (std::uint64_t i = 0; i < 3; ++i) all_reduce_around(*bucket, 100 + i, [&] { ep_round_trip(r, *ep, a); });
    ep->destroy();  // the EP buffer first: the bucket goes on
    all_reduce_around(*bucket, 200, [] {});
    auto ep2 = std::make_unique<Buffer>(t, config_for(a.p));
    std::shared_ptr<std::byte> kept = bucket->storage_ref();
    std::memset(kept.get(), 0x5A, 64);
    bucket.reset();  // implicit destroy, while an outside owner still holds the storage
    if (kept.get()[63] != std::byte{0x5A}) fail(r, "the storage was unmapped under storage_ref()");
    kept.reset();
    ep_round_trip(r, *ep2, a);
    BucketBuffer again(t, {world_ranks(t.num_ranks())}, std::size_t{1} << 20);
    all_reduce_around(again, 300, [&] { ep_round_trip(r, *ep2, a); });
  });
  EXPECT_TRUE(segments_left(before).empty());
}

INSTANTIATE_TEST_SUITE_P(Transports, BucketWithEp, ::testing::ValuesIn(kDataTransports),
                         [](const ::testing::TestParamInfo<TransportKind>& i) { return std::string(to_string(i.param)); });

}  // namespace
}  // namespace epx::testing
