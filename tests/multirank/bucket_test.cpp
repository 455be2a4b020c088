// BucketBuffer across P ranks (docs/spec.md §8), in the style of DeepEP's bucket tests: the cases of
// bucket_cases.hpp (many sizes, 1-8 tensors per call, several groups on one buffer, scales
// {1, 0, 0.25, -0.5, 2}, guards) with every algorithm on every transport it runs on, under
// every completion protocol it takes (BucketOptions::protocol), also over puts that land
// late (deferred_put_transport.hpp); the protocols the support table refuses.
#include <gtest/gtest.h>

#include <optional>

#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "multirank/bucket_cases.hpp"
#include "multirank/deferred_put_transport.hpp"

namespace epx::testing {
namespace {

using namespace bucket;

struct Param {
  TransportKind transport;
  int ranks;
  BucketAlgorithm algorithm;
  std::size_t chunk_bytes;
  const char* topology = "";  ///< BucketOptions::topology (machines for the two-level all_reduce)
  std::optional<Protocol> protocol{};  ///< BucketOptions::protocol (unset: the table's pick)
  int deferred = 0;  ///< 0: the transport itself; 1, 2: under a DeferredPutTransport, signals unordered / ordered
};

std::string protocol_suffix(const std::optional<Protocol>& p, int deferred = 0) {
  return (p ? std::string("_") + to_string(*p) : "") + (deferred ? (deferred == 2 ? "_deferred_ordered" : "_deferred") : "");
}

std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  std::string a = to_string(i.param.algorithm);
  for (char& ch : a)
    if (ch == '-') ch = '_';
  std::string topo = i.param.topology;
  topo = topo.empty() ? "" : "_servers" + topo.substr(topo.rfind(':') + 1);
  return std::string(to_string(i.param.transport)) + "_P" + std::to_string(i.param.ranks) + "_" + a + "_chunk" +
         std::to_string(i.param.chunk_bytes) + topo + protocol_suffix(i.param.protocol, i.param.deferred);
}

/// Whether case c's inputs fit a one-shot board slot of `chunk_bytes` (64-byte places).
bool fits_board(const Case& c, std::size_t chunk_bytes) {
  std::size_t b = 0;
  for (std::int64_t numel : c.numels) b += (static_cast<std::size_t>(numel) * (c.op == Op::kAllGather ? 1 : 4) + 63) / 64 * 64;
  return b <= chunk_bytes;
}

/// The algorithm a forced option must give (kNone: not checked). Two-level: the world group
/// only (the others do not span both machines in machine-major order).
BucketAlgorithm forced_algorithm(const Param& p, const Case& c, int n) {
  if (n == 1 || p.algorithm == BucketAlgorithm::kNone || p.algorithm == BucketAlgorithm::kStaged) return BucketAlgorithm::kNone;
  if (p.algorithm == BucketAlgorithm::kOneShot)
    return fits_board(c, p.chunk_bytes) ? BucketAlgorithm::kOneShot : BucketAlgorithm::kNone;
  if (c.op == Op::kAllGather) return p.algorithm == BucketAlgorithm::kDirect ? BucketAlgorithm::kDirect : BucketAlgorithm::kNone;
  if (p.algorithm == BucketAlgorithm::kTwoLevel)
    return c.op == Op::kAllReduce && c.group == 0 ? BucketAlgorithm::kTwoLevel : BucketAlgorithm::kNone;
  return p.algorithm == BucketAlgorithm::kDirect ? BucketAlgorithm::kNone : p.algorithm;
}

class BucketCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(BucketCollectives, EveryCaseBitExactOnEveryGroupWithGuardsIntact) {
  const Param prm = GetParam();
  launch({.num_ranks = prm.ranks, .transport = prm.transport}, [&](Transport& world) {
    std::optional<DeferredPutTransport> deferred;
    if (prm.deferred) deferred.emplace(world, prm.deferred == 2, false);
    Transport& t = deferred ? static_cast<Transport&>(*deferred) : world;
    const auto groups = groups_of(t.num_ranks());
    BucketBuffer b(t, groups, std::size_t{4} << 20,
                   {.topology = prm.topology, .chunk_bytes = prm.chunk_bytes, .algorithm = prm.algorithm, .protocol = prm.protocol});
    const bool big = prm.chunk_bytes == 0 || prm.algorithm == BucketAlgorithm::kMapped;
    for (const Case& c0 : cases_of(static_cast<int>(groups.size()), 7, big)) {
      const Case c = fit(c0, static_cast<int>(groups[static_cast<std::size_t>(c0.group)].size()));
      run_case(b, c, forced_algorithm(prm, c, static_cast<int>(groups[static_cast<std::size_t>(c.group)].size())));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Transports, BucketCollectives,
    ::testing::Values(Param{TransportKind::kThreads, 1, BucketAlgorithm::kNone, 0},
                      Param{TransportKind::kThreads, 3, BucketAlgorithm::kNone, 0},
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kNone, 4096},
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kMapped, 4096},
                      Param{TransportKind::kThreads, 5, BucketAlgorithm::kPipelined, 4096},
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kDirect, 0},
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kOneShot, std::size_t{1} << 20},
                      Param{TransportKind::kShm, 5, BucketAlgorithm::kOneShot, std::size_t{1} << 20},
                      Param{TransportKind::kShm, 4, BucketAlgorithm::kStaged, 0},
                      Param{TransportKind::kShm, 8, BucketAlgorithm::kNone, 0},
                      Param{TransportKind::kShm, 4, BucketAlgorithm::kPipelined, 8192},
                      Param{TransportKind::kSim, 4, BucketAlgorithm::kNone, 4096},
                      Param{TransportKind::kSim, 3, BucketAlgorithm::kNone, 0},
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kTwoLevel, 4096, "builtin:servers:2"},
                      Param{TransportKind::kThreads, 6, BucketAlgorithm::kTwoLevel, 8192, "builtin:servers:3"},
                      Param{TransportKind::kThreads, 8, BucketAlgorithm::kTwoLevel, 4096, "builtin:servers:2"},
                      Param{TransportKind::kSim, 4, BucketAlgorithm::kNone, 4096, "builtin:servers:2"},
                      // the completion protocols (BucketOptions::protocol)
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kNone, 4096, "", Protocol::kFlag},
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kDirect, 0, "", Protocol::kFlag},
                      Param{TransportKind::kShm, 5, BucketAlgorithm::kOneShot, std::size_t{1} << 20, "", Protocol::kFlag},
                      Param{TransportKind::kShm, 4, BucketAlgorithm::kMapped, 4096, "", Protocol::kExplicit},
                      Param{TransportKind::kThreads, 5, BucketAlgorithm::kPipelined, 4096, "", Protocol::kExplicit},
                      Param{TransportKind::kSim, 3, BucketAlgorithm::kNone, 0, "", Protocol::kExplicit},
                      // puts that land late: explicit (the pick without ordered signals), tail
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kNone, 4096, "", std::nullopt, 1},
                      Param{TransportKind::kThreads, 4, BucketAlgorithm::kPipelined, 4096, "", Protocol::kExplicit, 2},
                      Param{TransportKind::kThreads, 3, BucketAlgorithm::kStaged, 0, "", Protocol::kTail, 2}),
    param_name);

struct OneShotParam {
  TransportKind transport;
  int ranks;
  BucketAlgorithm algorithm;  ///< kNone (auto) or kOneShot (forced)
  std::optional<Protocol> protocol{};  ///< BucketOptions::protocol (unset: the table's pick)
};

/// What a call must run on threads and shm (64 KiB board slots): one-shot when the inputs
/// fit a slot (auto all_reduce: 16 KiB), else mapped (reductions) or direct (all_gather); a
/// group of one runs locally.
BucketAlgorithm expected_algorithm(const OneShotParam& p, const Case& c, int n) {
  if (n == 1) return BucketAlgorithm::kStaged;
  const bool auto_reduce = c.op == Op::kAllReduce && p.algorithm == BucketAlgorithm::kNone;
  if (fits_board(c, auto_reduce ? std::size_t{16} << 10 : std::size_t{64} << 10)) return BucketAlgorithm::kOneShot;
  return c.op == Op::kAllGather ? BucketAlgorithm::kDirect : BucketAlgorithm::kMapped;
}

class BucketOneShot : public ::testing::TestWithParam<OneShotParam> {};

// Small calls, auto or forced one-shot: 1..64 tensors of odd sizes, the slot's edge (and
// auto all_reduce's 16 KiB), every group interleaved on one buffer (each group's boards
// alternate on their own), the scales, guards: bit-exact against the reference, and the
// algorithm each call ran checked.
TEST_P(BucketOneShot, SmallCallsBitExactOnEveryGroup) {
  const OneShotParam prm = GetParam();
  launch({.num_ranks = prm.ranks, .transport = prm.transport}, [&](Transport& t) {
    const auto groups = groups_of(t.num_ranks());
    BucketBuffer b(t, groups, std::size_t{4} << 20,
                   {.topology = "", .chunk_bytes = 0, .algorithm = prm.algorithm, .protocol = prm.protocol});
    for (const Case& c0 : one_shot_cases(static_cast<int>(groups.size()), 11)) {
      const int n = static_cast<int>(groups[static_cast<std::size_t>(c0.group)].size());
      const Case c = fit(c0, n);
      run_case(b, c, expected_algorithm(prm, c, n));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, BucketOneShot,
                         ::testing::Values(OneShotParam{TransportKind::kThreads, 3, BucketAlgorithm::kNone},
                                           OneShotParam{TransportKind::kThreads, 4, BucketAlgorithm::kOneShot},
                                           OneShotParam{TransportKind::kShm, 3, BucketAlgorithm::kOneShot},
                                           OneShotParam{TransportKind::kShm, 8, BucketAlgorithm::kNone},
                                           OneShotParam{TransportKind::kThreads, 3, BucketAlgorithm::kNone, Protocol::kFlag},
                                           OneShotParam{TransportKind::kShm, 8, BucketAlgorithm::kNone, Protocol::kFlag},
                                           OneShotParam{TransportKind::kShm, 3, BucketAlgorithm::kOneShot, Protocol::kFlag},
                                           OneShotParam{TransportKind::kThreads, 4, BucketAlgorithm::kOneShot, Protocol::kExplicit}),
                         [](const ::testing::TestParamInfo<OneShotParam>& i) {
                           return std::string(to_string(i.param.transport)) + "_P" + std::to_string(i.param.ranks) + "_" +
                                  (i.param.algorithm == BucketAlgorithm::kNone ? "auto" : "forced") +
                                  protocol_suffix(i.param.protocol);
                         });

// A protocol the transport (or the forced algorithm) cannot run is refused on every rank at
// construction, naming the kind, what was asked and why (epx/spi/kind_support.hpp).
TEST(BucketProtocols, AProtocolThatCannotRunIsRefusedNamingWhy) {
  auto expect_refused = [](int r, const std::vector<std::string>& words, auto&& make) {
    try {
      make();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnsupported) fail(r, std::string("code ") + to_string(e.code()) + ": " + e.what());
      for (const std::string& w : words)
        if (std::string(e.what()).find(w) == std::string::npos) fail(r, "the error does not say '" + w + "': " + e.what());
      return;
    }
    fail(r, "no error was raised");
  };
  launch({.num_ranks = 3, .transport = TransportKind::kThreads}, [&](Transport& world) {
    const int r = world.rank();
    const auto groups = groups_of(3);
    expect_refused(r, {"rank " + std::to_string(r), "bucket (channels)", "'flag'", "boards"}, [&] {
      BucketBuffer b(world, groups, 4096, {.topology = "", .chunk_bytes = 0, .algorithm = BucketAlgorithm::kStaged, .protocol = Protocol::kFlag});
    });
    DeferredPutTransport unordered(world, false, true);
    expect_refused(r, {"bucket (channels)", "'tail'", "ordered", "deferred"},
                   [&] { BucketBuffer b(unordered, groups, 4096, {.topology = "", .chunk_bytes = 0, .algorithm = BucketAlgorithm::kNone, .protocol = Protocol::kTail}); });
    expect_refused(r, {"bucket (channels)", "'flag'", "not supported"},
                   [&] { BucketBuffer b(unordered, groups, 4096, {.topology = "", .chunk_bytes = 0, .algorithm = BucketAlgorithm::kNone, .protocol = Protocol::kFlag}); });
  });
  launch({.num_ranks = 2, .transport = TransportKind::kSim}, [&](Transport& t) {  // mapped caps, no peer window
    expect_refused(t.rank(), {"bucket.create", "'flag'", "boards"},
                   [&] { BucketBuffer b(t, groups_of(2), 4096, {.topology = "", .chunk_bytes = 0, .algorithm = BucketAlgorithm::kNone, .protocol = Protocol::kFlag}); });
  });
}

}  // namespace
}  // namespace epx::testing
