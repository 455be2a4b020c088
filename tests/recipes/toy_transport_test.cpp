// The "Add a transport" recipe of docs/engine.md, checked on the test transport that follows
// it: DeferredPutTransport (tests/multirank/deferred_put_transport.hpp), a Transport over
// another one whose puts complete late, as on an RDMA NIC. The recipe asks that caps() state
// exactly what the transport guarantees — the support table then refuses, on every rank,
// the protocols that rely on more — that peer_window() be null where peers are not mapped
// (combine then pushes), and that the suites run on it. Checked here: its puts really are
// deferred (a put's source is read at the quiet, not at the put), the Buffer refuses tail
// and flag where its caps say so and takes them where they say otherwise, and a round trip
// on it is bit exact, pushing rather than pulling.
#include <gtest/gtest.h>

#include <cstring>

#include "deferred_put_transport.hpp"
#include "recipe_support.hpp"

namespace epx::testing {
namespace {

TEST(RecipeTransport, PutsCompleteAtTheQuietNotOnReturn) {
  launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [](Transport& t) {
    DeferredPutTransport d(t, false, false);
    if (d.caps().put_completes_on_return || d.caps().peer_memory_mapped || d.peer_window(0) != nullptr)
      fail(t.rank(), "the deferred transport claims what it does not do");
    d.allocate(2 * sizeof(std::uint64_t), 2);
    const int to = (t.rank() + 1) % kCaseRanks, from = (t.rank() + kCaseRanks - 1) % kCaseRanks;
    std::uint64_t source = 1000 + static_cast<std::uint64_t>(t.rank());
    d.put(to, 0, &source, sizeof(source), 0);
    source += 1;  // before the quiet: the put has not read its source yet
    d.quiet(0);
    source += 1;  // after the quiet: the put is complete, this change stays here
    d.signal(to, 0, 1, 0);
    d.wait_signal(0, 1, {"recipe transport", from});
    std::uint64_t got = 0;
    std::memcpy(&got, d.window(), sizeof(got));
    if (got != 1001 + static_cast<std::uint64_t>(from))
      fail(t.rank(), "read " + std::to_string(got) + ", want the source as it was at the quiet: " + std::to_string(1001 + from));
    if (d.delivered() != 1) fail(t.rank(), "one put should have been delivered, got " + std::to_string(d.delivered()));
    d.barrier("recipe transport done");
    d.allocate(0, 0);
  });
}

TEST(RecipeTransport, CapsDecideTheProtocolsOnEveryRank) {
  const Expected e = expect(fixture(false, 94), false, false);
  for (const auto& [protocol, words] :
       {std::pair{Protocol::kTail, "protocol 'tail' relies on signals ordered after earlier puts on their queue, which transport "
                                   "'deferred' does not guarantee"},
        std::pair{Protocol::kFlag, "protocol 'flag' relies on flagged puts (a block's flag visible only after its bytes), which "
                                   "transport 'deferred' does not guarantee"}}) {
    BufferConfig config = config_for(e.p, 2);
    config.dataplane.protocol = protocol;
    expect_error_on_every_rank(
        [&](Transport& t) {
          DeferredPutTransport d(t, false, false);
          Buffer buffer(d, config);
        },
        ErrorCode::kInvalidArgument, words);
    // Stating the guarantee is what lets the protocol run (and its bits are the reference's).
    config.collect_stats = true;
    config.dataplane.replies_first_max_bytes = 0;  // every combine after its exchange: path "direct"
    launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      DeferredPutTransport d(t, protocol == Protocol::kTail, protocol == Protocol::kFlag);
      Buffer buffer(d, config);
      round_trip(buffer, t.rank(), e, "direct");
    });
  }
}

// y written over the dispatch's one-copy recv_x lies in the window: threads (mapped peers)
// pull it, the deferred transport (peer_window null) pushes it; the same bits either way.
TEST(RecipeTransport, UnmappedPeersMeanCombinePushes) {
  const Expected e = expect(fixture(false, 95), false, false);
  BufferConfig config = config_for(e.p, 2);
  config.collect_stats = true;
  config.dataplane.replies_first_max_bytes = 0;  // with the pool: the exchange first, then pull where it can
  for (const bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "deferred" : "threads");
    launch({kCaseRanks, TransportKind::kThreads, std::chrono::milliseconds(20000)}, [&](Transport& t) {
      DeferredPutTransport d(t, false, false);
      Buffer buffer(deferred ? static_cast<Transport&>(d) : t, config);
      const auto ur = static_cast<std::size_t>(t.rank());
      DispatchResult got = buffer.dispatch(dispatch_args(views_of(e.p, t.rank()), e.d));
      expect_dispatch(t.rank(), e.p, e.d, e.out[ur], got);
      if (!e.y[ur].empty()) std::memcpy(got.recv_x.data(), e.y[ur].data(), e.y[ur].size() * sizeof(std::uint16_t));
      CombineArgs ca;
      ca.handle = &got.handle;
      ca.weighted = e.weighted;
      ca.y = TensorView(got.recv_x.data(), DType::kBF16, {e.out[ur].rows, e.p.hidden});
      const CombineResult c = buffer.combine(ca);
      expect_path_key(t.rank(), buffer, deferred ? "direct" : "pull", "combine of y in the window");
      expect_bits(t.rank(), "combined_x", c.combined_x.data(), e.combined[ur]);
    });
  }
}

}  // namespace
}  // namespace epx::testing
