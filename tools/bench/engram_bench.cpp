// epx bench --op engram: the ranks' timed loop (epx/bench/p2p.hpp says what is timed), then
// the peers (p2p_peers.cpp) and the aggregation.
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "epx/bench/p2p.hpp"
#include "epx/engram.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "p2p_data.hpp"
#include "p2p_peers.hpp"

namespace epx::tools {

namespace {

using Clock = std::chrono::steady_clock;

EngramConfig config_of(const EngramBenchOptions& o) {
  EngramConfig c;
  c.num_entries_per_layer.assign(static_cast<std::size_t>(o.layers), o.rows);
  c.hidden = o.hidden;
  c.num_max_tokens = o.tokens;
  c.num_entries_per_token = o.entries;
  c.dtype = o.fp8 ? DType::kFP8E4M3 : DType::kBF16;
  return c;
}

/// This rank's shards (the rows of the whole table it owns) written into `b`; FP8 scales
/// are the rows' first words read as positive floats (any data does: the check is bitwise).
void write_shards(EngramBuffer& b, const EngramConfig& c, std::uint64_t seed, int me) {
  const std::size_t row = static_cast<std::size_t>(c.hidden) * dtype_size(c.dtype);
  const std::int64_t N = c.num_entries_per_layer[0];
  const std::size_t S = c.dtype == DType::kFP8E4M3 ? static_cast<std::size_t>(c.hidden / 128) : 0;
  std::vector<std::vector<std::uint8_t>> rows;
  std::vector<std::vector<float>> sfs;
  std::vector<TensorView> tv, sv;
  for (std::size_t l = 0; l < c.num_entries_per_layer.size(); ++l) {
    rows.emplace_back(static_cast<std::size_t>(N) * row);
    epx_p2p_data::fill_table_rows(seed, static_cast<int>(l), me * N, N, row, rows.back().data());
    sfs.emplace_back(static_cast<std::size_t>(N) * S);
    for (std::size_t i = 0; i < sfs.back().size(); ++i) sfs.back()[i] = 1.0f + static_cast<float>(rows.back()[i % rows.back().size()]);
    tv.emplace_back(rows.back().data(), c.dtype, Shape{N, c.hidden});
    if (S) sv.emplace_back(sfs.back().data(), DType::kF32, Shape{N, static_cast<std::int64_t>(S)});
  }
  b.write(tv, sv);
}

}  // namespace

std::string run_engram_rank(Transport& t, const EngramBenchOptions& o) {
  const int me = t.rank(), P = t.num_ranks();
  const EngramConfig c = config_of(o);
  const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
  EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
  b.set_config(c);
  write_shards(b, c, o.seed, me);
  const std::int64_t count = o.tokens * o.entries;
  std::vector<std::int32_t> idx(static_cast<std::size_t>(o.layers * count));
  for (int l = 0; l < o.layers; ++l)
    epx_p2p_data::fill_indices(o.seed, me, l, count, P * o.rows, idx.data() + l * count);
  const TensorView iv(idx.data(), DType::kI32, {o.layers, o.tokens, o.entries});
  const std::size_t row = static_cast<std::size_t>(o.hidden) * dtype_size(c.dtype);
  std::vector<std::uint8_t> src(static_cast<std::size_t>(o.layers * count) * row), dst(src.size());
  std::vector<double> fetch_us, copy_us;
  EngramFetch f;
  for (int i = 0; i < o.common.warmup + o.common.iters; ++i) {
    t.barrier("engram bench fetch");
    auto t0 = Clock::now();
    f = b.fetch(iv);
    for (int l = 0; l < o.layers; ++l) f.layer(l);
    const double fu = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    t.barrier("engram bench copy");
    t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    const double cu = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i >= o.common.warmup) fetch_us.push_back(fu), copy_us.push_back(cu);
  }
  // the check: the outputs of the last fetch against the table's rows made directly
  std::uint64_t hash = 0;
  bool correct = true;
  std::vector<std::uint8_t> want(row);
  for (int l = 0; l < o.layers; ++l) {
    const EngramLayer out = f.layer(l);
    const auto* got = static_cast<const std::uint8_t*>(out.data.data);
    hash += epx_p2p_data::check_hash(got, static_cast<std::size_t>(count) * row);
    for (std::int64_t k = 0; k < count && correct; ++k) {
      epx_p2p_data::fill_table_rows(o.seed, l, idx[static_cast<std::size_t>(l * count + k)], 1, row, want.data());
      correct = std::memcmp(want.data(), got + static_cast<std::size_t>(k) * row, row) == 0;
    }
  }
  const EngramFetchStats st = f.stats();
  nlohmann::json rec = {{"fetch", fetch_us}, {"copy", copy_us}, {"hash", hash}, {"correct", correct},
                        {"rows", st.rows}, {"local", st.rows_local}, {"bytes", st.bytes}, {"path", st.path}};
  b.destroy();
  return rec.dump();
}

EngramBenchReport aggregate_engram(const EngramBenchOptions& o, const std::vector<std::string>& records) {
  EngramBenchReport rep;
  rep.options = o;
  rep.ranks = static_cast<int>(records.size());
  std::vector<std::vector<double>> fetch, copy;
  std::int64_t rows = 0, local = 0;
  rep.correct = true;
  for (const std::string& text : records) {
    const auto j = nlohmann::json::parse(text);
    fetch.push_back(j["fetch"].get<std::vector<double>>());
    copy.push_back(j["copy"].get<std::vector<double>>());
    rep.hashes.push_back(j["hash"].get<std::uint64_t>());
    rep.correct = rep.correct && j["correct"].get<bool>();
    rows += j["rows"].get<std::int64_t>(), local += j["local"].get<std::int64_t>();
    rep.rows_per_rank = j["rows"].get<std::int64_t>();
    rep.bytes_per_rank = j["bytes"].get<std::uint64_t>();
    rep.path = j["path"].get<std::string>();
  }
  rep.fetch_us = summarize(max_over(fetch));
  rep.copy_us = summarize(max_over(copy));
  rep.local_hit_rate = rows > 0 ? static_cast<double>(local) / static_cast<double>(rows) : 0.0;
  return rep;
}

std::string engram_peers_why_not(const EngramBenchOptions& o) {
  return o.fp8 ? "the peers gather bf16 rows only (this run is --engram-fp8)" : "";
}

void check_engram_options(const EngramBenchOptions& o, int ranks) {
  EngramBuffer::get_storage_size_hint(ranks, config_of(o));  // the shape's checks (kInvalidArgument)
  if (o.hidden % 4 != 0) throw Error(ErrorCode::kInvalidArgument, "--engram-hidden must be a multiple of 4");
  if (static_cast<double>(ranks) * static_cast<double>(o.rows) > 2147483647.0)
    throw Error(ErrorCode::kInvalidArgument, "--engram-rows x ranks must fit an int32 index");
  if (o.common.iters < 1 || o.common.warmup < 0 || o.common.rounds < 1)
    throw Error(ErrorCode::kInvalidArgument, "--iters and --peer-rounds must be >= 1");
}

EngramBenchReport measure_engram(const EngramBenchOptions& o) {
  const auto wall0 = Clock::now();
  const int ranks = o.common.ranks > 0 ? o.common.ranks : 4;
  check_engram_options(o, ranks);
  if (o.common.progress) std::fprintf(stderr, "epx bench: engram on %d %s ranks ...\n", ranks, o.common.transport.c_str());
  std::vector<nlohmann::json> records, peer_json;
  const std::vector<PeerRun> peer_runs =
      run_rounds(o.common, ranks, engram_peer_args(o), [&](Transport& t) { return run_engram_rank(t, o); },
                 engram_peers_why_not(o), records, peer_json);
  std::vector<std::string> texts;
  for (const auto& r : records) texts.push_back(r.dump());
  EngramBenchReport rep = aggregate_engram(o, texts);
  for (std::size_t i = 0; i < o.common.peers.size(); ++i)
    if (o.common.peers[i] != "none") attach_engram_peer(peer_runs[i], peer_json[i], rep);
  rep.wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
  return rep;
}

}  // namespace epx::tools
