// docs/spec.md §6: every bad input, raised on each rank in turn, makes every rank's call fail with
// an error naming the rank at fault — never a hang — and the buffer keeps working after.
// A peer that dies or stops answering fails the others within the timeout, naming it.
#include <unistd.h>

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <thread>

#include "multirank_support.hpp"

namespace epx::testing {
namespace {

constexpr int kRanks = 3;

ref::Problem problem(int hidden = 256) {
  ref::FixtureOptions f;
  f.num_ranks = kRanks;
  f.num_experts = 6;
  f.num_topk = 3;
  f.hidden = hidden;
  f.tokens = 6;
  f.mask_prob = 0.0;
  f.seed = 77;
  return ref::make_problem(f);
}

// What the bad rank does differently, given its buffer and correct inputs; it returns
// the call that must fail on every rank. `good` is what the other ranks call.
struct BadInput {
  std::string name;
  ErrorCode code;
  // (buffer, rank inputs, is_bad_rank) -> performs the collective call
  std::function<void(Buffer&, const ref::Problem&, int, bool)> call;
};

DispatchArgs args_of(const ref::Problem& p, int r) { return dispatch_args(views_of(p, r), {}); }

std::vector<BadInput> bad_inputs() {
  std::vector<BadInput> v;
  auto with_idx = [](std::int64_t value, int slot) {
    return [=](Buffer& b, const ref::Problem& p, int r, bool bad) {
      std::vector<std::int64_t> idx = p.ranks[static_cast<std::size_t>(r)].topk_idx;
      if (bad) idx[static_cast<std::size_t>(slot)] = value < -100 ? idx[0] : value;  // -1000: repeat slot 0
      DispatchArgs a = args_of(p, r);
      a.topk_idx = TensorView(idx.data(), DType::kI64, a.topk_idx.shape);
      b.dispatch(a);
    };
  };
  v.push_back({"topk_idx_too_large", ErrorCode::kInvalidArgument, with_idx(6, 4)});
  v.push_back({"topk_idx_below_minus_one", ErrorCode::kInvalidArgument, with_idx(-2, 0)});
  v.push_back({"same_expert_twice", ErrorCode::kInvalidArgument, with_idx(-1000, 1)});
  v.push_back({"more_tokens_than_capacity", ErrorCode::kCapacityExceeded,
               [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchArgs a = args_of(p, r);
                 std::vector<std::uint16_t> big(static_cast<std::size_t>((6 + 1) * p.hidden));
                 std::vector<std::int64_t> idx(7 * 3, -1);
                 std::vector<float> w(7 * 3, 0.0f);
                 if (bad) {
                   a.x = TensorView(big.data(), DType::kBF16, {7, p.hidden});
                   a.topk_idx = TensorView(idx.data(), DType::kI64, {7, 3});
                   a.topk_weights = TensorView(w.data(), DType::kF32, {7, 3});
                 }
                 b.dispatch(a);
               }});
  v.push_back({"weights_shape", ErrorCode::kShapeMismatch, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchArgs a = args_of(p, r);
                 if (bad) a.topk_weights.shape = Shape{6, 2};
                 b.dispatch(a);
               }});
  v.push_back({"x_rows_differ_from_topk", ErrorCode::kShapeMismatch, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchArgs a = args_of(p, r);
                 if (bad) a.x.shape = Shape{5, p.hidden};
                 b.dispatch(a);
               }});
  v.push_back({"x_dtype", ErrorCode::kDtypeMismatch, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchArgs a = args_of(p, r);
                 if (bad) a.x.dtype = DType::kF32;
                 b.dispatch(a);
               }});
  v.push_back({"recv_in_window_expanded", ErrorCode::kInvalidArgument,
               [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchArgs a = args_of(p, r);
                 if (bad) a.recv_in_window = true, a.layout = RecvLayout::kExpanded;
                 b.dispatch(a);
               }});
  v.push_back({"worst_too_small", ErrorCode::kCapacityExceeded, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchArgs a = args_of(p, r);
                 a.num_worst_tokens = bad ? 1 : 1000;
                 b.dispatch(a);
               }});
  v.push_back({"weighted_compact_combine", ErrorCode::kInvalidArgument,
               [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchResult d = b.dispatch(args_of(p, r));
                 CombineArgs c;
                 c.y = d.recv_x.view();
                 c.handle = &d.handle;
                 c.weighted = bad;
                 b.combine(c);
               }});
  v.push_back({"combine_wrong_rows", ErrorCode::kShapeMismatch, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchResult d = b.dispatch(args_of(p, r));
                 std::vector<std::uint16_t> y(static_cast<std::size_t>((d.handle.num_recv_rows() + 1) * p.hidden));
                 CombineArgs c;
                 c.y = TensorView(y.data(), DType::kBF16, {d.handle.num_recv_rows() + (bad ? 1 : 0), p.hidden});
                 c.handle = &d.handle;
                 b.combine(c);
               }});
  // A bias of the wrong dtype is a dtype error, one of the wrong shape a shape error (docs/spec.md §6).
  for (const bool dtype : {true, false})
    v.push_back({dtype ? "combine_bias_dtype" : "combine_bias_shape", dtype ? ErrorCode::kDtypeMismatch : ErrorCode::kShapeMismatch,
                 [dtype](Buffer& b, const ref::Problem& p, int r, bool bad) {
                   DispatchResult d = b.dispatch(args_of(p, r));
                   const std::int64_t S = args_of(p, r).x.shape[0];
                   std::vector<float> bias(static_cast<std::size_t>((S + 1) * p.hidden));
                   CombineArgs c;
                   c.y = d.recv_x.view();
                   c.handle = &d.handle;
                   c.bias0 = TensorView(bias.data(), DType::kBF16, {S, p.hidden});
                   if (bad && dtype) c.bias0 = TensorView(bias.data(), DType::kF32, {S, p.hidden});
                   if (bad && !dtype) c.bias0 = TensorView(bias.data(), DType::kBF16, {S + 1, p.hidden});
                   b.combine(c);
                 }});
  // FP8 on every rank; the rank at fault passes int32 scales.
  v.push_back({"x_scales_dtype", ErrorCode::kDtypeMismatch, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchArgs a = args_of(p, r);
                 const std::int64_t S = a.x.shape[0];
                 std::vector<std::uint8_t> q(static_cast<std::size_t>(S * p.hidden));
                 std::vector<float> scales(static_cast<std::size_t>(S * p.hidden / 128), 1.0f);
                 a.x = TensorView(q.data(), DType::kFP8E4M3, {S, p.hidden});
                 a.x_scales = TensorView(scales.data(), bad ? DType::kI32 : DType::kF32, {S, p.hidden / 128});
                 b.dispatch(a);
               }});
  v.push_back({"empty_handle", ErrorCode::kBadHandle, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchResult d = b.dispatch(args_of(p, r));
                 DispatchHandle none;
                 CombineArgs c;
                 c.y = d.recv_x.view();
                 c.handle = bad ? &none : &d.handle;
                 b.combine(c);
               }});
  v.push_back({"stale_handle", ErrorCode::kBadHandle, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchResult d1 = b.dispatch(args_of(p, r));
                 DispatchResult d2 = b.dispatch(args_of(p, r));
                 CombineArgs c;
                 c.y = (bad ? d1 : d2).recv_x.view();
                 c.handle = bad ? &d1.handle : &d2.handle;
                 b.combine(c);
               }});
  v.push_back({"cached_dispatch_wrong_tokens", ErrorCode::kShapeMismatch,
               [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 DispatchResult d = b.dispatch(args_of(p, r));
                 DispatchArgs a = args_of(p, r);
                 a.handle = &d.handle;
                 if (bad) a.x.shape = Shape{5, p.hidden};
                 b.dispatch(a);
               }});
  // A cached dispatch right after a combine sends its rows before the header exchange
  // (CallStats::data_first); the exchange after them must still fail every rank.
  auto dispatch_and_combine = [](Buffer& b, const ref::Problem& p, int r) {
    DispatchResult d = b.dispatch(args_of(p, r));
    CombineArgs c;
    c.y = d.recv_x.view();
    c.handle = &d.handle;
    b.combine(c);
    return d.handle;
  };
  v.push_back({"data_first_wrong_tokens", ErrorCode::kShapeMismatch,
               [=](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 const DispatchHandle h = dispatch_and_combine(b, p, r);
                 DispatchArgs a = args_of(p, r);
                 a.handle = &h;
                 if (bad) a.x.shape = Shape{5, p.hidden};
                 b.dispatch(a);
               }});
  v.push_back({"data_first_stale_handle", ErrorCode::kBadHandle,
               [=](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 const DispatchHandle h1 = dispatch_and_combine(b, p, r);
                 const DispatchHandle h2 = dispatch_and_combine(b, p, r);
                 DispatchArgs a = args_of(p, r);
                 a.handle = bad ? &h1 : &h2;
                 b.dispatch(a);
               }});
  v.push_back({"data_first_one_rank_fresh", ErrorCode::kBadHandle,
               [=](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 const DispatchHandle h = dispatch_and_combine(b, p, r);
                 DispatchArgs a = args_of(p, r);
                 if (!bad) a.handle = &h;
                 b.dispatch(a);
               }});
  // A problem the caller found (a language binding's own check): the call fails every rank
  // with the caller's code and words, naming the caller.
  v.push_back({"caller_error_dispatch", ErrorCode::kUnsupported, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 const Error mine(ErrorCode::kUnsupported, "rank " + std::to_string(r) + ": x: expected a CPU tensor", r);
                 DispatchArgs a = args_of(p, r);
                 if (bad) a.caller_error = &mine, a.x = TensorView();  // nothing else is looked at
                 b.dispatch(a);
               }});
  v.push_back({"caller_error_combine", ErrorCode::kDtypeMismatch, [](Buffer& b, const ref::Problem& p, int r, bool bad) {
                 const Error mine(ErrorCode::kDtypeMismatch, "rank " + std::to_string(r) + ": x: expected bf16", r);
                 DispatchResult d = b.dispatch(args_of(p, r));
                 CombineArgs c;
                 c.y = d.recv_x.view();
                 c.handle = &d.handle;
                 if (bad) c.caller_error = &mine, c.handle = nullptr;  // nor the handle
                 b.combine(c);
               }});
  return v;
}

// Runs `input` with rank `bad` at fault on every transport: every rank must get `code`,
// origin `bad`, a message naming it — and then a correct dispatch must still work.
void expect_collective_failure(TransportKind kind, const BadInput& input, int bad) {
  const ref::Problem p = problem();
  const auto want = ref::dispatch_all(p, {});
  LaunchOptions lo;
  lo.num_ranks = kRanks;
  lo.transport = kind;
  lo.timeout = std::chrono::milliseconds(20000);
  launch(lo, [&](Transport& t) {
    const int r = t.rank();
    BufferConfig cfg = config_for(p);
    // Rows first exists only without an output pool; every other input runs with the
    // default one (the block each rank reserved goes back when the call throws).
    if (input.name.rfind("data_first", 0) == 0) cfg.output_pool_bytes = 0;
    Buffer buffer(t, cfg);
    try {
      input.call(buffer, p, r, r == bad);
      fail(r, input.name + ": no error was raised");
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (e.code() != input.code)
        fail(r, input.name + ": error code " + to_string(e.code()) + ", want " + to_string(input.code) + ": " + msg);
      if (e.origin_rank() != bad)
        fail(r, input.name + ": origin rank " + std::to_string(e.origin_rank()) + ", want " + std::to_string(bad) + ": " + msg);
      if (msg.find("rank " + std::to_string(bad)) == std::string::npos)
        fail(r, input.name + ": message does not name rank " + std::to_string(bad) + ": " + msg);
    }
    expect_dispatch(r, p, {}, want[static_cast<std::size_t>(r)], buffer.dispatch(args_of(p, r)));
    // The block the failed call reserved went back: this output is one copy again.
    expect_output(r, buffer, RecvLayout::kCompact, (input.name + ", the dispatch after it").c_str());
  });
}

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.name; }

class BadInputOnEachRank : public ::testing::TestWithParam<std::tuple<TransportKind, BadInput>> {};

TEST_P(BadInputOnEachRank, FailsEveryRankNamingIt) {
  const auto& [kind, input] = GetParam();
  for (int bad = 0; bad < kRanks; ++bad) {
    SCOPED_TRACE("bad rank " + std::to_string(bad));
    expect_collective_failure(kind, input, bad);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransports, BadInputOnEachRank,
                         ::testing::Combine(::testing::ValuesIn(kTransports), ::testing::ValuesIn(bad_inputs())),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
                         });

// Every rank failing the same check is one error, said once for all (origin -1), not the
// lowest rank's; checks whose words differ between ranks still name the lowest.
TEST(Errors, EveryRankFailingTheSameCheckIsSaidSo) {
  const ref::Problem p = problem();
  for (TransportKind kind : kTransports) {
    LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      const int r = t.rank();
      Buffer b(t, config_for(p));
      DispatchResult d = b.dispatch(args_of(p, r));
      DispatchArgs a = args_of(p, r);
      a.handle = &d.handle;
      a.expert_alignment = 4;  // every rank: differs from the handle's
      try {
        b.dispatch(a);
        fail(r, "cached dispatch with another alignment accepted");
      } catch (const Error& e) {
        const std::string want = "every rank: cached dispatch: layout";
        if (e.code() != ErrorCode::kBadHandle || e.origin_rank() != -1 || std::string(e.what()).rfind(want, 0) != 0)
          fail(r, std::string("same check on every rank: ") + to_string(e.code()) + " origin " +
                      std::to_string(e.origin_rank()) + ": " + e.what());
      }
      std::vector<std::int64_t> idx = p.ranks[static_cast<std::size_t>(r)].topk_idx;
      idx[static_cast<std::size_t>(r)] = 6 + r;  // every rank's own out-of-range value and slot
      DispatchArgs bad = args_of(p, r);
      bad.topk_idx = TensorView(idx.data(), DType::kI64, bad.topk_idx.shape);
      try {
        b.dispatch(bad);
        fail(r, "out-of-range topk_idx accepted");
      } catch (const Error& e) {
        if (e.origin_rank() != 0 || std::string(e.what()).rfind("rank 0: ", 0) != 0) fail(r, e.what());
      }
    });
  }
}

TEST(Errors, ExpertsNotAMultipleOfRanks) {
  for (TransportKind kind : kTransports) {
    LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(20000)};
    try {
      launch(lo, [](Transport& t) {
        BufferConfig c{7, 128, 2, 4};
        Buffer b(t, c);
      });
      FAIL() << "E % P != 0 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("not a multiple"), std::string::npos) << e.what();
    }
  }
}

TEST(Errors, Fp8NeedsHiddenMultipleOf128OnTheRankThatSendsIt) {
  const ref::Problem p = problem(64);
  for (TransportKind kind : kTransports) {
    LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      Buffer b(t, config_for(p));
      DispatchArgs a = args_of(p, t.rank());
      std::vector<std::uint8_t> q(static_cast<std::size_t>(6 * 64));
      std::vector<float> s(6);
      if (t.rank() == 2) {
        a.x = TensorView(q.data(), DType::kFP8E4M3, {6, 64});
        a.x_scales = TensorView(s.data(), DType::kF32, {6, 0});
      }
      try {
        b.dispatch(a);
        fail(t.rank(), "fp8 with H = 64 accepted");
      } catch (const Error& e) {
        if (e.origin_rank() != 2 || e.code() != ErrorCode::kShapeMismatch) fail(t.rank(), e.what());
      }
    });
  }
}

TEST(Errors, ConfigThatDiffersBetweenRanksNamesTheRank) {
  for (TransportKind kind : kTransports) {
    LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(20000)};
    launch(lo, [](Transport& t) {
      BufferConfig c{6, t.rank() == 2 ? 256 : 128, 2, 4};
      try {
        Buffer b(t, c);
        fail(t.rank(), "differing configs accepted");
      } catch (const Error& e) {
        if (e.origin_rank() != 2) fail(t.rank(), e.what());
      }
    });
  }
}

TEST(Errors, ForeignHandle) {
  const ref::Problem p = problem();
  for (TransportKind kind : kTransports) {
    LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      Buffer b(t, config_for(p));
      DispatchResult d = b.dispatch(args_of(p, t.rank()));
      Buffer other(t, config_for(p));  // a second buffer (collective): its handles are foreign to b
      try {
        DispatchResult d2 = other.dispatch(args_of(p, t.rank()));
        CombineArgs c;
        c.y = d.recv_x.view();
        c.handle = t.rank() == 1 ? &d.handle : &d2.handle;
        other.combine(c);
        fail(t.rank(), "foreign handle accepted");
      } catch (const Error& e) {
        if (e.origin_rank() != 1 || e.code() != ErrorCode::kBadHandle) fail(t.rank(), e.what());
      }
    });
  }
}

// A rank that dies: every other rank fails naming it, the launcher names it, and no
// shared-memory segment is left behind.
TEST(Errors, PeerDeathFailsEveryRankAndLeavesNoSegment) {
  const ref::Problem p = problem();
  for (TransportKind kind : kTransports) {
    const auto before = epx_segments();
    LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(10000)};
    try {
      launch(lo, [&](Transport& t) {
        Buffer b(t, config_for(p));
        if (t.rank() == 1) {
          if (t.caps().name == std::string("shm")) _exit(3);  // a crash, not an error report
          throw std::runtime_error("rank 1 crashed");
        }
        b.dispatch(args_of(p, t.rank()));
      });
      FAIL() << "a dead rank went unnoticed";
    } catch (const Error& e) {
      EXPECT_EQ(e.origin_rank(), 1) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(segments_left(before).empty());
  }
}

// A rank that stops answering: the others time out naming it and the phase. The silent
// rank stays away far longer than the timeout (4 s against 600 ms), so that on a loaded
// machine the others still reach their notify wait and time out there before it returns.
TEST(Errors, SilentPeerTimesOutNamingPeerAndPhase) {
  const ref::Problem p = problem();
  for (TransportKind kind : kTransports) {
    const auto before = epx_segments();
    LaunchOptions lo{kRanks, kind, std::chrono::milliseconds(600)};
    std::vector<std::string> messages;
    try {
      launch(lo, [&](Transport& t) {
        Buffer b(t, config_for(p));
        if (t.rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(4000));
          return;
        }
        try {
          b.dispatch(args_of(p, t.rank()));
        } catch (const Error& e) {
          const std::string m = e.what();
          if (e.code() == ErrorCode::kTimeout && m.find("rank 2") != std::string::npos &&
              m.find("dispatch notify") != std::string::npos)
            throw;
          fail(t.rank(), "unexpected error: " + m);
        }
        fail(t.rank(), "no timeout");
      });
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
      EXPECT_NE(std::string(e.what()).find("dispatch notify"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(segments_left(before).empty());
  }
}

}  // namespace
}  // namespace epx::testing
