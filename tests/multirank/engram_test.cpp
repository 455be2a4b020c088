// EngramBuffer across P ranks (SPEC §10): every rank's output bit for bit against the whole
// table indexed by the reference (tests/reference/pp_engram.hpp), hooks in forward and
// reverse order, bf16 and FP8, -1 padding; the errors of set_config, write and fetch.
#include <gtest/gtest.h>

#include "epx/engram.hpp"
#include "multirank_support.hpp"
#include "reference/pp_engram.hpp"

namespace epx::testing {
namespace {

constexpr std::uint64_t kSeed = 11;

EngramConfig config_of(DType dt, std::vector<std::int64_t> N = {37, 64, 5}) {
  EngramConfig c;
  c.num_entries_per_layer = std::move(N);
  c.hidden = dt == DType::kBF16 ? 72 : 256;
  c.num_max_tokens = 20;
  c.num_entries_per_token = 3;
  c.dtype = dt;
  return c;
}

std::size_t row_bytes(const EngramConfig& c) { return static_cast<std::size_t>(c.hidden) * dtype_size(c.dtype); }
std::size_t sf_floats(const EngramConfig& c) { return c.dtype == DType::kFP8E4M3 ? static_cast<std::size_t>(c.hidden / 128) : 0; }

/// The buffer with every rank's shards written (rank r's shard of layer l: the reference's).
struct Tables {
  std::vector<std::vector<std::uint8_t>> rows;  // per layer, this rank's
  std::vector<std::vector<float>> scales;
};

Tables write_shards(EngramBuffer& b, const EngramConfig& c, int r) {
  Tables t;
  std::vector<TensorView> tables, sfs;
  for (int l = 0; l < static_cast<int>(c.num_entries_per_layer.size()); ++l) {
    const std::int64_t N = c.num_entries_per_layer[static_cast<std::size_t>(l)];
    t.rows.push_back(ref::engram_shard(kSeed, l, r, N, row_bytes(c)));
    t.scales.push_back(ref::engram_shard_scales(kSeed, l, r, N, sf_floats(c)));
  }
  for (std::size_t l = 0; l < t.rows.size(); ++l) {
    const std::int64_t N = c.num_entries_per_layer[l];
    tables.emplace_back(t.rows[l].data(), c.dtype, Shape{N, c.hidden});
    if (sf_floats(c)) sfs.emplace_back(t.scales[l].data(), DType::kF32, Shape{N, c.hidden / 128});
  }
  b.write(tables, sfs);
  return t;
}

/// Layer l's whole table as every rank holds it after an all-gather.
std::vector<std::uint8_t> whole_table(const EngramConfig& c, int P, int l) {
  std::vector<std::uint8_t> all;
  for (int p = 0; p < P; ++p) {
    const auto s = ref::engram_shard(kSeed, l, p, c.num_entries_per_layer[static_cast<std::size_t>(l)], row_bytes(c));
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}
std::vector<float> whole_scales(const EngramConfig& c, int P, int l) {
  std::vector<float> all;
  for (int p = 0; p < P; ++p) {
    const auto s = ref::engram_shard_scales(kSeed, l, p, c.num_entries_per_layer[static_cast<std::size_t>(l)], sf_floats(c));
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}

std::vector<std::int32_t> indices_of(const EngramConfig& c, int P, int r, std::int64_t T, std::uint64_t seed) {
  std::vector<std::int32_t> idx;
  for (std::size_t l = 0; l < c.num_entries_per_layer.size(); ++l) {
    const auto v = ref::engram_random_indices(seed * 100 + static_cast<std::uint64_t>(r) * 7 + l, T * c.num_entries_per_token,
                                              P * c.num_entries_per_layer[l], 10);
    idx.insert(idx.end(), v.begin(), v.end());
  }
  return idx;
}

/// One fetch of T tokens, hooks in `order`, every layer checked against the reference.
void fetch_and_check(EngramBuffer& b, const EngramConfig& c, int P, int r, std::int64_t T, std::uint64_t seed, bool reverse) {
  const int L = static_cast<int>(c.num_entries_per_layer.size());
  const std::int64_t E = c.num_entries_per_token;
  const auto idx = indices_of(c, P, r, T, seed);
  EngramFetch f = b.fetch(TensorView(idx.data(), DType::kI32, {L, T, E}));
  for (int k = 0; k < L; ++k) {
    const int l = reverse ? L - 1 - k : k;
    const std::vector<std::int32_t> li(idx.begin() + l * T * E, idx.begin() + (l + 1) * T * E);
    const EngramLayer out = f.layer(l);
    const std::string what = "layer " + std::to_string(l) + (reverse ? " (reverse order)" : "");
    if (!(out.data.shape == Shape{T, E * c.hidden}) || out.data.dtype != c.dtype)
      fail(r, what + ": data is " + out.data.shape.str());
    expect_bits(r, what + " data", out.data.data, ref::engram_gather(whole_table(c, P, l), row_bytes(c), li));
    if (sf_floats(c)) {
      if (!(out.scales.shape == Shape{T, E * c.hidden / 128})) fail(r, what + ": scales are " + out.scales.shape.str());
      expect_bits(r, what + " scales", out.scales.data, ref::engram_gather_scales(whole_scales(c, P, l), sf_floats(c), li));
    }
  }
  const EngramFetchStats s = f.stats();
  const std::int64_t moved = s.rows_local + s.rows_mapped + s.rows_get + s.rows_served;
  if (s.rows != L * T * E || moved + s.rows_padding != s.rows || s.rows_padding == 0 || s.rows_local == 0)
    fail(r, "stats do not add up: rows " + std::to_string(s.rows) + ", padding " + std::to_string(s.rows_padding) +
                ", local " + std::to_string(s.rows_local));
  if (s.bytes != static_cast<std::uint64_t>(moved) * (row_bytes(c) + 4 * sf_floats(c))) fail(r, "stats.bytes is wrong");
  if (std::string(s.path) != b.path()) fail(r, "stats.path is not the buffer's");
}

struct GatherCase {
  TransportKind kind;
  DType dtype;
  const char* path;
};

class EngramGather : public ::testing::TestWithParam<GatherCase> {};

TEST_P(EngramGather, EveryLayerBitExactInEitherHookOrder) {
  const GatherCase g = GetParam();
  const int P = 4;
  const EngramConfig c = config_of(g.dtype);
  LaunchOptions lo{.num_ranks = P, .transport = g.kind, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [&](Transport& t) {
    const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
    EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
    b.set_config(c);
    write_shards(b, c, t.rank());
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

TEST(EngramGather, HundredTwentyEightLayers) {
  EngramConfig c = config_of(DType::kBF16, std::vector<std::int64_t>(kMaxEngramLayers, 3));
  c.hidden = 8;
  LaunchOptions lo{.num_ranks = 2, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [&](Transport& t) {
    const EngramSizes z = EngramBuffer::get_storage_size_hint(2, c);
    EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
    b.set_config(c);
    write_shards(b, c, t.rank());
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
    const EngramConfig c = config_of(DType::kBF16);
    LaunchOptions lo{.num_ranks = 3, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      const int r = t.rank();
      const EngramSizes z = EngramBuffer::get_storage_size_hint(3, c);
      EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
      b.set_config(c);
      write_shards(b, c, r);
      auto idx = indices_of(c, 3, r, 4, 9);
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
    const EngramConfig c = config_of(DType::kFP8E4M3);
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
  const EngramConfig c = config_of(DType::kBF16);
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
    write_shards(b, c, r);
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
