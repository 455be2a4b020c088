// The simulator transport sees exactly the puts the threads transport carries for the same
// plan: count and bytes per (rank, peer, queue), for fresh dispatch and combine.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "epx/launch.hpp"
#include "epx/sim/launch.hpp"
#include "epx/sim/timing.hpp"
#include "epx/sim/launch.hpp"
#include "epx/sim/trace.hpp"
#include "multirank_support.hpp"

namespace epx::testing {
namespace {

/// Counts a transport's puts per (call, peer, queue).
class CountingTransport final : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;

  int call = 0;
  std::map<std::tuple<int, int, int>, sim::PutSummary> counts;  // (call, peer, queue)

 private:
  void on_put(int peer, std::size_t, std::size_t bytes, int queue) override {
    std::lock_guard<std::mutex> lock(m_);
    sim::PutSummary& s = counts[{call, peer, queue}];
    ++s.puts;
    s.bytes += bytes;
  }
  std::mutex m_;
};

struct Config {
  const char* name;
  const char* schedule;
  int queues;
  std::size_t aggregate;
  Protocol protocol;
  const char* topology = "builtin:flat";
  std::int64_t ring_rows = 0;
};

class SimPuts : public ::testing::TestWithParam<Config> {};

TEST_P(SimPuts, SameAsThreadsPerPeerAndQueue) {
  const Config cfg = GetParam();
  ref::FixtureOptions f;
  f.num_ranks = 4;
  f.num_experts = 16;
  f.num_topk = 4;
  f.hidden = 256;
  f.tokens_per_rank = {40, 17, 0, 29};
  f.seed = 77;
  const ref::Problem p = ref::make_problem(f);
  BufferConfig bc = config_for(p, 2);
  bc.dataplane.schedule = parse_schedule(cfg.schedule);
  bc.dataplane.queues = cfg.queues;
  bc.dataplane.aggregate_bytes = cfg.aggregate;
  bc.dataplane.protocol = cfg.protocol;
  bc.dataplane.topology = cfg.topology;
  bc.ring_rows = cfg.ring_rows;
  ref::DispatchOptions o;
  o.expanded = true;
  o.alignment = 4;
  const auto want = ref::dispatch_all(p, o);

  // Threads, counted by the wrapper; calls: 1 = dispatch, 2 = combine (0 = Buffer setup).
  std::vector<std::map<std::tuple<int, int, int>, sim::PutSummary>> threads(4);
  LaunchOptions lo;
  lo.num_ranks = 4;
  lo.transport = TransportKind::kThreads;
  auto body = [&](Transport& t, CountingTransport* counter) {
    Buffer buffer(t, bc);
    const RankViews v = views_of(p, t.rank());
    if (counter) counter->call = 1;
    sim::sim_begin_call(t, "dispatch");
    DispatchResult d = buffer.dispatch(dispatch_args(v, o));
    const auto y = ref::expert_fn(p, want[static_cast<std::size_t>(t.rank())], o);
    CombineArgs ca;
    ca.y = TensorView(y.data(), DType::kBF16, {want[static_cast<std::size_t>(t.rank())].rows, p.hidden});
    ca.handle = &d.handle;
    if (counter) counter->call = 2;
    sim::sim_begin_call(t, "combine");
    buffer.combine(ca);
  };
  launch(lo, [&](Transport& t) {
    CountingTransport c(t);
    body(c, &c);
    threads[static_cast<std::size_t>(t.rank())] = c.counts;
  });
  sim::Trace trace;
  lo.transport = TransportKind::kSim;
  sim::SimTransportOptions so;
  so.trace = &trace;
  sim::launch(lo, so, [&](Transport& t) { body(t, nullptr); });

  ASSERT_EQ(trace.calls.size(), 3u);
  for (int call = 0; call < 3; ++call) {
    const sim::PutTable table = sim::summarize_puts(trace, call);
    for (int r = 0; r < 4; ++r)
      for (int peer = 0; peer < 4; ++peer)
        for (int q = 0; q < 4; ++q) {
          const auto it = threads[static_cast<std::size_t>(r)].find({call, peer, q});
          const sim::PutSummary want_s = it == threads[static_cast<std::size_t>(r)].end() ? sim::PutSummary{} : it->second;
          const sim::PutSummary got = table[static_cast<std::size_t>(r)][static_cast<std::size_t>(peer)][static_cast<std::size_t>(q)];
          EXPECT_EQ(got.puts, want_s.puts) << "call " << call << " rank " << r << " peer " << peer << " queue " << q;
          EXPECT_EQ(got.bytes, want_s.bytes) << "call " << call << " rank " << r << " peer " << peer << " queue " << q;
        }
  }
  // The recorded trace (workers waiting inside their tasks included) is timed to the end.
  const sim::HardwareModel hw = sim::load_hardware("ascend950-supernode");
  const Topology topo = load_topology(cfg.topology, 4);
  for (int call = 1; call < 3; ++call) {
    sim::CallTiming t;
    EXPECT_NO_THROW(t = sim::time_call(trace, call, hw, {}, topo)) << "call " << call;
    EXPECT_GT(t.max_rank.us(), 0.0) << "call " << call;
  }
}

INSTANTIATE_TEST_SUITE_P(Dataplanes, SimPuts,
                         ::testing::Values(Config{"rotated_q1_agg", "rotated", 1, 1 << 20, Protocol::kExplicit},
                                           Config{"flat_q2_noagg_tail", "flat", 2, 0, Protocol::kTail},
                                           Config{"grouped2_q4_flag", "grouped:2", 4, 1 << 20, Protocol::kFlag},
                                           Config{"rotated_q1_flag", "rotated", 1, 1 << 20, Protocol::kFlag},
                                           Config{"hierarchical_q1", "hierarchical", 1, 1 << 20, Protocol::kExplicit,
                                                  "builtin:servers:2"},
                                           Config{"hierarchical_q2_tail", "hierarchical", 2, 0, Protocol::kTail,
                                                  "builtin:servers:2"},
                                           Config{"ring8_q1", "rotated", 1, 1 << 20, Protocol::kExplicit, "builtin:flat", 8}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace epx::testing
