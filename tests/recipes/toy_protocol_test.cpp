// The "Add a completion protocol" recipe of docs/engine.md, followed once from outside the
// library: "quiet-tail" completes each channel as soon as a worker has put everything for
// its peer — a quiet of the channel's queue, then the signal — so, unlike tail, it relies on
// no ordering of signals after puts, and unlike explicit, a peer's rows need not wait for
// every other peer's. Its row says so (no guarantee needed; the paths take it where they take
// explicit). No path file changes: it runs on the direct, relay and ring paths, on the
// deferred-put transport without ordered signals (puts delivered late, in reverse order,
// only at a quiet or when the thread blocks), bit for bit against the reference; once it is
// removed, a config naming it is refused on every rank.
#include <gtest/gtest.h>

#include <atomic>

#include "deferred_put_transport.hpp"
#include "protocol.hpp"
#include "recipe_support.hpp"

namespace epx::detail {
namespace {

// How often the toy's hooks ran (the ring completes its rows by progress signals only).
std::atomic<std::uint64_t> hooks_run{0};

class QuietTail final : public CompletionProtocol {
 public:
  void end_channel(Sender& s, int d) const override {
    if (s.signal_slot() == Sender::kNoSignal) return;  // the header exchange completes these rows
    const int q = s.queue_of(d);
    s.impl().transport.quiet(q);
    s.impl().transport.signal(d, s.signal_slot(), s.impl().epoch, q);
    hooks_run.fetch_add(1, std::memory_order_relaxed);
  }
  // A progress signal (ring credits, relay chunks) must also be seen after the puts before it.
  void before_signal(Sender& s, int q) const override {
    s.impl().transport.quiet(q);
    hooks_run.fetch_add(1, std::memory_order_relaxed);
  }
};

constexpr auto kQuietTail = static_cast<Protocol>(8);
constexpr spi::ProtocolRule kQuietTailRow{kQuietTail, "quiet-tail", nullptr, "", true, "", nullptr, Protocol::kExplicit};

const ProtocolUnit& quiet_tail_protocol() {
  static const QuietTail unit;
  static const ProtocolUnit protocol{kQuietTailRow, unit};
  return protocol;
}

}  // namespace
}  // namespace epx::detail

namespace epx::testing {
namespace {

struct PathOf {
  const char* key;
  std::function<void(BufferConfig&)> select;
};

TEST(RecipeProtocol, ToyProtocolRunsOnEveryPathBitExact) {
  const std::vector<Expected> problems = recipe_problems();
  const std::size_t built_in = spi::kProtocols.size();
  const PathOf paths[] = {
      {"direct", [](BufferConfig&) {}},
      {"relay",
       [](BufferConfig& c) {
         c.dataplane.schedule = parse_schedule("hierarchical");
         c.dataplane.topology = "builtin:servers:2";
       }},
      {"ring", [](BufferConfig& c) { c.ring_rows = 3; }},  // far fewer rows than a rank receives: many credits
  };
  {
    const detail::RegisteredProtocol quiet_tail(detail::quiet_tail_protocol());
    ASSERT_EQ(spi::kProtocols.size(), built_in + 1);
    for (const PathOf& path : paths) {
      SCOPED_TRACE(path.key);
      BufferConfig config = config_for(problems[0].p, 2);
      config.max_tokens_per_rank = 16;
      config.dataplane.protocol = detail::kQuietTail;
      config.dataplane.queues = 2;
      config.dataplane.replies_first_max_bytes = 0;  // direct: combines after the exchange, signalled
      config.collect_stats = true;
      path.select(config);
      ASSERT_TRUE(spi::takes(spi::rule(spi::base_path(config)), detail::kQuietTail));
      const std::uint64_t before = detail::hooks_run.load();
      launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
        DeferredPutTransport deferred(t, /*ordered_signals=*/false, false);
        Buffer buffer(deferred, config);
        for (const Expected& e : problems) round_trip(buffer, t.rank(), e, path.key);
      });
      EXPECT_GT(detail::hooks_run.load(), before) << "the toy's hooks never ran";
    }
  }
  EXPECT_EQ(spi::kProtocols.size(), built_in);
  // Not registered: refused at construction, on every rank.
  BufferConfig config = config_for(problems[0].p, 2);
  config.dataplane.protocol = detail::kQuietTail;
  expect_error_on_every_rank([&](Transport& t) { Buffer buffer(t, config); }, ErrorCode::kInvalidArgument,
                             "protocol 8 is not a registered completion protocol");
}

}  // namespace
}  // namespace epx::testing
