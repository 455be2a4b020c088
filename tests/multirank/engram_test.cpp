// EngramBuffer across P ranks (docs/spec.md §10): every rank's output bit for bit against the whole
// table indexed by the reference (tests/reference/pp_engram.hpp), hooks in forward and
// reverse order, bf16 and FP8, -1 padding; the errors of set_config, write and fetch.
#include <gtest/gtest.h>

#include "pp_engram_checks.hpp"

namespace epx::testing {
namespace {

struct GatherCase {
  TransportKind kind;
  DType dtype;
  const char* path;
};

class EngramGather : public ::testing::TestWithParam<GatherCase> {};

TEST_P(EngramGather, EveryLayerBitExactInEitherHookOrder) {
  const GatherCase g = GetParam();
  const int P = 4;
  const EngramConfig c = engram_config(g.dtype);
  LaunchOptions lo{.num_ranks = P, .transport = g.kind, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [&](Transport& t) {
    const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
    EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
    b.set_config(c);
    write_engram_shards(b, c, t.rank());
    if (std::string(b.path()) != g.path) fail(t.rank(), std::string("path ") + b.path() + ", want " + g.path);
    fetch_and_check(b, c, P, t.rank(), 17, 1, false);
    fetch_and_check(b, c, P, t.rank(), 20, 2, true);  // the outputs are reused
    fetch_and_check(b, c, P, t.rank(), 0, 3, false);  // no tokens
    b.destroy();
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, EngramGather,
                         ::testing::Values(GatherCase{TransportKind::kThreads, DType::kBF16, "mapped"},
                                           GatherCase{TransportKind::kThreads, DType::kFP8E4M3, "mapped"},
                                           GatherCase{TransportKind::kShm, DType::kBF16, "mapped"},
                                           GatherCase{TransportKind::kShm, DType::kFP8E4M3, "mapped"},
                                           GatherCase{TransportKind::kSim, DType::kBF16, "served"},
                                           GatherCase{TransportKind::kSim, DType::kFP8E4M3, "served"}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.kind)) + "_" +
                                  (info.param.dtype == DType::kBF16 ? "bf16" : "fp8");
                         });

// Layers whose outputs exceed the cache (1 MiB here) are gathered with streaming stores
// (epx::stream_copy_rows): bit for bit as the small ones, bf16 and FP8, with -1 padding.
TEST(EngramGather, LargeLayersBitExact) {
  for (TransportKind kind : {TransportKind::kThreads, TransportKind::kShm})
    for (const DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
      SCOPED_TRACE(std::string(to_string(kind)) + " " + to_string(dtype));
      const int P = 2;
      EngramConfig c = engram_config(dtype);
      c.hidden = 256;
      c.num_max_tokens = 1400;  // 1400 x 3 rows: 2.1 MiB (bf16), 1.05 MiB (FP8) per layer
      LaunchOptions lo{.num_ranks = P, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
      launch(lo, [&](Transport& t) {
        const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
        EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
        b.set_config(c);
        write_engram_shards(b, c, t.rank());
        fetch_and_check(b, c, P, t.rank(), 1400, 4, false);
        fetch_and_check(b, c, P, t.rank(), 1399, 5, true);
        b.destroy();
      });
    }
}

// The get path (OpenSHMEM across machines, shmem_getmem_nbi) on threads: a transport that
// hides the peers' windows (ForwardingTransport maps none) but forwards one-sided gets; every
// remote row arrives by a get, bit for bit, and a fetch is not collective (rank 0 fetches once
// more than the others).
TEST(EngramGather, UnmappedPeersAreReadByOneSidedGets) {
  for (const DType dtype : {DType::kBF16, DType::kFP8E4M3}) {
    SCOPED_TRACE(to_string(dtype));
    const int P = 4;
    const EngramConfig c = engram_config(dtype);
    LaunchOptions lo{.num_ranks = P, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& inner) {
      ForwardingTransport t(inner);
      ASSERT_TRUE(t.caps().one_sided_get);
      const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
      EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
      b.set_config(c);
      write_engram_shards(b, c, t.rank());
      if (std::string(b.path()) != "get") fail(t.rank(), std::string("path ") + b.path() + ", want get");
      if (t.rank() == 0) fetch_and_check(b, c, P, t.rank(), 9, 4, false);  // local: nobody else joins
      fetch_and_check(b, c, P, t.rank(), 17, 1, false);
      fetch_and_check(b, c, P, t.rank(), 20, 2, true);
      const int L = static_cast<int>(c.num_entries_per_layer.size());
      const auto idx = engram_indices(c, P, t.rank(), 12, 6);
      EngramFetch f = b.fetch(TensorView(idx.data(), DType::kI32, {L, 12, c.num_entries_per_token}));
      if (f.stats().rows_get == 0 || f.stats().rows_mapped != 0 || f.stats().rows_served != 0)
        fail(t.rank(), "remote rows did not all go by gets: get " + std::to_string(f.stats().rows_get));
      b.fetch(TensorView(idx.data(), DType::kI32, {L, 12, c.num_entries_per_token}));  // over the first's gets in flight
      inner.barrier("engram get test: every rank's fetches done");  // the tables stay until all read
      b.destroy();
    });
  }
}

TEST(EngramGather, HundredTwentyEightLayers) {
  EngramConfig c = engram_config(DType::kBF16, std::vector<std::int64_t>(kMaxEngramLayers, 3));
  c.hidden = 8;
  LaunchOptions lo{.num_ranks = 2, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [&](Transport& t) {
    const EngramSizes z = EngramBuffer::get_storage_size_hint(2, c);
    EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
    b.set_config(c);
    write_engram_shards(b, c, t.rank());
    fetch_and_check(b, c, 2, t.rank(), 20, 5, true);
  });
}

template <class F>
void expect_error(int r, ErrorCode code, int origin, const std::vector<std::string>& words, F&& call) {
  try {
    call();
  } catch (const Error& e) {
    const std::string w = e.what();
    if (e.code() != code) fail(r, std::string("error code ") + to_string(e.code()) + ", want " + to_string(code) + ": " + w);
    if (e.origin_rank() != origin) fail(r, "origin rank " + std::to_string(e.origin_rank()) + ": " + w);
    for (const auto& s : words)
      if (w.find(s) == std::string::npos) fail(r, "the error does not say '" + s + "': " + w);
    return;
  }
  fail(r, "no error was raised");
}

TEST(EngramErrors, AnIndexOutsideTheTableNamesLayerTokenEntryAndValue) {
  // mapped: only the calling rank fails; served (sim): every rank, naming it
  for (TransportKind kind : kDataTransports) {
    const EngramConfig c = engram_config(DType::kBF16);
    LaunchOptions lo{.num_ranks = 3, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      const int r = t.rank();
      const EngramSizes z = EngramBuffer::get_storage_size_hint(3, c);
      EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
      b.set_config(c);
      write_engram_shards(b, c, r);
      auto idx = engram_indices(c, 3, r, 4, 9);
      if (r == 1) idx[static_cast<std::size_t>(1 * 4 * 3 + 2 * 3 + 1)] = 3 * 64;  // layer 1, token 2, entry 1
      const TensorView v(idx.data(), DType::kI32, {3, 4, 3});
      const bool served = std::string(b.path()) == "served";
      if (r == 1 || served)
        expect_error(r, ErrorCode::kInvalidArgument, 1,
                     {"rank 1", "layer 1", "token 2", "entry 1", "= 192", "[-1, 192)"}, [&] { b.fetch(v); });
      else
        b.fetch(v).layer(0);
      fetch_and_check(b, c, 3, r, 4, 10, false);  // and the next fetch works
    });
  }
}

TEST(EngramErrors, AWrongShardFailsTheWriteOnEveryRank) {
  for (TransportKind kind : kTransports) {
    const EngramConfig c = engram_config(DType::kFP8E4M3);
    LaunchOptions lo{.num_ranks = 3, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      const int r = t.rank();
      const EngramSizes z = EngramBuffer::get_storage_size_hint(3, c);
      EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
      b.set_config(c);
      std::vector<std::uint8_t> rows(64 * 256);
      std::vector<float> sf(64 * 2);
      auto shards = [&](std::int64_t n1, DType dt) {
        return std::vector<TensorView>{TensorView(rows.data(), DType::kFP8E4M3, {37, 256}),
                                       TensorView(rows.data(), dt, {n1, 256}),
                                       TensorView(rows.data(), DType::kFP8E4M3, {5, 256})};
      };
      const std::vector<TensorView> sfs = {TensorView(sf.data(), DType::kF32, {37, 2}), TensorView(sf.data(), DType::kF32, {64, 2}),
                                           TensorView(sf.data(), DType::kF32, {15, 2})};  // [P * N_l, S] is fine too
      expect_error(r, ErrorCode::kShapeMismatch, 2, {"rank 2", "tables[1]", "[63, 256]", "expected [64, 256]"},
                   [&] { b.write(shards(r == 2 ? 63 : 64, DType::kFP8E4M3), sfs); });
      expect_error(r, ErrorCode::kDtypeMismatch, 0, {"rank 0", "tables[1] is bf16"},
                   [&] { b.write(shards(64, r == 0 ? DType::kBF16 : DType::kFP8E4M3), sfs); });
      expect_error(r, ErrorCode::kInvalidArgument, -1, {"every rank", "scale tables"},
                   [&] { b.write(shards(64, DType::kFP8E4M3), {}); });
      expect_error(r, ErrorCode::kInvalidArgument, r, {"write the tables first"}, [&] {
        std::vector<std::int32_t> idx(3 * 3, 0);
        b.fetch(TensorView(idx.data(), DType::kI32, {3, 1, 3}));
      });
      b.write(shards(64, DType::kFP8E4M3), sfs);
    });
  }
}

TEST(EngramErrors, StaleHooksConfigsThatDoNotFitAndBadIndices) {
  const EngramConfig c = engram_config(DType::kBF16);
  LaunchOptions lo{.num_ranks = 2, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [&](Transport& t) {
    const int r = t.rank();
    const EngramSizes z = EngramBuffer::get_storage_size_hint(2, c);
    EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
    EngramConfig big = c;
    big.num_entries_per_layer[0] += 1;
    expect_error(r, ErrorCode::kCapacityExceeded, -1, {"every rank", "num_storage_bytes"}, [&] { b.set_config(big); });
    EngramConfig other = c;
    other.hidden = r == 1 ? 64 : c.hidden;
    expect_error(r, ErrorCode::kInvalidArgument, 1, {"rank 1", "hidden"}, [&] { b.set_config(other); });
    b.set_config(c);
    write_engram_shards(b, c, r);
    std::vector<std::int32_t> idx(3 * 2 * 3, 1);
    EngramFetch first = b.fetch(TensorView(idx.data(), DType::kI32, {3, 2, 3}));
    EngramFetch second = b.fetch(TensorView(idx.data(), DType::kI32, {3, 2, 3}));
    expect_error(r, ErrorCode::kBadHandle, r, {"stale"}, [&] { first.layer(0); });
    expect_error(r, ErrorCode::kInvalidArgument, r, {"layer 3", "0..2"}, [&] { second.layer(3); });
    expect_error(r, ErrorCode::kDtypeMismatch, r, {"int32"},
                 [&] { b.fetch(TensorView(idx.data(), DType::kF32, {3, 2, 3})); });
    expect_error(r, ErrorCode::kShapeMismatch, r, {"num_max_tokens = 20"},
                 [&] { b.fetch(TensorView(idx.data(), DType::kI32, {3, 21, 3})); });
    b.destroy();
    expect_error(r, ErrorCode::kBadHandle, r, {"stale"}, [&] { second.layer(0); });
  });
}

}  // namespace
}  // namespace epx::testing
