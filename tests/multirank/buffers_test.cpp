// Several buffers on one group (epx/buffer_base.hpp): each on its own endpoint of the
// transport, created and destroyed in any order, never disturbing one another; the lifecycle
// every kind shares; the agreements (config, plan, per-call verdicts) that make a bad input
// fail alike on every rank.
#include <gtest/gtest.h>

#include <optional>

#include "epx/buffer_allocator.hpp"
#include "epx/buffer_base.hpp"
#include "multirank_support.hpp"
#include "round_trip_cases.hpp"

namespace epx::testing {
namespace {

class OnEveryTransport : public ::testing::TestWithParam<TransportKind> {};

std::string transport_name(const ::testing::TestParamInfo<TransportKind>& i) { return to_string(i.param); }

// One dispatch + combine of `e` on `b`, checked bit for bit.
void round_trip(int r, Buffer& b, const Expected& e, const char* when) {
  const RankViews v = views_of(e.p, r);
  const DispatchResult d = b.dispatch(dispatch_args(v, e.d));
  expect_dispatch(r, e.p, e.d, e.out[static_cast<std::size_t>(r)], d);
  const auto& y = e.y[static_cast<std::size_t>(r)];
  CombineArgs ca;
  ca.y = TensorView(y.data(), DType::kBF16, {d.handle.num_recv_rows(), e.p.hidden});
  ca.handle = &d.handle;
  ca.weighted = e.weighted;
  const CombineResult c = b.combine(ca);
  expect_bits(r, std::string(when) + ": combined_x", c.combined_x.data(), e.combined[static_cast<std::size_t>(r)]);
}

TEST_P(OnEveryTransport, EPBuffersInterleavedStayExactAndGoInAnyOrder) {
  const Expected a = expect(fixture(false, 11), false, false);
  const Expected b = expect(fixture(true, 12), true, true);  // FP8, expanded, weighted: another window layout
  const auto before = epx_segments();
  launch({.num_ranks = kCaseRanks, .transport = GetParam()}, [&](Transport& t) {
    const int r = t.rank();
    auto first = std::make_unique<Buffer>(t, config_for(a.p));
    auto second = std::make_unique<Buffer>(t, config_for(b.p));
    for (int i = 0; i < 3; ++i) {  // each call's rows and signals stay in its own buffer
      const RankViews va = views_of(a.p, r), vb = views_of(b.p, r);
      const DispatchResult da = first->dispatch(dispatch_args(va, a.d));
      const DispatchResult db = second->dispatch(dispatch_args(vb, b.d));
      expect_dispatch(r, a.p, a.d, a.out[static_cast<std::size_t>(r)], da);
      expect_dispatch(r, b.p, b.d, b.out[static_cast<std::size_t>(r)], db);
      round_trip(r, *second, b, "second");
      round_trip(r, *first, a, "first");
    }
    if (first->window_bytes() == 0 || second->window_bytes() == 0) fail(r, "a live buffer reports no window");
    first->destroy();  // the older one first: the other goes on
    if (first->window_bytes() != 0) fail(r, "a destroyed buffer still reports a window");
    round_trip(r, *second, b, "after the first's destroy");
    auto third = std::make_unique<Buffer>(t, config_for(a.p));
    round_trip(r, *third, a, "third");
    round_trip(r, *second, b, "second next to the third");
    second.reset();  // implicit destroy
    round_trip(r, *third, a, "third alone");
    third->destroy();
  });
  EXPECT_TRUE(segments_left(before).empty());
}

TEST_P(OnEveryTransport, DestroyIsIdempotentAndUseAfterItIsAClearError) {
  const Expected a = expect(fixture(false, 13), false, false);
  launch({.num_ranks = kCaseRanks, .transport = GetParam()}, [&](Transport& t) {
    const int r = t.rank();
    Buffer b(t, config_for(a.p));
    b.destroy();
    b.destroy();
    if (!b.destroyed()) fail(r, "destroyed() is false after destroy()");
    try {
      b.dispatch(dispatch_args(views_of(a.p, r), a.d));
      fail(r, "dispatch after destroy() did not throw");
    } catch (const Error& e) {
      const std::string want = "rank " + std::to_string(r) + ": ep.dispatch: the buffer was destroyed";
      if (e.code() != ErrorCode::kInvalidArgument || std::string(e.what()) != want)
        fail(r, std::string("wrong error: ") + to_string(e.code()) + " " + e.what());
    }
  });
}

TEST_P(OnEveryTransport, OneCopyOutputsOutliveTheirBuffer) {
  const Expected a = expect(fixture(false, 14), false, false);
  launch({.num_ranks = kCaseRanks, .transport = GetParam()}, [&](Transport& t) {
    const int r = t.rank();
    DispatchResult d;
    {
      Buffer b(t, config_for(a.p));
      d = b.dispatch(dispatch_args(views_of(a.p, r), a.d));
      b.destroy();
    }
    Buffer other(t, config_for(a.p));  // a new window next to the old one's bytes
    round_trip(r, other, a, "next buffer");
    expect_dispatch(r, a.p, a.d, a.out[static_cast<std::size_t>(r)], d);
  });
}

TEST_P(OnEveryTransport, EndpointsGetPeersWindowsOneSided) {
  launch({.num_ranks = kCaseRanks, .transport = GetParam()}, [&](Transport& t) {
    const int r = t.rank(), P = t.num_ranks();
    std::unique_ptr<Transport> ep = t.open_endpoint();
    if (ep == nullptr) fail(r, "no endpoint");
    constexpr std::size_t kBytes = 4096 + 24;  // not a multiple of the page or of 16
    ep->allocate(P * kBytes, 1);
    std::byte* mine = ep->window();
    for (std::size_t i = 0; i < kBytes; ++i) mine[static_cast<std::size_t>(r) * kBytes + i] = static_cast<std::byte>(r * 31 + i % 251);
    ep->barrier("get test: written");
    if (!ep->caps().one_sided_get) {  // the simulator models puts only
      try {
        std::byte b;
        ep->get(0, 0, &b, 1, 0);
        fail(r, "get on a transport without one_sided_get did not throw");
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kUnsupported) throw;
      }
      return;
    }
    std::vector<std::byte> got(kBytes);
    for (int p = 0; p < P; ++p) {
      ep->get(p, static_cast<std::size_t>(p) * kBytes, got.data(), kBytes, 0);
      ep->quiet(0);
      for (std::size_t i = 0; i < kBytes; ++i)
        if (got[i] != static_cast<std::byte>(p * 31 + i % 251)) fail(r, "get from rank " + std::to_string(p) + " differs at byte " + std::to_string(i));
    }
    ep->barrier("get test: read");
    ep->allocate(0, 0);
  });
}

INSTANTIATE_TEST_SUITE_P(Buffers, OnEveryTransport, ::testing::ValuesIn(kDataTransports), transport_name);

// A buffer kind of the tests' own: the base's agreements, nothing else.
class ProbeBuffer : public BufferBase {
 public:
  ProbeBuffer(Transport& t, const std::vector<AgreedValue>& values, const std::string& problem)
      : BufferBase(t, "probe") {
    agree(values, problem);
    allocate(4096, 4);
  }
  ProbeBuffer(Transport& t, const BufferAllocator& plan) : BufferBase(t, "probe") {
    agree(plan_values(plan), "");
    allocate(plan.total_bytes(), 0);
  }
  void call(const std::optional<CallProblem>& mine) { agree_call("probe.call", mine); }
};

// Runs `fn` on 4 ranks; returns each rank's error (code, origin, message), "" where none.
struct Outcome {
  ErrorCode code = ErrorCode::kInternal;
  int origin = -2;
  std::string message;
};
template <class Fn>
std::vector<Outcome> outcomes(TransportKind kind, Fn fn) {
  std::vector<Outcome> out(4);
  launch({.num_ranks = 4, .transport = kind}, [&](Transport& t) {
    try {
      fn(t);
    } catch (const Error& e) {
      if (kind != TransportKind::kThreads) {  // processes: carry the outcome back in the error
        throw;
      }
      out[static_cast<std::size_t>(t.rank())] = {e.code(), e.origin_rank(), e.what()};
    }
  });
  return out;
}

TEST(BufferBase, ConfigThatDiffersFailsOnEveryRankNamingRankAndValue) {
  const auto got = outcomes(TransportKind::kThreads, [](Transport& t) {
    ProbeBuffer b(t, {{"hidden", "7168"}, {"num_topk", t.rank() == 2 ? "6" : "8"}}, "");
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[r].code, ErrorCode::kInvalidArgument) << r;
    EXPECT_EQ(got[r].origin, 2) << r;
    EXPECT_EQ(got[r].message, "rank 2: probe config differs from rank 0's: num_topk = 6 vs 8") << r;
  }
}

TEST(BufferBase, AProblemOfOneRankFailsEveryRankWithItsMessage) {
  const auto got = outcomes(TransportKind::kThreads, [](Transport& t) {
    ProbeBuffer b(t, {{"hidden", "7168"}}, t.rank() == 3 ? "hidden must be > 0, got -1" : "");
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[r].origin, 3) << r;
    EXPECT_EQ(got[r].message, "rank 3: hidden must be > 0, got -1") << r;
  }
}

TEST(BufferBase, PlansThatDifferNameTheFirstDifferingEntryAndRank) {
  const auto got = outcomes(TransportKind::kThreads, [](Transport& t) {
    BufferAllocator plan;
    plan.allocate("grads", {1024}, DType::kF32);
    plan.allocate("params", {t.rank() == 1 ? 512 : 256, 4}, DType::kBF16);
    ProbeBuffer b(t, plan);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[r].origin, 1) << r;
    EXPECT_EQ(got[r].message,
              "rank 1: probe config differs from rank 0's: plan entry 1 = params:[512, 4]:bf16@2097152 vs "
              "params:[256, 4]:bf16@2097152")
        << r;
  }
}

TEST(BufferBase, CallVerdictsAgreeOnCodeAndOrigin) {
  // One rank at fault: its code, origin and words everywhere.
  auto got = outcomes(TransportKind::kThreads, [](Transport& t) {
    ProbeBuffer b(t, {}, "");
    b.call(std::nullopt);  // a call that is fine everywhere passes
    b.call(t.rank() == 1 ? std::optional<CallProblem>({ErrorCode::kShapeMismatch, "x must be [S, 8]"}) : std::nullopt);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[r].code, ErrorCode::kShapeMismatch) << r;
    EXPECT_EQ(got[r].origin, 1) << r;
    EXPECT_EQ(got[r].message, "rank 1: probe.call: x must be [S, 8]") << r;
  }
  // Every rank the same problem: said so, no one rank blamed.
  got = outcomes(TransportKind::kThreads, [](Transport& t) {
    ProbeBuffer b(t, {}, "");
    b.call(CallProblem{ErrorCode::kBadHandle, "the handle is stale"});
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[r].code, ErrorCode::kBadHandle) << r;
    EXPECT_EQ(got[r].origin, -1) << r;
    EXPECT_EQ(got[r].message, "every rank: probe.call: the handle is stale") << r;
  }
  // Two ranks with different problems: the lowest's code everywhere, the other keeps its own in the message.
  got = outcomes(TransportKind::kThreads, [](Transport& t) {
    ProbeBuffer b(t, {}, "");
    std::optional<CallProblem> mine;
    if (t.rank() == 2) mine = CallProblem{ErrorCode::kDtypeMismatch, "x must be bf16"};
    if (t.rank() == 3) mine = CallProblem{ErrorCode::kShapeMismatch, "x must be [S, 8]"};
    b.call(mine);
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[r].code, ErrorCode::kDtypeMismatch) << r;
    EXPECT_EQ(got[r].origin, 2) << r;
  }
  EXPECT_EQ(got[2].message, "rank 2: probe.call: x must be bf16");
  EXPECT_EQ(got[3].message, "rank 2: probe.call: x must be bf16; rank 3's own problem: x must be [S, 8]");
}

TEST(BufferBase, AgreementsWorkAcrossProcessesToo) {
  // shm: ranks are processes; the launch carries the error of the rank at fault.
  const auto before = epx_segments();
  try {
    launch({.num_ranks = 4, .transport = TransportKind::kShm}, [](Transport& t) {
      ProbeBuffer b(t, {}, "");
      for (int i = 0; i < 5; ++i) b.call(std::nullopt);  // both parities of the area, reused
      b.call(t.rank() == 2 ? std::optional<CallProblem>({ErrorCode::kInvalidArgument, "bad scale"}) : std::nullopt);
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.origin_rank(), 2);
    EXPECT_NE(std::string(e.what()).find("bad scale"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(segments_left(before).empty());
}

TEST(BufferAllocator, PlansNamedTensorsAt2MiBOffsets) {
  BufferAllocator plan;
  EXPECT_EQ(plan.total_bytes(), 0u);
  EXPECT_EQ(plan.allocate("a", {3}, DType::kF32), 0u);
  EXPECT_EQ(plan.allocate("b", {1024, 1024}, DType::kF32), 1u);  // 4 MiB
  EXPECT_EQ(plan.allocate("c", {1}, DType::kBF16), 2u);
  ASSERT_EQ(plan.tensors().size(), 3u);
  EXPECT_EQ(plan.tensors()[0].offset, 0u);
  EXPECT_EQ(plan.tensors()[1].offset, kBufferAlignment);
  EXPECT_EQ(plan.tensors()[2].offset, 3 * kBufferAlignment);
  EXPECT_EQ(plan.tensors()[1].nbytes, std::size_t{4} << 20);
  EXPECT_EQ(plan.total_bytes(), 4 * kBufferAlignment);
  EXPECT_EQ(plan.find("b"), 1);
  EXPECT_EQ(plan.find("z"), -1);
  EXPECT_EQ(plan.describe(), "a:[3]:float32@0;b:[1024, 1024]:float32@2097152;c:[1]:bf16@6291456");
  EXPECT_THROW(plan.allocate("a", {1}, DType::kF32), Error);
  EXPECT_THROW(plan.allocate("", {1}, DType::kF32), Error);
  EXPECT_THROW(plan.allocate("d", {-1}, DType::kF32), Error);
}

}  // namespace
}  // namespace epx::testing
