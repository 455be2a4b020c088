// epx bench --op <collective> end to end: the P ranks (forked, or this rank of a shmem job),
// the aggregated report, the baseline.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "collective_data.hpp"
#include "epx/bench/collective.hpp"
#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/options.hpp"
#include "epx/bench/launched_job.hpp"
#include "epx/bench/runner.hpp"
#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/shmem.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

void write_text_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  if (!f) throw Error(ErrorCode::kIo, "cannot write " + p.string());
}

std::string read_text_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw Error(ErrorCode::kIo, "cannot read " + p.string());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<double> column(const std::vector<CollectiveRankRecord>& rs, std::vector<double> CollectiveRankRecord::*f) {
  std::vector<std::vector<double>> s;
  for (const auto& r : rs) s.push_back(r.*f);
  return max_over(s);
}

void aggregate_phases(const std::vector<CollectiveRankRecord>& records, CollectiveReport& rep) {
  for (const auto& r : records) {
    rep.exchange_rank_us.push_back(mean(r.exchange_us));
    rep.data_rank_us.push_back(mean(r.data_us));
    rep.done_rank_us.push_back(mean(r.done_us));
  }
  rep.exchange_us = mean(rep.exchange_rank_us);
  rep.data_us = mean(rep.data_rank_us);
  rep.done_us = mean(rep.done_rank_us);
}

}  // namespace

CollectiveReport aggregate_collective(const BenchOptions& o, const std::vector<CollectiveRankRecord>& records) {
  CollectiveReport rep;
  rep.options = o;
  rep.op = o.op;
  rep.transport = o.transport;
  rep.ranks = static_cast<int>(records.size());
  rep.tensors = o.tensors;
  rep.iters = o.iters;
  rep.tensor_bytes = epx_collective::tensor_bytes(parse_byte_size(o.bytes), o.tensors, rep.ranks);
  rep.call_bytes = rep.tensor_bytes * static_cast<std::uint64_t>(o.tensors);
  rep.algorithm = records.empty() ? "" : records.front().algorithm;
  rep.max_rank_series = column(records, &CollectiveRankRecord::lat_us);
  rep.max_rank = summarize(rep.max_rank_series);
  std::vector<double> span;
  for (std::size_t i = 0; i < rep.max_rank_series.size(); ++i) {
    double first = 1e300, last = 0;
    for (const auto& r : records) first = std::min(first, r.start_us[i]), last = std::max(last, r.start_us[i] + r.lat_us[i]);
    span.push_back(last - first);
  }
  rep.span = summarize(span);
  double slowest = -1;
  for (const auto& r : records) {
    rep.rank.push_back(summarize(r.lat_us));
    if (rep.rank.back().avg > slowest) slowest = rep.rank.back().avg, rep.slowest_rank = r.rank;
    rep.window_bytes = std::max(rep.window_bytes, r.window_bytes);
    rep.peak_rss_bytes.push_back(r.peak_rss_bytes);
    if (!r.check.empty()) rep.check_failures.push_back("rank " + std::to_string(r.rank) + ": " + r.check);
    if (r.algorithm != rep.algorithm) rep.algorithm += "/" + r.algorithm;
  }
  const double n = static_cast<double>(rep.call_bytes);
  rep.algbw_gbps = rep.max_rank.avg > 0 ? n / (rep.max_rank.avg * 1e3) : 0;
  rep.busbw_gbps = rep.algbw_gbps * busbw_factor(o.op, rep.ranks);
  rep.memcpy_max_rank = summarize(column(records, &CollectiveRankRecord::memcpy_us));
  rep.stream_max_rank = summarize(column(records, &CollectiveRankRecord::stream_us));
  rep.memcpy_gbps = rep.memcpy_max_rank.avg > 0 ? n / (rep.memcpy_max_rank.avg * 1e3) : 0;
  rep.stream_gbps = rep.stream_max_rank.avg > 0 ? n / (rep.stream_max_rank.avg * 1e3) : 0;
  rep.limit_name = rep.stream_gbps > rep.memcpy_gbps ? "streaming copy" : "memcpy";
  rep.limit_gbps = std::max(rep.memcpy_gbps, rep.stream_gbps);
  rep.busbw_vs_limit = rep.limit_gbps > 0 ? rep.busbw_gbps / rep.limit_gbps : 0;
  aggregate_phases(records, rep);
  return rep;
}

int collective_status(const CollectiveReport& rep) {
  if (!rep.check_failures.empty()) return 3;
  return rep.baseline.requested && rep.baseline.ran && !rep.baseline.verified ? 3 : 0;
}

namespace {

CollectiveMeasurement measure_shmem(const BenchOptions& given) {
  if (!given.trace.empty()) throw Error(ErrorCode::kUnsupported, "epx bench --transport shmem: --trace needs the fork launcher");
  auto boot = shmem_bootstrap();
  const NodeMap nodes = discover_nodes(*boot);
  BenchOptions o = given;
  o.ranks = boot->size();
  // The two-level all_reduce follows the job's node layout unless --topology says otherwise.
  if (o.dataplane.topology == DataPlaneOptions{}.topology && nodes.num_nodes > 1) o.dataplane.topology = nodes.servers_topology();
  if (o.dataplane.topology.empty()) o.dataplane.topology = DataPlaneOptions{}.topology;
  validate_collective_options(o);
  CollectiveMeasurement m;
  std::string record;
  {
    ConnectOptions co;
    co.kind = ConnectKind::kShmem;
    co.timeout = std::chrono::milliseconds(o.timeout_ms);
    auto t = connect(*boot, co);
    record = collective_record_json(run_collective_rank(*t, o));
  }
  const auto blobs = allgather_strings(*boot, record);
  for (const std::string& b : blobs) m.records.push_back(collective_record_from_json(b));
  m.report = aggregate_collective(o, m.records);
  m.report.num_nodes = nodes.num_nodes;
  m.report.node_layout = describe_nodes(*boot, nodes);
  auto tmp = std::make_unique<TempDir>();
  if (o.baseline == "mpi") {
    if (o.progress && boot->rank() == 0) std::fprintf(stderr, "epx bench: running the MPI baseline in this job ...\n");
    run_collective_baseline(o, m.report, m.records, tmp->path());
  }
  m.root = boot->rank() == 0;
  tmp.reset();
  boot->barrier();
  return m;
}

}  // namespace

CollectiveMeasurement measure_collective(const BenchOptions& o) {
  if (o.transport == "shmem") return measure_shmem(o);
  const auto wall0 = std::chrono::steady_clock::now();
  validate_collective_options(o);
  check_ranks(o.ranks, o.transport, "epx bench");
  TempDir tmp;
  LaunchOptions lo;
  lo.num_ranks = o.ranks;
  lo.transport = parse_transport_kind(o.transport);
  lo.timeout = checked_timeout(o.timeout_ms);
  launch(lo, [&](Transport& t) {
    write_text_file(tmp.path() / ("rank" + std::to_string(t.rank()) + ".json"), collective_record_json(run_collective_rank(t, o)));
  });
  CollectiveMeasurement m;
  for (int r = 0; r < o.ranks; ++r)
    m.records.push_back(collective_record_from_json(read_text_file(tmp.path() / ("rank" + std::to_string(r) + ".json"))));
  m.report = aggregate_collective(o, m.records);
  if (!o.baseline.empty()) {
    if (o.progress) std::fprintf(stderr, "epx bench: running the %s baseline ...\n", o.baseline.c_str());
    run_collective_baseline(o, m.report, m.records, tmp.path());
  }
  m.report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return m;
}

}  // namespace epx::tools
