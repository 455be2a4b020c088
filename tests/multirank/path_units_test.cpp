// Each data path unit (src/ep/paths/) driven alone, through a minimal Buffer whose
// config and call sequence make the support table name exactly that path, on the
// deferred-put transport (puts complete late, in reverse order; deferred_put_transport.hpp)
// — except pull, which by definition reads mapped peers (the deferred transport maps none)
// and runs on threads. Every (path x protocol the table allows for it) is one test (named
// DeferredPuts/PathUnit.*/<path>_<protocol>, so the ThreadSanitizer run picks them up); every
// call checks CallStats::path (the unit that ran) and the reference's bits: compact,
// expanded with weights (where the path takes it) and FP8, fresh and cached dispatches and
// the combines between them, on two queues, and a combine with an older handle after a
// dispatch of another routing. tests/multirank/mutants.py runs each known-bug mutant
// against its path's cases here too (docs/engine.md, "Tests, and the bugs ...").
#include <gtest/gtest.h>

#include <cstring>

#include "deferred_put_transport.hpp"
#include "round_trip_cases.hpp"
#include "epx/spi/support.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

constexpr int kRanks = kCaseRanks;

struct PathCase {
  spi::Path path;
  Protocol protocol;
  std::string name() const { return std::string(spi::rule(path).key) + "_" + spi::rule(protocol).name; }
};

// Every registered path x every registered protocol its row takes (a unit named in
// paths/units.cpp or protocols/units.cpp is picked up here without an edit).
std::vector<PathCase> cases() {
  std::vector<PathCase> v;
  for (const spi::PathRule& r : spi::kPaths)
    for (const spi::ProtocolRule& p : spi::kProtocols)
      if (spi::takes(r, p.protocol)) v.push_back({r.path, p.protocol});
  return v;
}

// The config under which the table names `path` (base path; rows first: no output pool).
BufferConfig config_of(const ref::Problem& p, const PathCase& c) {
  BufferConfig config = config_for(p, 2);
  config.max_tokens_per_rank = 16;
  config.dataplane.protocol = c.protocol;
  config.dataplane.queues = 2;  // two queues: what one queue's quiet frees must not be another's
  config.collect_stats = true;
  if (c.path == spi::Path::kRelay) {
    config.dataplane.schedule = parse_schedule("hierarchical");
    config.dataplane.topology = "builtin:servers:2";
  }
  if (c.path == spi::Path::kRing) config.ring_rows = 3;  // far fewer rows than a rank receives: many credits
  if (c.path == spi::Path::kRowsFirst) config.output_pool_bytes = 0;
  // Pull reads y over one-copy outputs: room for the three expanded ones a run holds at once
  // (a row per slot: more than the auto pool's one compact output).
  if (c.path == spi::Path::kPull)
    config.output_pool_bytes =
        static_cast<std::int64_t>(6 * output_block_bytes(kRanks * config.max_tokens_per_rank, p.hidden, DType::kBF16));
  // Direct and pull: combines right after their dispatch exchange first (else these small
  // ones would go replies first with the pool, DataPlaneOptions::replies_first_max_bytes).
  if (c.path == spi::Path::kDirect || c.path == spi::Path::kPull) config.dataplane.replies_first_max_bytes = 0;
  return config;
}

void expect_path(int r, const Buffer& b, spi::Path want, const char* call) {
  const std::string got = b.last_stats().path;
  if (got != spi::rule(want).key) fail(r, std::string(call) + " took path '" + got + "', want '" + spi::rule(want).key + "'");
}

// Fresh dispatch, combine, cached dispatch, combine, fresh dispatch, combine: every call
// takes the case's path where it applies to that kind of call (rows first: both kinds, each
// call following one of the other kind; pull: combines), the base path otherwise — and so
// does a new Buffer's first dispatch (`first`: nothing proved its peers' areas free yet).
// A combine of `from` (a dispatch of e) on the case's path: checks the path it took and its bits.
void combine_of(Buffer& b, int r, const Expected& e, DispatchResult& from, spi::Path want, const char* what) {
  const auto ur = static_cast<std::size_t>(r);
  const std::int64_t H = e.p.hidden;
  CombineArgs ca;
  ca.handle = &from.handle;
  ca.weighted = e.weighted;
  if (want == spi::Path::kPull) {  // y where the peers can read it: overwrite the one-copy recv_x in place
    if (!e.y[ur].empty()) std::memcpy(from.recv_x.data(), e.y[ur].data(), e.y[ur].size() * sizeof(std::uint16_t));
    ca.y = TensorView(from.recv_x.data(), DType::kBF16, {e.out[ur].rows, H});
  } else {
    ca.y = TensorView(e.y[ur].data(), DType::kBF16, {e.out[ur].rows, H});
  }
  const CombineResult got = b.combine(ca);
  expect_path(r, b, want, what);
  expect_bits(r, std::string(what) + ": combined_x", got.combined_x.data(), e.combined[ur]);
  if (!e.combined_unweighted.empty()) {  // the order inside a token's group of slots shows only unweighted
    ca.weighted = false;
    expect_bits(r, std::string(what) + ": combined_x (unweighted)", b.combine(ca).combined_x.data(), e.combined_unweighted[ur]);
  }
}

void run(Buffer& b, int r, const Expected& e, spi::Path path, bool first) {
  const auto ur = static_cast<std::size_t>(r);
  const BufferConfig& c = b.config();
  const spi::Path base = spi::base_path(c);
  const spi::Path dispatches = path == spi::Path::kRowsFirst ? path : base;
  const spi::Path combines = path == spi::Path::kPull || path == spi::Path::kRowsFirst ? path : base;
  const RankViews v = views_of(e.p, r);
  auto combine = [&](DispatchResult& from, const char* what) { combine_of(b, r, e, from, combines, what); };

  DispatchResult d = b.dispatch(dispatch_args(v, e.d));
  expect_path(r, b, first ? base : dispatches, first ? "the Buffer's first dispatch" : "fresh dispatch");
  expect_dispatch(r, e.p, e.d, e.out[ur], d);
  combine(d, "combine");
  DispatchArgs cached = dispatch_args(v, e.d);
  cached.handle = &d.handle;
  DispatchResult dc = b.dispatch(cached);
  expect_path(r, b, dispatches, "cached dispatch");
  expect_dispatch(r, e.p, e.d, e.out[ur], dc);
  combine(dc, "combine after the cached dispatch");
  DispatchResult again = b.dispatch(dispatch_args(v, e.d));
  expect_path(r, b, dispatches, "fresh dispatch after a combine");
  expect_dispatch(r, e.p, e.d, e.out[ur], again);
  combine(again, "combine of the second fresh dispatch");
}

// A combine with an older handle, after a fresh dispatch of another routing: what the
// window holds of a dispatch (the relays' records, the metadata) is the newer one's now, so
// the combine must go by its handle alone (and, rows first, cannot go replies first).
void older_handle(Buffer& b, int r, const Expected& e, const Expected& other, spi::Path path) {
  const auto ur = static_cast<std::size_t>(r);
  DispatchResult d = b.dispatch(dispatch_args(views_of(e.p, r), e.d));
  expect_dispatch(r, e.p, e.d, e.out[ur], d);
  expect_dispatch(r, other.p, other.d, other.out[ur], b.dispatch(dispatch_args(views_of(other.p, r), other.d)));
  combine_of(b, r, e, d, path == spi::Path::kPull ? path : spi::base_path(b.config()), "combine with an older handle");
}

class PathUnit : public ::testing::TestWithParam<PathCase> {};

TEST_P(PathUnit, TakesItsPathAndMatchesReferenceBitForBit) {
  const PathCase& c = GetParam();
  const spi::PathRule& rule = spi::rule(c.path);
  std::vector<Expected> problems;
  problems.push_back(expect(fixture(false, 70), false, false));
  if (rule.expanded) problems.push_back(expect(fixture(false, 71), true, true));
  if (c.path != spi::Path::kPull) problems.push_back(expect(fixture(true, 72), false, false));  // pull: y is bf16 over recv_x
  const Expected other = expect(fixture(false, 73), false, false);  // another routing
  const BufferConfig config = config_of(problems[0].p, c);
  // The support table must name this path for this config (else the case tests nothing).
  ASSERT_TRUE(c.path == spi::base_path(config) || spi::allows(c.path, config, true)) << c.name();
  const bool deferred_puts = !rule.needs_peer_window;
  launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    DeferredPutTransport deferred(t, c.protocol);
    Transport& on = deferred_puts ? static_cast<Transport&>(deferred) : t;
    Buffer buffer(on, config);
    for (const Expected& e : problems) run(buffer, t.rank(), e, c.path, &e == &problems.front());
    older_handle(buffer, t.rank(), problems.front(), other, c.path);
    if (deferred_puts && deferred.delivered() == 0) fail(t.rank(), "no put went through the deferred transport");
  });
}

INSTANTIATE_TEST_SUITE_P(DeferredPuts, PathUnit, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// Rows big enough that each worker's tokens span several send blocks (the direct path sends
// a block of rows to every destination before its next ones; the threads transport states
// no put costs, so the auto send policy keeps 256 KiB blocks): 16 KiB bf16 rows are 16
// tokens a block, FP8 rows (8 KiB + scales) 31; 2 workers of 35 / 22 / 16 tokens, so runs
// of consecutive tokens cross block edges, in every layout and protocol. The explicit
// policies (whole, blocks of one row, of 3 rows) give the same bits.
TEST(DeferredPutBlocks, DirectAndRowsFirstSendAcrossBlockEdges) {
  auto big = [](bool fp8, std::uint64_t seed) {
    ref::FixtureOptions f = fixture(fp8, seed);
    f.hidden = 8192;
    f.tokens_per_rank = {70, 0, 45, 33};
    return f;
  };
  std::vector<Expected> problems;
  problems.push_back(expect(big(false, 80), false, false));
  problems.push_back(expect(big(false, 81), true, true));
  problems.push_back(expect(big(true, 82), false, false));
  const Expected other = expect(big(false, 83), false, false);
  const SendPolicy policies[] = {{}, {SendPolicyKind::kWhole, 0}, {SendPolicyKind::kBlock, 1}, {SendPolicyKind::kBlock, 3 * 16384}};
  for (const spi::Path path : {spi::Path::kDirect, spi::Path::kRowsFirst})
    for (const spi::ProtocolRule& proto : spi::kProtocols)
      for (const SendPolicy& policy : policies) {
        if (!spi::takes(spi::rule(path), proto.protocol)) continue;
        // The explicit policies with the explicit protocol only: a policy orders the puts, not how they complete.
        if (policy.kind != SendPolicyKind::kAuto && proto.protocol != Protocol::kExplicit) continue;
        const PathCase c{path, proto.protocol};
        SCOPED_TRACE(c.name() + " send policy " + std::to_string(static_cast<int>(policy.kind)) + "/" + std::to_string(policy.block_bytes));
        BufferConfig config = config_of(problems[0].p, c);
        config.max_tokens_per_rank = 70;
        config.dataplane.send_policy = policy;
        launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
          DeferredPutTransport deferred(t, c.protocol);
          Buffer buffer(deferred, config);
          for (const Expected& e : problems) run(buffer, t.rank(), e, c.path, &e == &problems.front());
          older_handle(buffer, t.rank(), problems.front(), other, c.path);
        });
      }
}

// The table names one path per call, from the config and the call's facts (and refuses,
// with the same function, what the paths cannot do).
TEST(PathTable, NamesOnePathPerCall) {
  BufferConfig c;
  c.output_pool_bytes = 0;
  EXPECT_EQ(spi::dispatch_path(c, false), spi::Path::kDirect);
  EXPECT_EQ(spi::dispatch_path(c, true), spi::Path::kRowsFirst);
  EXPECT_EQ(spi::combine_path(c, true, true), spi::Path::kRowsFirst);
  EXPECT_EQ(spi::combine_path(c, false, true), spi::Path::kPull);
  EXPECT_EQ(spi::combine_path(c, false, false), spi::Path::kDirect);
  c.output_pool_bytes = -1;  // with the pool, rows never go first; replies may (the call's size decides)
  EXPECT_EQ(spi::dispatch_path(c, true), spi::Path::kDirect);
  EXPECT_EQ(spi::combine_path(c, true, false), spi::Path::kRowsFirst);
  EXPECT_TRUE(spi::allows_replies_first(c));
  c.dataplane.protocol = Protocol::kFlag;  // flagged rows are not where y lies
  EXPECT_EQ(spi::combine_path(c, false, true), spi::Path::kDirect);
  c.dataplane.protocol = Protocol::kExplicit;
  c.ring_rows = 4;
  EXPECT_EQ(spi::dispatch_path(c, true), spi::Path::kRing);
  EXPECT_EQ(spi::combine_path(c, false, true), spi::Path::kRing);
  c.ring_rows = 0;
  c.dataplane.schedule = parse_schedule("hierarchical");
  EXPECT_EQ(spi::dispatch_path(c, false), spi::Path::kRelay);
  EXPECT_EQ(spi::combine_path(c, false, true), spi::Path::kRelay);
}

}  // namespace
}  // namespace epx::testing
