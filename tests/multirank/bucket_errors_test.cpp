// BucketBuffer's errors: a bad input on one member fails the call on every member with one
// message naming the argument, the rank and what was expected (origin_rank = that rank),
// and the buffer works afterwards; local misuse (an unknown group, a non-member, a pending
// call, use after destroy) throws on the calling rank only.
#include <gtest/gtest.h>

#include <functional>

#include "epx/bucket.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"

namespace epx::testing {
namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

/// Runs `call` on every rank; every rank must throw an Error with `code`, origin `origin`
/// and a message holding every one of `words`; then a good all_reduce must work.
void expect_collective_failure(BucketBuffer& b, int origin, ErrorCode code, const std::vector<std::string>& words,
                               const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    const std::string m = e.what();
    expect(e.code() == code, "rank " + std::to_string(b.rank()) + ": code " + to_string(e.code()) + ", expected " +
                                 to_string(code) + ": " + m);
    expect(e.origin_rank() == origin, "rank " + std::to_string(b.rank()) + ": origin " + std::to_string(e.origin_rank()) + ": " + m);
    for (const std::string& w : words) expect(m.find(w) != std::string::npos, "rank " + std::to_string(b.rank()) + ": '" + w + "' not in: " + m);
    float* x = reinterpret_cast<float*>(b.storage());
    x[0] = static_cast<float>(b.rank());
    b.all_reduce({{x, DType::kF32, Shape{1}}});
    const int P = b.num_ranks();
    expect(x[0] == static_cast<float>(P * (P - 1) / 2), "rank " + std::to_string(b.rank()) + ": the buffer does not work after the error");
    return;
  }
  throw std::runtime_error("rank " + std::to_string(b.rank()) + ": no error");
}

struct BadCase {
  const char* name;
  ErrorCode code;
  std::vector<std::string> words;
  /// The call, with the bad input on rank `bad` only.
  std::function<void(BucketBuffer&, int bad)> call;
};

MutableView f32(BucketBuffer& b, std::size_t off, std::int64_t n) { return {b.storage() + off, DType::kF32, Shape{n}}; }

std::vector<BadCase> bad_cases() {
  return {
      {"SizesDiffer", ErrorCode::kShapeMismatch, {"srcs[1]", "bytes", "every member passes the same sizes"},
       [](BucketBuffer& b, int bad) { b.all_reduce({f32(b, 0, 16), f32(b, 4096, b.rank() == bad ? 32 : 16)}); }},
      {"SizesDifferAcrossPaths", ErrorCode::kShapeMismatch, {"srcs[0]", "bytes", "every member passes the same sizes"},
       [](BucketBuffer& b, int bad) { b.all_reduce({f32(b, 0, b.rank() == bad ? 65536 : 16)}); }},  // mapped vs one-shot
      {"TooManyTensors", ErrorCode::kInvalidArgument, {"65 tensors", "at most 64"},
       [](BucketBuffer& b, int bad) {
         std::vector<MutableView> xs;
         for (int i = 0; i < (b.rank() == bad ? 65 : 64); ++i) xs.push_back(f32(b, static_cast<std::size_t>(i) * 64, 4));
         b.all_reduce(xs);
       }},
      {"OutsideTheStorage", ErrorCode::kInvalidArgument, {"srcs[0]", "outside the buffer's storage"},
       [](BucketBuffer& b, int bad) {
         std::vector<float> mine(48);
         b.reduce_scatter({b.rank() == bad ? MutableView{mine.data(), DType::kF32, Shape{48}} : f32(b, 0, 48)});
       }},
      {"NotFloat32", ErrorCode::kDtypeMismatch, {"srcs[0]", "float32", "bf16"},
       [](BucketBuffer& b, int bad) {
         b.all_reduce({b.rank() == bad ? MutableView{b.storage(), DType::kBF16, Shape{32}} : f32(b, 0, 16)});
       }},
      {"Misaligned", ErrorCode::kInvalidArgument, {"srcs[0]", "misaligned"},
       [](BucketBuffer& b, int bad) { b.all_reduce({f32(b, b.rank() == bad ? 2 : 0, 16)}); }},
      {"ShardsDoNotSplit", ErrorCode::kShapeMismatch, {"srcs[0]", "equal shards"},
       [](BucketBuffer& b, int) { b.reduce_scatter({f32(b, 0, 4 * b.num_ranks() + (b.rank() == 0 ? 1 : 0))}); }},
      {"Overlap", ErrorCode::kInvalidArgument, {"srcs[0] and srcs[1] overlap"},
       [](BucketBuffer& b, int bad) { b.all_reduce({f32(b, 0, 16), f32(b, b.rank() == bad ? 32 : 64, 16)}); }},
      {"NoTensors", ErrorCode::kInvalidArgument, {"no tensors"},
       [](BucketBuffer& b, int bad) {
         std::vector<MutableView> xs;
         if (b.rank() != bad) xs.push_back(f32(b, 0, 4));
         b.all_reduce(xs);
       }},
      {"AllGatherDstTooSmall", ErrorCode::kShapeMismatch, {"dsts[0]", "group size x src bytes"},
       [](BucketBuffer& b, int bad) {
         const std::int64_t n = b.num_ranks() * 8 - (b.rank() == bad ? 1 : 0);
         b.all_gather({TensorView(b.storage() + 8192, DType::kF32, Shape{8})}, {f32(b, 0, n)});
       }},
      {"InPlaceShardOutside", ErrorCode::kInvalidArgument, {"srcs[0]", "in place"},
       [](BucketBuffer& b, int bad) {
         const std::size_t off = b.rank() == bad ? 0 : static_cast<std::size_t>(b.group_rank(0)) * 64;
         b.all_gather({TensorView(b.storage() + off, DType::kF32, Shape{16})});
       }},
      {"ScaleDiffers", ErrorCode::kInvalidArgument, {"scale", "every member passes the same scale"},
       [](BucketBuffer& b, int bad) { b.all_reduce({f32(b, 0, 16)}, b.rank() == bad ? 0.5f : 1.0f); }},
      {"OpDiffers", ErrorCode::kInvalidArgument, {"reduce_scatter", "all_reduce"},
       [](BucketBuffer& b, int bad) {
         if (b.rank() == bad) b.reduce_scatter({f32(b, 0, 16 * b.num_ranks())});
         else b.all_reduce({f32(b, 0, 16 * b.num_ranks())});
       }},
  };
}

struct ErrParam {
  TransportKind transport;
  int ranks;
  std::size_t bad_case;
};

class BucketErrors : public ::testing::TestWithParam<ErrParam> {};

TEST_P(BucketErrors, BadInputOnOneRankFailsEveryRankNamingIt) {
  const ErrParam p = GetParam();
  const BadCase bc = bad_cases()[p.bad_case];
  const int bad = p.ranks - 1;
  launch({.num_ranks = p.ranks, .transport = p.transport}, [&](Transport& t) {
    BucketBuffer b(t, {world_ranks(t.num_ranks())}, std::size_t{1} << 20);
    const int origin = std::string(bc.name) == "ShardsDoNotSplit" ? 0 : bad;
    std::vector<std::string> words = bc.words;
    words.push_back("rank " + std::to_string(origin));
    expect_collective_failure(b, origin, bc.code, words, [&] { bc.call(b, bad); });
  });
}

std::vector<ErrParam> err_params() {
  std::vector<ErrParam> v;
  for (std::size_t i = 0; i < bad_cases().size(); ++i) {
    v.push_back({TransportKind::kThreads, 4, i});
    v.push_back({TransportKind::kShm, 3, i});
  }
  v.push_back({TransportKind::kSim, 3, 0});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, BucketErrors, ::testing::ValuesIn(err_params()),
                         [](const ::testing::TestParamInfo<ErrParam>& i) {
                           return std::string(bad_cases()[i.param.bad_case].name) + "_" + to_string(i.param.transport);
                         });

TEST(BucketErrors, EveryRankWithTheSameProblemSaysEveryRank) {
  launch({.num_ranks = 3, .transport = TransportKind::kThreads}, [](Transport& t) {
    BucketBuffer b(t, {world_ranks(3)}, 4096);
    std::vector<float> mine(4);
    expect_collective_failure(b, -1, ErrorCode::kInvalidArgument, {"every rank", "outside the buffer's storage"},
                              [&] { b.all_reduce({{mine.data(), DType::kF32, Shape{4}}}); });
  });
}

TEST(BucketErrors, LocalMisuseThrowsOnTheCallingRankOnly) {
  launch({.num_ranks = 4, .transport = TransportKind::kThreads}, [](Transport& t) {
    BucketBuffer b(t, {world_ranks(4), {0, 1}, {2, 3}}, 4096);
    MutableView x{b.storage(), DType::kF32, Shape{8}};
    auto local = [&](const std::string& word, const std::function<void()>& f) {
      try {
        f();
      } catch (const Error& e) {
        expect(std::string(e.what()).find(word) != std::string::npos, std::string("'") + word + "' not in: " + e.what());
        return;
      }
      throw std::runtime_error("no error for " + word);
    };
    local("must name one", [&] { b.all_reduce({x}); });
    local("group 5 unknown", [&] { b.all_reduce({x}, 1.0f, 5); });
    local("not a member of group", [&] { b.all_reduce({x}, 1.0f, b.rank() < 2 ? 2 : 1); });
    // A pending asynchronous call refuses the next one, then the buffer goes on.
    BucketEvent ev = b.all_reduce_async({x}, 1.0f, 0);
    local("a call is pending", [&] { b.all_reduce({x}, 1.0f, 0); });
    ev.wait();
    b.all_reduce({x}, 1.0f, 0);
    b.destroy();
    b.destroy();  // idempotent
    expect(b.window_bytes() == 0, "window after destroy");
    local("destroyed", [&] { b.all_reduce({x}, 1.0f, 0); });
  });
}

TEST(BucketErrors, FailCallFailsEveryNamedMember) {
  launch({.num_ranks = 4, .transport = TransportKind::kThreads}, [](Transport& t) {
    BucketBuffer b(t, {world_ranks(4), {0, 1}}, 4096);
    if (b.rank() >= 2) return;  // ranks 2 and 3 are not in {0, 1}
    try {
      if (b.rank() == 1) b.fail_call({0, 1}, "all_reduce", "group: not a group of this buffer");
      else b.all_reduce({{b.storage(), DType::kF32, Shape{4}}}, 1.0f, 1);
    } catch (const Error& e) {
      expect(e.origin_rank() == 1 && std::string(e.what()).find("not a group of this buffer") != std::string::npos, e.what());
      return;
    }
    throw std::runtime_error("no error");
  });
}

TEST(BucketErrors, ConstructionWithDifferentGroupsNamesTheRank) {
  launch({.num_ranks = 3, .transport = TransportKind::kThreads}, [](Transport& t) {
    try {
      BucketBuffer b(t, {t.rank() == 2 ? std::vector<int>{0, 1} : world_ranks(3)}, 4096);
    } catch (const Error& e) {
      expect(e.origin_rank() == 2 && std::string(e.what()).find("groups[0]") != std::string::npos, e.what());
      return;
    }
    throw std::runtime_error("no error");
  });
}

}  // namespace
}  // namespace epx::testing
