// Conformance of the data-plane options: every (schedule x queues x queue split x protocol
// x aggregation) combination, on every transport, gives the reference's bits for dispatch
// (compact, expanded, FP8, cached) and combine (wide-range y, so the order of additions
// shows). Plus a stress test: one buffer reused for many calls whose routing changes every
// time, to catch stale data and slot-reuse races (ThreadSanitizer runs it on threads).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "deferred_put_transport.hpp"
#include "round_trip_cases.hpp"
#include "epx/spi/support.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

struct QueueChoice {
  int queues;
  const char* split;
};

struct Combo {
  std::string schedule;
  QueueChoice queues;
  Protocol protocol;
  std::size_t aggregate;
  // No output pool (copies; calls right after one of the other kind go rows first), and
  // streaming stores in every call (stream_min_call_bytes 0; with the pool these small calls
  // write through the cache), so both kinds of stores meet every path, protocol and transport.
  bool copy = false;
  bool node_first = false;  // hierarchical: combine order node-first
  bool selections = false;  // direct: combine replies per (token, expert) selection
  std::size_t relay_chunk = DataPlaneOptions::kRelayChunkAuto;  // hierarchical: relay chunk bytes (1: a row per chunk)
  std::string name() const {
    std::string n = schedule + (node_first ? "_nodefirst" : "") + (selections ? "_selections" : "") + "_q" + std::to_string(queues.queues) + "_" + queues.split +
                    "_" + spi::rule(protocol).name + "_agg" + std::to_string(aggregate) + (copy ? "_copy" : "") +
                    (relay_chunk == DataPlaneOptions::kRelayChunkAuto ? "" : "_chunk" + std::to_string(relay_chunk));
    for (char& ch : n)
      if (ch == ':') ch = 'x';
    return n;
  }
  DataPlaneOptions options() const {
    DataPlaneOptions o;
    o.schedule = parse_schedule(schedule);
    // Relays need servers: two servers of two ranks.
    if (o.schedule.kind == ScheduleKind::kHierarchical) o.topology = "builtin:servers:2";
    o.queues = queues.queues;
    o.queue_split = parse_queue_split(queues.split);
    o.protocol = protocol;
    o.aggregate_bytes = aggregate;
    o.combine_order = node_first ? CombineOrder::kNodeFirst : CombineOrder::kFlat;
    o.combine_replies = selections ? CombineReplies::kSelections : CombineReplies::kPartials;
    o.relay_chunk_bytes = relay_chunk;
    if (copy) o.stream_min_call_bytes = 0;
    return o;
  }
  // The node of each rank where the combine is node-first (builtin:servers:2), else null.
  const std::vector<int>* nodes() const {
    static const std::vector<int> two_servers = {0, 0, 1, 1};
    return node_first ? &two_servers : nullptr;
  }
};

// What the engine's support table (epx/spi/support.hpp) accepts on a transport that gives
// every guarantee; the refused combinations are tested apart (RefusesWhatItCannotHonour).
bool supported(const Combo& c) {
  BufferConfig config;
  config.dataplane = c.options();
  TransportCaps all;
  all.ordered_signal_per_queue = all.flagged_puts = true;
  return spi::refuse_config(config, all).empty();
}

// Every path (direct: the flat, rotated and grouped schedules; relay: hierarchical) x every
// registered protocol the table accepts for it (spi::kProtocols: a protocol unit the library
// adds is picked up), each run on every transport (the instantiations), in full. Queue choice (count + split) x schedule x aggregation are covered pairwise inside
// each (path, protocol): every pair of values of two of them appears in some combination
// (row (i, j) of queue choice i and schedule j takes aggregation (i + j) % 3, so for a fixed
// queue choice the schedules walk all three aggregations, and for a fixed schedule the
// queue choices do). The output pool (one-copy outputs, the default, or none: copies and
// rows first) alternates with (i + j) (relays: (i + k)), so it meets every value of the
// other three too. EPX_FULL_CONFORMANCE=1 runs the whole cross product instead (the pool
// still alternating).
std::vector<Combo> combos() {
  const QueueChoice queue_choices[] = {{1, "rr"},  {2, "rr"},  {2, "1:1"}, {2, "3:1"},
                                       {2, "1:3"}, {2, "bytes"}, {4, "rr"}, {4, "bytes"}};
  // off (a put per row), one bf16 row (two fp8 rows) per put, and the default.
  const std::size_t aggregates[] = {0, 1000, std::size_t{1} << 20};
  const bool full = std::getenv("EPX_FULL_CONFORMANCE") != nullptr && std::string(std::getenv("EPX_FULL_CONFORMANCE")) == "1";
  // The relays' node-first combine: queue choice x aggregation pairwise (k = i mod 3); so
  // are the direct path's per-selection replies (two schedules).
  struct Paths {
    std::vector<const char*> schedules;
    bool node_first, pairwise, selections = false;
  };
  const std::vector<Paths> paths = {{{"flat", "rotated", "grouped:2", "grouped:4"}, false, true},
                                    {{"hierarchical"}, false, false},
                                    {{"hierarchical"}, true, true},
                                    {{"rotated", "grouped:2"}, false, true, true}};
  std::vector<Combo> v;
  for (const Paths& path : paths)
    for (const spi::ProtocolRule& protocol_row : spi::kProtocols)
      for (std::size_t i = 0; i < std::size(queue_choices); ++i)
        for (std::size_t j = 0; j < path.schedules.size(); ++j)
          for (std::size_t k = 0; k < std::size(aggregates); ++k) {
            if (!full && path.pairwise && k != (i + j) % std::size(aggregates)) continue;
            const bool copy = (i + j + (path.schedules.size() > 1 ? 0 : k)) % 2 == 1;
            Combo c{path.schedules[j], queue_choices[i], protocol_row.protocol, aggregates[k], copy, path.node_first, path.selections};
            // Relays: auto (serial on these transports), a row per chunk, or a few rows per chunk.
            if (path.schedules[0] == std::string("hierarchical"))
              c.relay_chunk = std::array<std::size_t, 3>{DataPlaneOptions::kRelayChunkAuto, 1, 1000}[(i + k) % 3];
            if (supported(c)) v.push_back(c);
          }
  return v;
}

constexpr int kRanks = kCaseRanks;

// Dispatch, cached dispatch, combine, cached dispatch, combine, fresh dispatch and combine
// of one expected routing on this rank's buffer. Every call after the first cached one (a
// dispatch right after a combine, a combine right after a dispatch) puts its rows before
// the header exchange where the data plane allows it.
void check_round_trip(Buffer& buffer, int r, const Expected& e) {
  const auto ur = static_cast<std::size_t>(r);
  const RankViews v = views_of(e.p, r);
  const RecvLayout layout = e.d.expanded ? RecvLayout::kExpanded : RecvLayout::kCompact;
  DispatchResult d = buffer.dispatch(dispatch_args(v, e.d));
  expect_dispatch(r, e.p, e.d, e.out[ur], d);
  expect_output(r, buffer, layout, "fresh dispatch");
  DispatchArgs cached = dispatch_args(v, e.d);
  cached.handle = &d.handle;
  expect_dispatch(r, e.p, e.d, e.out[ur], buffer.dispatch(cached));
  expect_output(r, buffer, layout, "cached dispatch while the fresh one's output is held", true);
  CombineArgs ca;
  ca.y = TensorView(e.y[ur].data(), DType::kBF16, {e.out[ur].rows, e.p.hidden});
  ca.handle = &d.handle;
  ca.weighted = e.weighted;
  const BufferConfig& c = buffer.config();
  const bool data_first = spi::allows(spi::Path::kRowsFirst, c);  // the support table says where rows go first
  // Replies go first right after the dispatch (pool or not: these outputs are far below
  // DataPlaneOptions::replies_first_max_bytes) where the table allows it.
  const bool replies_first = spi::allows_replies_first(c);
  expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), e.combined[ur]);
  EXPECT_EQ(buffer.last_stats().data_first, replies_first) << "rank " << r << ", combine";
  expect_dispatch(r, e.p, e.d, e.out[ur], buffer.dispatch(cached));
  EXPECT_EQ(buffer.last_stats().data_first, data_first) << "rank " << r << ", cached dispatch";
  expect_bits(r, "combined_x (after the cached dispatch)", buffer.combine(ca).combined_x.data(), e.combined[ur]);
  DispatchResult again = buffer.dispatch(dispatch_args(v, e.d));
  expect_dispatch(r, e.p, e.d, e.out[ur], again);
  expect_output(r, buffer, layout, "second fresh dispatch", true);
  expect_dispatch(r, e.p, e.d, e.out[ur], d);  // the first output, held across every call since
  EXPECT_EQ(buffer.last_stats().data_first, data_first) << "rank " << r << ", fresh dispatch after a combine";
  ca.handle = &again.handle;
  expect_bits(r, "combined_x (handle of the second fresh dispatch)", buffer.combine(ca).combined_x.data(), e.combined[ur]);
  if (!e.combined_unweighted.empty()) {  // the order inside a token's group of slots shows only unweighted
    ca.weighted = false;
    expect_bits(r, "combined_x (unweighted)", buffer.combine(ca).combined_x.data(), e.combined_unweighted[ur]);
  }
  if (e.p.fp8) return;
  // The experts write y over their recv_x, as in place: where the peers are mapped and the
  // output is in the window, the sources pull it (direct) or the relays sum it where it lies
  // (hierarchical, node first); the same bits either way.
  if (!e.y[ur].empty()) std::memcpy(again.recv_x.data(), e.y[ur].data(), e.y[ur].size() * sizeof(std::uint16_t));
  ca.y = again.recv_x.view();
  ca.weighted = e.weighted;
  expect_bits(r, "combined_x (y written over recv_x)", buffer.combine(ca).combined_x.data(), e.combined[ur]);
}

class DataPlaneConformance : public ::testing::TestWithParam<std::tuple<TransportKind, Combo>> {};

TEST_P(DataPlaneConformance, MatchesReferenceBitForBit) {
  const auto& [kind, combo] = GetParam();
  const Expected compact = expect(fixture(false, 50), false, false, combo.nodes());
  const Expected expanded = expect(fixture(false, 51), true, true, combo.nodes());
  const Expected fp8 = expect(fixture(true, 52), false, false, combo.nodes());
  LaunchOptions lo;
  lo.num_ranks = kRanks;
  lo.transport = kind;
  lo.timeout = std::chrono::milliseconds(20000);
  launch(lo, [&](Transport& t) {
    BufferConfig c = config_for(compact.p, 2);
    c.max_tokens_per_rank = 16;
    c.dataplane = combo.options();
    c.output_pool_bytes = combo.copy ? 0 : -1;
    c.collect_stats = true;
    Buffer buffer(t, c);
    check_round_trip(buffer, t.rank(), compact);
    // Each queue carries what the split gave it; nothing outside the configured queues.
    const CallStats& s = buffer.last_stats();
    for (const WorkerStats& w : s.workers)
      for (int q = combo.queues.queues; q < kMaxStatQueues; ++q)
        if (w.queue_puts[static_cast<std::size_t>(q)] != 0) fail(t.rank(), "a put on unconfigured queue " + std::to_string(q));
    check_round_trip(buffer, t.rank(), expanded);
    check_round_trip(buffer, t.rank(), fp8);
  });
}

INSTANTIATE_TEST_SUITE_P(EveryCombination, DataPlaneConformance,
                         ::testing::Combine(::testing::ValuesIn(kDataTransports), ::testing::ValuesIn(combos())),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name();
                         });

// The same round trips where puts complete late (deferred_put_transport.hpp), as on an
// RDMA NIC: every choice must quiet before it signals (or rely on ordered signals, tail),
// keep a put's source intact until its quiet, and read rows only after they are complete.
class DeferredPutConformance : public ::testing::TestWithParam<Combo> {};

TEST_P(DeferredPutConformance, MatchesReferenceBitForBit) {
  const Combo& combo = GetParam();
  const Expected compact = expect(fixture(false, 50), false, false, combo.nodes());
  const Expected expanded = expect(fixture(false, 51), true, true, combo.nodes());
  const Expected fp8 = expect(fixture(true, 52), false, false, combo.nodes());
  launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    DeferredPutTransport deferred(t, combo.protocol);
    BufferConfig c = config_for(compact.p, 2);
    c.max_tokens_per_rank = 16;
    c.dataplane = combo.options();
    c.output_pool_bytes = combo.copy ? 0 : -1;
    Buffer buffer(deferred, c);
    check_round_trip(buffer, t.rank(), compact);
    check_round_trip(buffer, t.rank(), expanded);
    check_round_trip(buffer, t.rank(), fp8);
    if (deferred.delivered() == 0) fail(t.rank(), "no put went through the deferred transport");
  });
}

INSTANTIATE_TEST_SUITE_P(EveryCombination, DeferredPutConformance, ::testing::ValuesIn(combos()),
                         [](const auto& info) { return info.param.name(); });

// The bounded receive area: rings far smaller than what a rank receives (down to one row
// per source), so senders wait for credits many times per call.
class RingConformance : public ::testing::TestWithParam<std::tuple<TestTransport, std::int64_t, std::string, Protocol>> {};

TEST_P(RingConformance, MatchesReferenceBitForBit) {
  const auto& [where, ring, schedule, protocol] = GetParam();
  const Expected compact = expect(fixture(false, 60), false, false);
  const Expected expanded = expect(fixture(false, 61), true, true);
  const Expected fp8 = expect(fixture(true, 62), true, false);
  launch_on(where, {kRanks, where.kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    BufferConfig c = config_for(compact.p, 2);
    c.max_tokens_per_rank = 16;
    c.ring_rows = ring;
    c.dataplane.schedule = parse_schedule(schedule);
    c.dataplane.protocol = protocol;
    c.dataplane.queues = 2;
    Buffer buffer(t, c);
    check_round_trip(buffer, t.rank(), compact);
    check_round_trip(buffer, t.rank(), expanded);
    check_round_trip(buffer, t.rank(), fp8);
  }, spi::rule(protocol).needs == &TransportCaps::ordered_signal_per_queue);
}

// The registered protocols the ring's row takes (explicit and tail among the built-in ones).
std::vector<Protocol> ring_protocols() {
  std::vector<Protocol> v;
  for (const spi::ProtocolRule& p : spi::kProtocols)
    if (spi::takes(spi::rule(spi::Path::kRing), p.protocol)) v.push_back(p.protocol);
  return v;
}

const std::vector<TestTransport> kRingTransports = {{TransportKind::kThreads}, {TransportKind::kShm}, {TransportKind::kThreads, true}};

INSTANTIATE_TEST_SUITE_P(Rings, RingConformance,
                         ::testing::Combine(::testing::ValuesIn(kRingTransports), ::testing::Values(1, 2, 5, 64),
                                            ::testing::Values("rotated", "grouped:2"), ::testing::ValuesIn(ring_protocols())),
                         [](const auto& info) {
                           std::string schedule = std::get<2>(info.param);
                           std::replace(schedule.begin(), schedule.end(), ':', 'x');
                           return std::get<0>(info.param).name() + "_ring" +
                                  std::to_string(std::get<1>(info.param)) + "_" + schedule + "_" + spi::rule(std::get<3>(info.param)).name;
                         });

// Aggregation off means one put per row; the default merges runs of consecutive tokens.
TEST(DataPlaneConformance, AggregationControlsPutsPerRow) {
  const Expected e = expect(fixture(false, 53), false, false);
  for (std::size_t aggregate : {std::size_t{0}, std::size_t{1} << 20}) {
    launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      BufferConfig c = config_for(e.p, 1);
      c.dataplane.aggregate_bytes = aggregate;
      c.collect_stats = true;
      Buffer buffer(t, c);
      const RankViews v = views_of(e.p, t.rank());
      buffer.dispatch(dispatch_args(v, e.d));
      const WorkerStats& w = buffer.last_stats().workers[0];
      // Rows sent = plan entries; each row is one data put plus one metadata put when off.
      const ref::Layout lay = ref::layout(e.p, t.rank());
      std::uint64_t rows = 0;
      for (auto n : lay.num_tokens_per_rank) rows += static_cast<std::uint64_t>(n);
      const std::uint64_t puts = w.puts + w.local_puts;
      if (aggregate == 0 && puts != 2 * rows)
        fail(t.rank(), "aggregation off: " + std::to_string(puts) + " puts for " + std::to_string(rows) + " rows, want " +
                           std::to_string(2 * rows));
      if (aggregate != 0 && rows > 4 && puts >= 2 * rows)
        fail(t.rank(), "aggregation on: " + std::to_string(puts) + " puts for " + std::to_string(rows) + " rows");
    });
  }
}

// A combination a transport cannot honour is refused on every rank before anything runs.
TEST(DataPlaneConformance, RefusesWhatItCannotHonour) {
  const Expected e = expect(fixture(false, 54), false, false);
  auto refused = [&](DataPlaneOptions o, const std::string& words) {
    try {
      launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
        BufferConfig c = config_for(e.p, 1);
        c.dataplane = o;
        Buffer buffer(t, c);
      });
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument) << err.what();
      EXPECT_NE(std::string(err.what()).find(words), std::string::npos) << err.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << words;
  };
  DataPlaneOptions o;
  o.queues = 2;
  o.queue_split = parse_queue_split("1:1:1");
  refused(o, "3 parts but there are 2 queues");
  o = {};
  o.queues = 8;
  refused(o, "queues must be 1..4");
  o = {};
  o.schedule = parse_schedule("grouped:3");
  refused(o, "grouped:3");
  o = {};
  o.topology = "builtin:servers:3";
  refused(o, "servers:3");
  o = {};
  o.schedule = parse_schedule("hierarchical");
  refused(o, "hierarchical");  // builtin:flat is one server: nothing to relay between
  o.topology = "builtin:servers:2";
  o.protocol = Protocol::kFlag;
  refused(o, "protocol 'flag' is not supported");
  o = DataPlaneOptions{};
  o.combine_order = CombineOrder::kNodeFirst;  // sums at relays, but the schedule has none
  refused(o, "combine order 'node-first'");
  o = DataPlaneOptions{};
  o.combine_replies = CombineReplies::kSelections;  // straight to the sources: not through relays
  o.schedule = parse_schedule("hierarchical");
  o.topology = "builtin:servers:2";
  refused(o, "combine replies 'selections'");
  o = DataPlaneOptions{};
  o.combine_replies = CombineReplies::kSelections;  // rows at (token, k): not the flag protocol's blocks
  o.protocol = Protocol::kFlag;
  refused(o, "combine replies 'selections'");
}

// Counts a rank's puts of payload (rows) per peer, and their bytes; `mapped`: peers' windows
// are mapped as in the wrapped transport (else, as any ForwardingTransport, not at all).
class PutCounter final : public ForwardingTransport {
 public:
  explicit PutCounter(Transport& t, bool mapped = false)
      : ForwardingTransport(t), mapped_(mapped), puts_(static_cast<std::size_t>(t.num_ranks())), bytes_(static_cast<std::size_t>(t.num_ranks())) {}
  const std::byte* peer_window(int peer) const noexcept override { return mapped_ ? inner().peer_window(peer) : nullptr; }
  std::vector<std::atomic<std::uint64_t>>& puts() { return puts_; }
  std::vector<std::atomic<std::uint64_t>>& bytes() { return bytes_; }
  void reset() {
    for (auto& n : puts_) n = 0;
    for (auto& n : bytes_) n = 0;
  }

 private:
  void on_put(int peer, std::size_t offset, std::size_t bytes, int) override {
    if (offset < payload_begin_) return;
    ++puts_[static_cast<std::size_t>(peer)];
    bytes_[static_cast<std::size_t>(peer)] += bytes;
  }
  bool mapped_;
  std::vector<std::atomic<std::uint64_t>> puts_, bytes_;
};

// A transport that guarantees less than the real one underneath.
class WeakerTransport final : public ForwardingTransport {
 public:
  WeakerTransport(Transport& t, TransportCaps caps) : ForwardingTransport(t), caps_(caps) {}
  const TransportCaps& caps() const noexcept override { return caps_; }

 private:
  TransportCaps caps_;
};

// A protocol that relies on a guarantee the transport does not give is refused on every
// rank, naming the protocol, the guarantee and the transport; the rest still works. Every
// registered protocol (spi::kProtocols): the one its row relies on is off and every other
// guarantee on (tail: no ordered signals; flag: no flagged puts); one that relies on none
// (explicit) runs with every guarantee off.
TEST(DataPlaneConformance, ProtocolsNeedTheirTransportGuarantee) {
  const Expected e = expect(fixture(false, 57), false, false);
  // The built-in rows rely on what their units do (the loop below then refuses them).
  EXPECT_EQ(spi::rule(Protocol::kTail).needs, &TransportCaps::ordered_signal_per_queue);
  EXPECT_EQ(spi::rule(Protocol::kFlag).needs, &TransportCaps::flagged_puts);
  EXPECT_EQ(spi::rule(Protocol::kExplicit).needs, nullptr);
  for (const spi::ProtocolRule& row : spi::kProtocols) {
    SCOPED_TRACE(row.name);
    const std::string words = row.needs ? std::string("protocol '") + row.name + "' relies on " + row.needs_text : "";
    try {
      launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
        TransportCaps caps = t.caps();
        caps.name = "weaker";
        caps.ordered_signal_per_queue = caps.flagged_puts = row.needs != nullptr;
        if (row.needs) caps.*row.needs = false;
        WeakerTransport weaker(t, caps);
        BufferConfig config = config_for(e.p, 1);
        config.dataplane.protocol = row.protocol;
        Buffer buffer(weaker, config);
        check_round_trip(buffer, t.rank(), e);
      });
      EXPECT_EQ(words, "") << "accepted";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument) << err.what();
      EXPECT_NE(std::string(err.what()).find(words), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("transport 'weaker'"), std::string::npos) << err.what();
      EXPECT_NE(words, "") << err.what();
    }
  }
}

// The relay tests' shape: 8 ranks (rank 1 without tokens), 16 experts, top-`topk`.
ref::FixtureOptions eight_ranks(std::uint64_t seed, int topk) {
  ref::FixtureOptions f = fixture(false, seed);
  f.num_ranks = 8;
  f.num_experts = 16;
  f.num_topk = topk;
  f.tokens_per_rank = {12, 0, 9, 16, 3, 11, 7, 14};
  return f;
}

// Hierarchical: rows cross servers only between ranks of the same lane, both ways — a
// rank puts to other servers only to its relays (dispatch rows, forwarded replies); every
// other rank of another server gets its rows and replies relayed.
TEST(DataPlaneConformance, HierarchicalCrossesServersOnlyBetweenSameLanes) {
  const ref::FixtureOptions f = eight_ranks(56, 4);
  for (bool expanded : {false, true}) {
    const Expected e = expect(f, expanded, expanded);
    launch({8, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      PutCounter counted(t);
      BufferConfig c = config_for(e.p, 2);
      c.dataplane.schedule = parse_schedule("hierarchical");
      c.dataplane.topology = "builtin:servers:4";
      Buffer buffer(counted, c);
      const int r = t.rank();
      check_round_trip(buffer, r, e);  // dispatch, cached dispatch, combine
      // Rows rank r sends to the other server: all through its relay there.
      const ref::Layout lay = ref::layout(e.p, r);
      bool crosses = false;
      for (std::int64_t tok = 0; tok < e.p.ranks[static_cast<std::size_t>(r)].num_tokens; ++tok)
        for (int lane = 0; lane < 4; ++lane) crosses |= lay.is_token_in_rank[static_cast<std::size_t>(tok * 8 + (1 - r / 4) * 4 + lane)] != 0;
      for (int peer = 0; peer < 8; ++peer) {
        const std::uint64_t n = counted.puts()[static_cast<std::size_t>(peer)];
        const bool other_server = peer / 4 != r / 4, relay = other_server && peer % 4 == r % 4;
        if (other_server && !relay && n != 0)
          fail(r, std::to_string(n) + " payload puts straight to rank " + std::to_string(peer) + " of another server");
        if (relay && crosses && n == 0) fail(r, "nothing went through relay rank " + std::to_string(peer));
      }
    });
  }
}

// Node first (docs/spec.md §4, combine reduced inside each node first): the relay forwards one sum
// per token of another server's source, where the flat order forwards each of its server's
// ranks' replies; both bit for bit their order, and the two orders differ on this data.
TEST(DataPlaneConformance, NodeFirstCombineCrossesServersOncePerToken) {
  const ref::FixtureOptions f = eight_ranks(57, 6);
  const std::vector<int> nodes = {0, 0, 0, 0, 1, 1, 1, 1};
  for (bool expanded : {false, true}) {
    const Expected flat = expect(f, expanded, expanded), node_first = expect(f, expanded, expanded, &nodes);
    EXPECT_NE(flat.combined, node_first.combined) << "the data does not tell the two orders apart";
    for (const Expected* e : {&flat, &node_first}) {
      launch({8, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
        PutCounter counted(t);
        BufferConfig c = config_for(e->p, 2);
        c.dataplane.schedule = parse_schedule("hierarchical");
        c.dataplane.topology = "builtin:servers:4";
        c.dataplane.combine_order = e == &node_first ? CombineOrder::kNodeFirst : CombineOrder::kFlat;
        Buffer buffer(counted, c);
        const int r = t.rank();
        const auto ur = static_cast<std::size_t>(r);
        DispatchResult d = buffer.dispatch(dispatch_args(views_of(e->p, r), e->d));
        expect_dispatch(r, e->p, e->d, e->out[ur], d);
        counted.reset();
        CombineArgs ca;
        ca.y = TensorView(e->y[ur].data(), DType::kBF16, {e->out[ur].rows, e->p.hidden});
        ca.handle = &d.handle;
        ca.weighted = e->weighted;
        expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), e->combined[ur]);
        // As the relay of the other server's same-lane source: one row per token (node first)
        // or per (token, rank of my server it went to) (flat).
        const int source = (r + 4) % 8;
        const ref::Layout lay = ref::layout(e->p, source);
        std::uint64_t want = 0;
        for (std::int64_t tok = 0; tok < e->p.ranks[static_cast<std::size_t>(source)].num_tokens; ++tok) {
          std::uint64_t hits = 0;
          for (int lane = 0; lane < 4; ++lane) hits += lay.is_token_in_rank[static_cast<std::size_t>(tok * 8 + r / 4 * 4 + lane)];
          want += e == &node_first ? (hits > 0 ? 1 : 0) : hits;
        }
        std::uint64_t got = 0;  // rows: the replies' bytes / a row's
        for (int peer = 0; peer < 8; ++peer)
          if (peer / 4 != r / 4) got += counted.bytes()[static_cast<std::size_t>(peer)] / (static_cast<std::uint64_t>(e->p.hidden) * 2);
        if (got != want)
          fail(r, std::string(e == &node_first ? "node first" : "flat") + ": " + std::to_string(got) +
                      " reply rows to the other server, want " + std::to_string(want));
      });
    }
  }
}

// Node first with serial relays, the experts' y written over recv_x (a block of the output
// pool, or the receive area with recv_in_window) and peers mapped (threads, shm): each relay
// sums its server's replies reading its ranks' y in place, so a rank puts nothing to its own
// server's ranks but the replies to their own tokens; the sums are docs/spec.md §4's node-first
// order bit for bit, over calls whose y changes (a rank's y may change only once every relay
// of its server has read it).
TEST(DataPlaneConformance, NodeFirstRelaysSumTheirServersRepliesInPlace) {
  const ref::FixtureOptions f = eight_ranks(61, 6);
  for (int per_server : {4, 2}) {
    std::vector<int> nodes;
    for (int r = 0; r < f.num_ranks; ++r) nodes.push_back(r / per_server);
    const Expected e = expect(f, false, false, &nodes);
    std::vector<std::vector<std::uint16_t>> y2, combined2;  // a second call's y and sums
    for (int r = 0; r < f.num_ranks; ++r) y2.push_back(wide_bf16(900 + static_cast<std::uint64_t>(r), e.out[static_cast<std::size_t>(r)].rows * f.hidden));
    for (int r = 0; r < f.num_ranks; ++r) combined2.push_back(ref::combine(e.p, e.d, e.out, y2, nullptr, nullptr, false, r, &nodes));
    for (TransportKind kind : kTransports)
      for (bool zero_copy : {false, true}) {
        SCOPED_TRACE(std::to_string(per_server) + " a server, " + to_string(kind) + (zero_copy ? ", recv_in_window" : ", output pool"));
        launch({8, kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
          PutCounter counted(t, true);
          BufferConfig c = config_for(e.p, 2);
          c.dataplane.schedule = parse_schedule("hierarchical");
          c.dataplane.topology = "builtin:servers:" + std::to_string(per_server);
          c.dataplane.combine_order = CombineOrder::kNodeFirst;
          c.dataplane.relay_chunk_bytes = 0;
          Buffer buffer(counted, c);
          const int r = t.rank();
          const auto ur = static_cast<std::size_t>(r);
          for (int call = 0; call < 3; ++call) {
            const std::vector<std::uint16_t>& y = call % 2 == 0 ? e.y[ur] : y2[ur];
            DispatchArgs da = dispatch_args(views_of(e.p, r), e.d);
            da.recv_in_window = zero_copy;
            DispatchResult d = buffer.dispatch(da);
            expect_dispatch(r, e.p, e.d, e.out[ur], d);
            if (!y.empty()) std::memcpy(d.recv_x.data(), y.data(), y.size() * sizeof(std::uint16_t));
            counted.reset();
            CombineArgs ca;
            ca.y = d.recv_x.view();
            ca.handle = &d.handle;
            expect_bits(r, "combined_x, call " + std::to_string(call), buffer.combine(ca).combined_x.data(),
                        call % 2 == 0 ? e.combined[ur] : combined2[ur]);
            for (int p = r / per_server * per_server; p < (r / per_server + 1) * per_server; ++p) {
              if (p == r) continue;
              std::uint64_t want = 0;  // my received rows from p: its own tokens' replies
              for (std::int64_t row = 0; row < e.out[ur].rows; ++row) want += e.out[ur].recv_src[static_cast<std::size_t>(row * 2)] == p;
              const std::uint64_t got = counted.bytes()[static_cast<std::size_t>(p)] / (static_cast<std::uint64_t>(f.hidden) * 2);
              if (got != want) fail(r, "call " + std::to_string(call) + ": " + std::to_string(got) + " reply rows to rank " + std::to_string(p) + " of my server, want " + std::to_string(want));
            }
          }
        });
      }
  }
}

// Relay chunks (DataPlaneOptions::relay_chunk_bytes), in both directions: two servers of
// four (a relay has one source) and four servers of two (three sources, chunk c of each),
// both combine orders, compact and expanded, at 0 (serial), a row per chunk (1 byte), a few
// rows and more than any relay holds (one chunk), on threads, shm and the simulator's
// transport: every dispatch output bit for bit the reference (rows the relays forward chunk
// by chunk as they land) and every combine bit for bit docs/spec.md §4's order, whatever the chunks'
// arrival.
TEST(DataPlaneConformance, ChunkedRelaysGiveTheOrdersBitsAtEveryChunkSize) {
  const ref::FixtureOptions f = eight_ranks(59, 6);
  for (int per_server : {4, 2}) {
    std::vector<int> nodes;
    for (int r = 0; r < f.num_ranks; ++r) nodes.push_back(r / per_server);
    for (bool expanded : {false, true}) {
      const Expected flat = expect(f, expanded, expanded), node_first = expect(f, expanded, expanded, &nodes);
      for (const Expected* e : {&flat, &node_first})
        for (TransportKind kind : kDataTransports)
          for (std::size_t chunk : {std::size_t{0}, std::size_t{1}, std::size_t{3} * static_cast<std::size_t>(f.hidden) * 2,
                                    std::size_t{1} << 30}) {
            SCOPED_TRACE(std::to_string(per_server) + " a server, " + (e == &flat ? "flat, chunk " : "node first, chunk ") +
                         std::to_string(chunk) + (expanded ? ", expanded" : ""));
            launch({8, kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
              BufferConfig c = config_for(e->p, 2);
              c.dataplane.schedule = parse_schedule("hierarchical");
              c.dataplane.topology = "builtin:servers:" + std::to_string(per_server);
              c.dataplane.combine_order = e == &node_first ? CombineOrder::kNodeFirst : CombineOrder::kFlat;
              c.dataplane.relay_chunk_bytes = chunk;
              Buffer buffer(t, c);
              check_round_trip(buffer, t.rank(), *e);
            });
          }
    }
  }
}

// Per-selection replies (CombineReplies::kSelections, DeepEP's low-latency combine): an
// expert rank sends one row per (token, expert) selection it holds, where the partials send
// one per (token, rank) pair; both give docs/spec.md §4's bits (weighted and not, K > P so a token
// has more selections than ranks and the reply area needs K rows a token).
TEST(DataPlaneConformance, SelectionRepliesSendARowPerSlot) {
  ref::FixtureOptions f = fixture(false, 58);
  f.num_topk = 6;
  f.tokens_per_rank = {12, 0, 9, 16};
  for (bool weighted : {false, true}) {
    const Expected e = expect(f, true, weighted);
    for (CombineReplies replies : {CombineReplies::kPartials, CombineReplies::kSelections}) {
      SCOPED_TRACE(std::string(to_string(replies)) + (weighted ? ", weighted" : ""));
      launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
        PutCounter counted(t);
        BufferConfig c = config_for(e.p, 2);
        c.dataplane.combine_replies = replies;
        Buffer buffer(counted, c);
        const int r = t.rank();
        const auto ur = static_cast<std::size_t>(r);
        DispatchResult d = buffer.dispatch(dispatch_args(views_of(e.p, r), e.d));
        expect_dispatch(r, e.p, e.d, e.out[ur], d);
        counted.reset();
        CombineArgs ca;
        ca.y = TensorView(e.y[ur].data(), DType::kBF16, {e.out[ur].rows, e.p.hidden});
        ca.handle = &d.handle;
        ca.weighted = e.weighted;
        expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), e.combined[ur]);
        std::uint64_t want = 0;  // rows from every source's tokens whose experts I hold
        const int L = e.p.num_experts / e.p.num_ranks, K = e.p.num_topk;
        for (const ref::RankInput& in : e.p.ranks)
          for (std::int64_t tok = 0; tok < in.num_tokens; ++tok) {
            int here = 0;
            for (int k = 0; k < K; ++k) {
              const std::int64_t x = in.topk_idx[static_cast<std::size_t>(tok * K + k)];
              here += x >= 0 && x / L == r ? 1 : 0;
            }
            want += replies == CombineReplies::kSelections ? static_cast<std::uint64_t>(here) : (here > 0 ? 1 : 0);
          }
        std::uint64_t got = 0;
        for (int peer = 0; peer < kRanks; ++peer) got += counted.bytes()[static_cast<std::size_t>(peer)] / (static_cast<std::uint64_t>(e.p.hidden) * 2);
        if (got != want) fail(r, std::to_string(got) + " reply rows sent, want " + std::to_string(want));
      });
    }
  }
}

// Zero-copy output needs contiguous rows; the flag protocol's blocks are not.
TEST(DataPlaneConformance, FlagProtocolRefusesZeroCopy) {
  const Expected e = expect(fixture(false, 55), false, false);
  try {
    launch({kRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      BufferConfig c = config_for(e.p, 1);
      c.dataplane.protocol = Protocol::kFlag;
      Buffer buffer(t, c);
      DispatchArgs a = dispatch_args(views_of(e.p, t.rank()), e.d);
      a.recv_in_window = true;
      buffer.dispatch(a);
    });
    ADD_FAILURE() << "recv_in_window with the flag protocol was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kUnsupported) << err.what();
    EXPECT_NE(std::string(err.what()).find("flag protocol"), std::string::npos) << err.what();
  }
}

// Thousands of calls on one buffer, a new routing (and token count) every call, each
// checked against the reference: stale rows from an earlier call, or a slot overwritten
// before its reader is done, show up as wrong bits. Calls of the same kind follow each
// other (two dispatches, then two combines), so every region is rewritten by the very
// next call that uses it.
void stress(TestTransport where, Protocol protocol, int iterations, std::int64_t ring_rows = 0, bool relays = false,
            bool node_first = false, std::size_t relay_chunk = DataPlaneOptions::kRelayChunkAuto) {
  static const std::vector<int> two_servers = {0, 0, 1, 1};
  std::vector<Expected> rounds;
  for (int i = 0; i < 16; ++i) {
    ref::FixtureOptions f = fixture(false, 1000 + static_cast<std::uint64_t>(i));
    f.hidden = 64;
    f.tokens_per_rank = {1 + i % 7, (i * 5) % 9, 16 - i % 16, i % 3};
    rounds.push_back(expect(f, i % 2 == 1, false, node_first ? &two_servers : nullptr));
  }
  launch_on(where, {kRanks, where.kind, std::chrono::milliseconds(30000)}, [&](Transport& t) {
    const int r = t.rank();
    const auto ur = static_cast<std::size_t>(r);
    BufferConfig c = config_for(rounds[0].p, 2);
    c.max_tokens_per_rank = 16;
    c.dataplane.protocol = protocol;
    c.dataplane.queues = 2;
    c.dataplane.aggregate_bytes = 256;
    c.ring_rows = ring_rows;
    if (relays) {  // two servers of two: combines with an older handle must use its relay rows
      c.dataplane.schedule = parse_schedule("hierarchical");
      c.dataplane.topology = "builtin:servers:2";
      if (node_first) c.dataplane.combine_order = CombineOrder::kNodeFirst;
      c.dataplane.relay_chunk_bytes = relay_chunk;
    }
    Buffer buffer(t, c);
    auto dispatch = [&](const Expected& e) {
      DispatchResult d = buffer.dispatch(dispatch_args(views_of(e.p, r), e.d));
      expect_dispatch(r, e.p, e.d, e.out[ur], d);
      return d;
    };
    auto combine = [&](const Expected& e, const DispatchResult& d) {
      CombineArgs ca;
      ca.y = TensorView(e.y[ur].data(), DType::kBF16, {e.out[ur].rows, e.p.hidden});
      ca.handle = &d.handle;
      expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), e.combined[ur]);
    };
    for (int i = 0; i < iterations; ++i) {
      const Expected& a = rounds[static_cast<std::size_t>(i * 7 % 16)];
      const Expected& b = rounds[static_cast<std::size_t>((i * 7 + 3) % 16)];
      const DispatchResult da = dispatch(a);
      const DispatchResult db = dispatch(b);
      combine(b, db);
      combine(a, da);
    }
  }, protocol == Protocol::kTail);
}

constexpr TestTransport kThreads{TransportKind::kThreads}, kShm{TransportKind::kShm}, kDeferred{TransportKind::kThreads, true};
TEST(DataPlaneStress, threads_ExplicitReusesSlotsSafely) { stress(kThreads, Protocol::kExplicit, 1000); }
TEST(DataPlaneStress, threads_TailReusesSlotsSafely) { stress(kThreads, Protocol::kTail, 1000); }
TEST(DataPlaneStress, threads_FlagReusesSlotsSafely) { stress(kThreads, Protocol::kFlag, 1000); }
TEST(DataPlaneStress, threads_RingReusesSlotsSafely) { stress(kThreads, Protocol::kTail, 1000, 3); }
TEST(DataPlaneStress, shm_RingReusesSlotsSafely) { stress(kShm, Protocol::kExplicit, 500, 2); }
TEST(DataPlaneStress, threads_RelaysReuseSlotsSafely) { stress(kThreads, Protocol::kTail, 1000, 0, true); }
TEST(DataPlaneStress, shm_FlagReusesSlotsSafely) { stress(kShm, Protocol::kFlag, 1000); }
// Late puts (deferred_put_transport.hpp): a slot or a put's source reused before its quiet.
TEST(DataPlaneStress, deferred_ExplicitReusesSlotsSafely) { stress(kDeferred, Protocol::kExplicit, 300); }
TEST(DataPlaneStress, deferred_TailReusesSlotsSafely) { stress(kDeferred, Protocol::kTail, 300); }
TEST(DataPlaneStress, deferred_FlagReusesSlotsSafely) { stress(kDeferred, Protocol::kFlag, 300); }
TEST(DataPlaneStress, deferred_RingReusesSlotsSafely) { stress(kDeferred, Protocol::kExplicit, 300, 3); }
TEST(DataPlaneStress, deferred_RelaysReuseSlotsSafely) { stress(kDeferred, Protocol::kTail, 300, 0, true); }
TEST(DataPlaneStress, threads_NodeFirstRelaysReuseSlotsSafely) { stress(kThreads, Protocol::kExplicit, 300, 0, true, true); }
TEST(DataPlaneStress, deferred_NodeFirstRelaysReuseSlotsSafely) { stress(kDeferred, Protocol::kTail, 150, 0, true, true); }
// Relay chunks of one row (DataPlaneOptions::relay_chunk_bytes 1), both directions: every
// relayed row is its own chunk with its own signal and wait; late puts (deferred) make a
// relay that forwards a dispatch chunk before its source's signal of it, or sums / forwards
// a combine chunk before every member's signal of it, read stale rows. Explicit: a quiet
// before each chunk signal (unordered signals); tail: the ordered signal alone.
TEST(DataPlaneStress, threads_ChunkedRelaysReuseSlotsSafely) { stress(kThreads, Protocol::kExplicit, 300, 0, true, false, 1); }
TEST(DataPlaneStress, deferred_ChunkedRelaysReuseSlotsSafely) { stress(kDeferred, Protocol::kTail, 150, 0, true, false, 1); }
TEST(DataPlaneStress, deferred_ChunkedNodeFirstRelaysReuseSlotsSafely) { stress(kDeferred, Protocol::kExplicit, 150, 0, true, true, 1); }
TEST(DataPlaneStress, deferred_ChunkedNodeFirstTailRelaysReuseSlotsSafely) { stress(kDeferred, Protocol::kTail, 150, 0, true, true, 300); }

}  // namespace
}  // namespace epx::testing
