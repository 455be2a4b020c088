// Asynchronous dispatch and combine (Buffer::dispatch_async / combine_async): the same
// bits as the synchronous calls and the reference, both completion modes, on threads, shm
// and the simulator (copy mode); the outputs' final shapes as soon as the call returns;
// every other call refused while one is pending; a call that fails after its header
// exchange raises at finish() on every rank.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "multirank_support.hpp"

namespace epx::testing {
namespace {

struct AsyncCase {
  std::string name;
  bool expanded = false, fp8 = false;
  int alignment = 1;
  std::int64_t worst = 0;
};

ref::Problem problem_of(const AsyncCase& c) {
  ref::FixtureOptions f;
  f.num_ranks = 4;
  f.num_experts = 8;
  f.num_topk = 3;
  f.hidden = 256;
  f.tokens_per_rank = {9, 0, 14, 6};
  f.seed = 77;
  f.fp8 = c.fp8;
  return ref::make_problem(f);
}

std::vector<AsyncCase> async_cases() {
  return {{"compact"}, {"expanded_a4", true, false, 4}, {"fp8_compact", false, true}, {"fp8_expanded_worst", true, true, 2, 64}};
}

/// Bytes of a result's tensors, for comparing two results bit for bit.
void expect_same(int r, const char* what, const Tensor& got, const Tensor& want) {
  if (!(got.shape() == want.shape()) || got.dtype() != want.dtype())
    fail(r, std::string(what) + ": shape " + got.shape().str() + " vs " + want.shape().str());
  if (got.nbytes() > 0 && std::memcmp(got.data(), want.data(), got.nbytes()) != 0) fail(r, std::string(what) + ": bits differ");
}

void expect_same(int r, const DispatchResult& got, const DispatchResult& want) {
  expect_same(r, "recv_x", got.recv_x, want.recv_x);
  if (want.recv_x_scales.defined()) expect_same(r, "recv_x_scales", got.recv_x_scales, want.recv_x_scales);
  expect_same(r, "recv_src", got.recv_src, want.recv_src);
  if (want.recv_weights.defined()) expect_same(r, "recv_weights", got.recv_weights, want.recv_weights);
  if (want.recv_topk_idx.defined()) expect_same(r, "recv_topk_idx", got.recv_topk_idx, want.recv_topk_idx);
  if (want.recv_topk_weights.defined()) expect_same(r, "recv_topk_weights", got.recv_topk_weights, want.recv_topk_weights);
  if (got.num_recv_tokens_per_expert != want.num_recv_tokens_per_expert || got.expert_offsets != want.expert_offsets)
    fail(r, "counts or offsets differ");
}

/// The pending call's outputs have the final shapes and the finished call's bytes.
void expect_outputs_are_final(int r, const PendingDispatch& p, const DispatchResult& d) {
  const DispatchResult& o = p.outputs();
  if (!(o.recv_x.shape() == d.recv_x.shape()) || o.recv_x.data() != d.recv_x.data() || o.recv_src.data() != d.recv_src.data())
    fail(r, "outputs() at return are not the finished call's tensors");
  if (o.num_recv_tokens_per_expert != d.num_recv_tokens_per_expert || o.expert_offsets != d.expert_offsets ||
      o.handle.num_recv_rows() != d.handle.num_recv_rows())
    fail(r, "outputs() at return have other counts");
}

// pool: the output pool on (the default: every call exchanges headers first, recv_x one
// copy) or off (output_pool_bytes = 0: copies, and a cached dispatch after a combine goes
// rows first).
void run_async_case(TransportKind kind, const AsyncCase& c, Completion mode, bool pool) {
  const ref::Problem p = problem_of(c);
  ref::DispatchOptions o;
  o.expanded = c.expanded;
  o.alignment = c.alignment;
  o.worst = c.worst;
  const auto want = ref::dispatch_all(p, o);
  const int P = p.num_ranks;
  std::vector<std::vector<std::uint16_t>> y(static_cast<std::size_t>(P)), combined(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) y[static_cast<std::size_t>(r)] = ref::expert_fn(p, want[static_cast<std::size_t>(r)], o);
  for (int r = 0; r < P; ++r)
    combined[static_cast<std::size_t>(r)] = ref::combine(p, o, want, y, nullptr, nullptr, false, r);

  launch({P, kind, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    const int r = t.rank();
    const auto ur = static_cast<std::size_t>(r);
    BufferConfig cfg = config_for(p);
    if (!pool) cfg.output_pool_bytes = 0;
    Buffer buffer(t, cfg);
    const DispatchArgs args = dispatch_args(views_of(p, r), o);
    CombineArgs ca;
    ca.y = TensorView(y[ur].data(), DType::kBF16, {want[ur].rows, p.hidden});

    // Fresh: issued, the caller's own work meanwhile until epx's thread has done its part
    // (ready() only looks; wait_for and finish would take over a step not begun), then finished.
    PendingDispatch pd = buffer.dispatch_async(args, mode);
    std::vector<std::uint32_t> work(1 << 14, 1);
    while (!pd.ready())
      for (auto& v : work) v = v * 2654435761u + 1;
    DispatchResult d = pd.finish();
    expect_outputs_are_final(r, pd, d);
    expect_dispatch(r, p, o, want[ur], d);

    // Combine (replies first: right after the dispatch), async.
    ca.handle = &d.handle;
    PendingCombine pc = buffer.combine_async(ca, mode);
    const Tensor early = pc.outputs().combined_x.alias();
    while (!pc.ready()) std::this_thread::yield();
    CombineResult cr = pc.finish();
    if (early.data() != cr.combined_x.data()) fail(r, "combine outputs() at return are not the finished tensor");
    expect_bits(r, "combined_x (async)", cr.combined_x.data(), combined[ur]);
    expect_bits(r, "topk_weights (async)", cr.topk_weights.data(), p.ranks[ur].topk_weights);

    // Cached, right after a combine (rows first without the pool), then right after a
    // dispatch (exchange first).
    DispatchArgs cached = args;
    cached.handle = &d.handle;
    expect_dispatch(r, p, o, want[ur], buffer.dispatch_async(cached, mode).finish());
    if (buffer.last_stats().data_first != !pool)
      fail(r, pool ? "cached dispatch with the output pool went rows first"
                   : "cached dispatch after a combine did not go rows first");
    PendingDispatch second = buffer.dispatch_async(cached, mode);
    DispatchResult d2 = second.finish();
    expect_dispatch(r, p, o, want[ur], d2);
    if (buffer.last_stats().data_first) fail(r, "cached dispatch after a dispatch went rows first");

    // The same calls synchronously: bit-equal.
    DispatchResult sync = buffer.dispatch(cached);
    expect_same(r, d2, sync);
    CombineResult cs = buffer.combine(ca);
    expect_same(r, "combined_x (sync vs async)", cs.combined_x, cr.combined_x);
  });
}

class AsyncDispatchCombine : public ::testing::TestWithParam<std::tuple<TransportKind, AsyncCase, Completion>> {};

TEST_P(AsyncDispatchCombine, SameBitsAsSyncAndReference) {
  const auto& [kind, c, mode] = GetParam();
  run_async_case(kind, c, mode, true);
  run_async_case(kind, c, mode, false);
}

INSTANTIATE_TEST_SUITE_P(
    AllTransports, AsyncDispatchCombine,
    ::testing::Combine(::testing::ValuesIn(kDataTransports), ::testing::ValuesIn(async_cases()),
                       ::testing::Values(Completion::kBackground, Completion::kAtFinish)),
    [](const auto& info) {
      const TransportKind k = std::get<0>(info.param);
      return std::string(k == TransportKind::kThreads ? "threads" : k == TransportKind::kShm ? "shm" : "sim") + "_" +
             std::get<1>(info.param).name + (std::get<2>(info.param) == Completion::kBackground ? "_background" : "_at_finish");
    });

// While a call is pending, every other dispatch or combine on the Buffer throws on that
// rank, naming the pending call, and enters no collective; after finish() all is well.
TEST(AsyncDispatchCombine, threads_SecondCallWhilePendingIsRefused) {
  const AsyncCase c{"compact"};
  const ref::Problem p = problem_of(c);
  const auto want = ref::dispatch_all(p, {});
  launch({p.num_ranks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
    const int r = t.rank();
    Buffer buffer(t, config_for(p));
    const DispatchArgs args = dispatch_args(views_of(p, r), {});
    PendingDispatch pd = buffer.dispatch_async(args, Completion::kAtFinish);
    auto refused = [&](const char* what, auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        const std::string m = e.what();
        if (e.code() != ErrorCode::kInvalidArgument || m.find("dispatch (call 1)") == std::string::npos ||
            m.find("pending") == std::string::npos || e.origin_rank() != r)
          fail(r, std::string(what) + ": wrong refusal: " + m);
        return;
      }
      fail(r, std::string(what) + " accepted while a dispatch was pending");
    };
    refused("dispatch", [&] { buffer.dispatch(args); });
    refused("dispatch_async", [&] { buffer.dispatch_async(args); });
    CombineArgs ca;
    ca.y = pd.outputs().recv_x.view();
    ca.handle = &pd.outputs().handle;
    refused("combine", [&] { buffer.combine(ca); });
    refused("combine_async", [&] { buffer.combine_async(ca); });
    DispatchResult d = pd.finish();
    expect_dispatch(r, p, {}, want[static_cast<std::size_t>(r)], d);
    try {
      pd.finish();
      fail(r, "a second finish() succeeded");
    } catch (const Error&) {
    }
    // Accepted again, and the refused calls left no trace in the collective sequence.
    ca.y = d.recv_x.view();
    ca.handle = &d.handle;
    buffer.combine(ca);
    expect_dispatch(r, p, {}, want[static_cast<std::size_t>(r)], buffer.dispatch(args));
    // A pending call dropped unfinished is finished by its destructor.
    { PendingDispatch dropped = buffer.dispatch_async(args); }
    expect_dispatch(r, p, {}, want[static_cast<std::size_t>(r)], buffer.dispatch(args));
  });
}

/// Fails every put of rows (the window's payload region) once armed.
class FailingPuts : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  std::atomic<bool> armed{false};

 protected:
  void on_put(int peer, std::size_t offset, std::size_t, int) override {
    if (armed && offset >= payload_begin_)
      throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank()) + ": injected put failure to rank " + std::to_string(peer), rank());
  }
};

// Rank 2's puts fail on epx's thread after the header exchange: dispatch_async returns on
// every rank, and every rank's finish() throws — rank 2 its own error, the others naming
// rank 2 (whose rows never came).
void failing_call(TransportKind kind, bool combine) {
  const ref::Problem p = problem_of({"compact"});
  const auto want = ref::dispatch_all(p, {});
  launch({p.num_ranks, kind, std::chrono::milliseconds(1500)}, [&](Transport& inner) {
    FailingPuts t(inner);
    const int r = t.rank();
    Buffer buffer(t, config_for(p));
    const DispatchArgs args = dispatch_args(views_of(p, r), {});
    // A combine whose replies go after its exchange: its handle is not the last dispatch's.
    DispatchResult d0;
    CombineArgs ca;
    if (combine) {
      d0 = buffer.dispatch(args);
      buffer.dispatch(args);
      ca.y = d0.recv_x.view();
      ca.handle = &d0.handle;
    }
    t.armed = r == 2;
    PendingDispatch pd;
    PendingCombine pc;
    try {
      if (combine) pc = buffer.combine_async(ca);
      else pd = buffer.dispatch_async(args);
    } catch (const Error& e) {
      fail(r, std::string("the call itself threw: ") + e.what());
    }
    try {
      if (combine) pc.finish();
      else pd.finish();
    } catch (const Error& e) {
      const std::string m = e.what();
      if (std::getenv("EPX_ASYNC_DEBUG")) std::fprintf(stderr, "finish on rank %d: %s\n", r, m.c_str());
      if (m.find(r == 2 ? "injected put failure" : "rank 2") == std::string::npos)
        fail(r, "finish() threw the wrong error: " + m);
      return;
    }
    fail(r, "finish() succeeded although rank 2's puts failed");
  });
}

TEST(AsyncDispatchCombine, threads_DispatchFailingAfterItsExchangeRaisesAtFinishOnEveryRank) {
  failing_call(TransportKind::kThreads, false);
}
TEST(AsyncDispatchCombine, shm_DispatchFailingAfterItsExchangeRaisesAtFinishOnEveryRank) {
  failing_call(TransportKind::kShm, false);
}
TEST(AsyncDispatchCombine, threads_CombineFailingAfterItsExchangeRaisesAtFinishOnEveryRank) {
  failing_call(TransportKind::kThreads, true);
}

}  // namespace
}  // namespace epx::testing
