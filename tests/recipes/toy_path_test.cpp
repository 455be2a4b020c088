// The "Add a data path" recipe of docs/engine.md, followed once from outside the library: a
// dispatch path of its own file's making ("whole": worker 0 puts each destination's whole
// segment at once — the rows, their scales and metadata in one put each where they are
// contiguous — while the other workers only complete their channels), with its row of the
// support table beside it, registered for the test's scope. It keeps the push combine
// (a path may take another's side). Checked as the library's paths are: CallStats::path
// names it on every call, every output matches the reference bit for bit on the
// deferred-put transport, its row's refusal reaches every rank, and once it is removed the
// same config takes the direct path again; chosen by name (DataPlaneOptions::path), it runs
// where direct would, and a name that does not fit is refused on every rank.
#include <gtest/gtest.h>

#include <optional>

#include "deferred_put_transport.hpp"
#include "path.hpp"
#include "recipe_support.hpp"

namespace epx::detail {
namespace {

class WholeSegments final : public DispatchPath {
 public:
  void send(PathContext m, const DispatchStep& s) const override {
    const HandleState& h = *s.h;
    const RoutingPlan& plan = h.plan;
    if (s.expert_base) m.stage_meta(h);
    m.stage_scales(h, *s.a);
    const std::size_t per_row = s.row_bytes + s.scale_bytes + (s.expert_base ? m.setup.geo.meta_bytes() : 0);
    m.run_workers([&](int w) {
      std::vector<std::uint64_t> bytes(static_cast<std::size_t>(m.setup.P), 0);
      for (int d = 0; w == 0 && d < m.setup.P; ++d) bytes[static_cast<std::size_t>(d)] = plan.tokens_to(d) * per_row;
      Impl::Sender send = m.sender(w, m.setup.geo.dispatch_signal(m.setup.rank, w), bytes, m.setup.visit_order);
      for (int d : m.setup.visit_order) {
        if (w == 0)
          m.put_segment(send, h, *s.a, s.expert_base, d, 0, plan.tokens_to(d), m.setup.geo.send_row(h, d, 0, false),
                        (*s.landing)[static_cast<std::size_t>(d)]);
        send.end_channel(d);  // every worker completes its channel: the receiver waits for all W
      }
      send.finish();
    });
  }

  void receive(PathContext m, const DispatchStep& s) const override {
    m.await_rows(&Geometry::dispatch_signal, "dispatch data", s.h->recv_begin,
                 {{Region::kMeta, s.fresh ? m.setup.geo.meta_bytes() : 0}, {Region::kData, s.row_bytes}, {Region::kScales, s.scale_bytes}},
                 s.landed);
  }
};

// A value of its own after the built-in paths; the base path of every config direct would take
// (asked before direct, being registered after it).
constexpr auto kWhole = static_cast<spi::Path>(16);
constexpr spi::PathRule kWholeRow{kWhole, "whole segments", {true, true, false}, "the toy is checked with signalled protocols only",
                                  true, true, false, false, nullptr, true, "whole", true, [](const BufferConfig& c) {
                                    return c.ring_rows <= 0 && c.dataplane.schedule.kind != ScheduleKind::kHierarchical;
                                  }};

const PathUnit& whole_path() {
  static const WholeSegments unit;
  static const PathUnit path{kWholeRow, &unit, &push_combine()};
  return path;
}

}  // namespace
}  // namespace epx::detail

namespace epx::testing {
namespace {

BufferConfig toy_config(const ref::Problem& p, Protocol protocol) {
  BufferConfig c = config_for(p, 2);
  c.max_tokens_per_rank = 16;
  c.dataplane.protocol = protocol;
  c.dataplane.queues = 2;
  c.collect_stats = true;
  return c;
}

TEST(RecipePath, ToyPathRegistersRunsBitExactAndLeaves) {
  const std::vector<Expected> problems = recipe_problems();
  const std::size_t built_in = spi::kPaths.size();
  {
    const detail::RegisteredPath whole(detail::whole_path());
    ASSERT_EQ(spi::kPaths.size(), built_in + 1);
    EXPECT_STREQ(spi::rule(detail::kWhole).key, "whole");
    for (const Protocol protocol : {Protocol::kExplicit, Protocol::kTail}) {
      SCOPED_TRACE(to_string(protocol));
      const BufferConfig config = toy_config(problems[0].p, protocol);
      ASSERT_EQ(spi::base_path(config), detail::kWhole);
      ASSERT_EQ(spi::dispatch_path(config, true), detail::kWhole);  // rows first is direct's variant, not the toy's
      launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
        DeferredPutTransport deferred(t, protocol == Protocol::kTail, false);
        Buffer buffer(deferred, config);
        for (const Expected& e : problems) round_trip(buffer, t.rank(), e, "whole");
        if (deferred.delivered() == 0) fail(t.rank(), "no put went through the deferred transport");
      });
    }
    // The toy's row refuses flag: the Buffer refuses it on every rank, in the row's words.
    const BufferConfig flag = toy_config(problems[0].p, Protocol::kFlag);
    expect_error_on_every_rank([&](Transport& t) { Buffer buffer(t, flag); }, ErrorCode::kInvalidArgument,
                               "whole segments with protocol 'flag' is not supported: the toy is checked with signalled protocols only");
    // Another path under the same value or key is refused.
    EXPECT_THROW(detail::add_path(detail::whole_path()), Error);
  }
  // Removed: the table and the calls are the library's again.
  EXPECT_EQ(spi::kPaths.size(), built_in);
  EXPECT_EQ(spi::find_rule(detail::kWhole), nullptr);
  const BufferConfig config = toy_config(problems[0].p, Protocol::kExplicit);
  EXPECT_EQ(spi::base_path(config), spi::Path::kDirect);
  launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    Buffer buffer(t, config);
    const DispatchResult d = buffer.dispatch(dispatch_args(views_of(problems[0].p, t.rank()), problems[0].d));
    expect_path_key(t.rank(), buffer, "direct", "dispatch after the toy left");
  });
}

// DataPlaneOptions::path names the base path: among the paths whose base_of takes a config
// the name picks one (here direct, though the toy, registered later, would be asked first),
// and a name the registry does not hold, or a path that does not take the config, is refused
// on every rank in words that name the value and what may be named instead.
TEST(RecipePath, ToyPathChosenByName) {
  const std::vector<Expected> problems = recipe_problems();
  const auto named = [&](const std::string& name) {
    BufferConfig c = toy_config(problems[0].p, Protocol::kExplicit);
    c.dataplane.path = name;
    c.dataplane.replies_first_max_bytes = 0;  // direct's combines exchange first: every call on the base path
    return c;
  };
  const auto runs_on = [&](const BufferConfig& config, const std::string& key) {
    SCOPED_TRACE(key);
    launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      Buffer buffer(t, config);
      for (const Expected& e : problems) round_trip(buffer, t.rank(), e, key);
    });
  };
  {
    const detail::RegisteredPath whole(detail::whole_path());
    ASSERT_EQ(spi::base_path(named("")), detail::kWhole);
    ASSERT_EQ(spi::base_path(named("direct")), spi::Path::kDirect);
    ASSERT_EQ(spi::base_path(named("whole")), detail::kWhole);
    runs_on(named("direct"), "direct");
    runs_on(named("whole"), "whole");
    // The toy's base_of does not take a bounded receive area: named there, it is refused.
    BufferConfig ring = named("whole");
    ring.ring_rows = 8;
    expect_error_on_every_rank([&](Transport& t) { Buffer buffer(t, ring); }, ErrorCode::kInvalidArgument,
                               "data-plane path 'whole' (whole segments) does not take this buffer's config; its own base path is 'ring'");
    EXPECT_EQ(spi::refuse_path_name("whole"), "");
  }
  // Removed, its name is unknown; a per-call variant cannot be named either.
  expect_error_on_every_rank([&](Transport& t) { Buffer buffer(t, named("whole")); }, ErrorCode::kInvalidArgument,
                             "data-plane path 'whole' is not a registered base path; the registered ones: 'direct', 'relay', "
                             "'ring' ('rows_first', 'pull': per-call variants, which the calls choose)");
  expect_error_on_every_rank([&](Transport& t) { Buffer buffer(t, named("pull")); }, ErrorCode::kInvalidArgument,
                             "data-plane path 'pull' is not a registered base path");
  EXPECT_THROW(spi::base_path(named("whole")), Error);
  EXPECT_EQ(spi::base_path(named("")), spi::Path::kDirect);
}

// The toy's dispatch puts are its own: with one worker doing all of them, worker 1 of every
// dispatch issues none, while the direct path splits the tokens between both workers.
TEST(RecipePath, ToyPathPutsFromWorkerZeroOnly) {
  const Expected e = expect(fixture(false, 93), false, false);
  auto puts_of_worker_1 = [&](bool toy) {
    std::optional<detail::RegisteredPath> whole;
    if (toy) whole.emplace(detail::whole_path());
    std::vector<std::uint64_t> puts(kCaseRanks, 0);
    launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      Buffer buffer(t, toy_config(e.p, Protocol::kExplicit));
      const DispatchResult d = buffer.dispatch(dispatch_args(views_of(e.p, t.rank()), e.d));
      expect_dispatch(t.rank(), e.p, e.d, e.out[static_cast<std::size_t>(t.rank())], d);
      const WorkerStats& w1 = buffer.last_stats().workers[1];
      puts[static_cast<std::size_t>(t.rank())] = w1.puts + w1.local_puts;
    });
    std::uint64_t sum = 0;
    for (std::uint64_t p : puts) sum += p;
    return sum;
  };
  EXPECT_EQ(puts_of_worker_1(true), 0u);
  EXPECT_GT(puts_of_worker_1(false), 0u);
}

}  // namespace
}  // namespace epx::testing
