#include "epx/bench/mpi.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "epx/error.hpp"
#include "epx/io/npy.hpp"
#include "epx/topology.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

constexpr const char* kInstallHint = "install with apt-get install libopenmpi-dev openmpi-bin and rebuild";

Summary summary_of(const nlohmann::json& j) {
  Summary s;
  s.avg = j.at("avg").get<double>();
  s.p50 = j.at("p50").get<double>();
  s.p95 = j.at("p95").get<double>();
  s.max = j.at("max").get<double>();
  return s;
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

void write_routing_dir(const BenchProblem& p, const fs::path& dir, int only_rank) {
  fs::create_directories(dir);
  {
    nlohmann::json meta = {{"num_ranks", p.ranks},
                           {"num_experts", p.experts},
                           {"hidden", p.hidden},
                           {"num_topk", p.topk},
                           {"num_max_tokens_per_rank", p.max_tokens}};
    std::ofstream f(dir / "meta.json");
    f << meta.dump(2) << "\n";
    if (!f) throw Error(ErrorCode::kIo, (dir / "meta.json").string() + ": cannot write");
  }
  for (int r = 0; r < p.ranks; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    const BenchRankInput& in = p.rank[static_cast<std::size_t>(r)];
    const fs::path rd = dir / ("rank" + std::to_string(r));
    fs::create_directories(rd);
    const std::int64_t S = in.tokens, K = p.topk, H = p.hidden;
    write_npy(rd / "topk_idx.npy", "<i8", {S, K}, in.topk_idx.data(), in.topk_idx.size() * sizeof(std::int64_t));
    write_npy(rd / "topk_weights.npy", "<f4", {S, K}, in.topk_weights.data(), in.topk_weights.size() * sizeof(float));
    if (p.fp8) {
      write_npy(rd / "x_fp8.npy", "|u1", {S, H}, in.x.data(), in.x.nbytes());
      write_npy(rd / "x_scales.npy", "<f4", {S, H / 128}, in.x_scales.data(), in.x_scales.nbytes());
    } else {
      write_npy(rd / "x.npy", "<u2", {S, H}, in.x.data(), in.x.nbytes());
    }
  }
}

BaselineResult run_mpi_baseline(const BenchOptions& o, const BenchProblem& p, const fs::path& work_dir) {
  BaselineResult b;
  if (p.fp8) {
    b.why_not = "epx_mpi_baseline moves bf16 rows only (this run is --fp8)";
    return b;
  }
  const std::string mpirun = o.mpirun.empty() ? on_path("mpirun") : o.mpirun;
  if (mpirun.empty() || !executable(mpirun)) {
    b.why_not = o.mpirun.empty() ? "Open MPI is not installed (no mpirun on PATH); " + std::string(kInstallHint)
                                 : "--mpirun " + o.mpirun + " is not an executable file";
    return b;
  }
  std::string tried;
  const std::string bin = o.mpi_baseline.empty() ? find_program_near_epx("epx_mpi_baseline", tried) : o.mpi_baseline;
  if (bin.empty() || !executable(bin)) {
    b.why_not = o.mpi_baseline.empty()
                    ? "epx_mpi_baseline was not built (looked in " + tried + "); " + kInstallHint +
                          ", or pass --mpi-baseline PATH"
                    : "--mpi-baseline " + o.mpi_baseline + " is not an executable file";
    return b;
  }
  const fs::path routing = work_dir / "mpi_routing";
  const fs::path out = work_dir / "mpi_baseline.json";
  const fs::path log = work_dir / "mpi_baseline.log";
  write_routing_dir(p, routing);
  std::vector<std::string> argv = {mpirun};
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  for (const char* a : {"--oversubscribe", "--mca", "btl", "self,vader", "--mca", "osc", "^rdma", "-np"}) argv.push_back(a);
  argv.push_back(std::to_string(p.ranks));
  argv.push_back(bin);
  for (const std::string& a : baseline_args(o, routing, out)) argv.push_back(a);
  for (const std::string& a : argv) b.command += (b.command.empty() ? "" : " ") + shell_quote(a);
  const std::string failed = run_process(argv, log, std::chrono::seconds(600));
  if (!failed.empty()) {
    b.why_not = "epx_mpi_baseline failed (" + failed + "): " + tail_of(log, 600);
    return b;
  }
  read_baseline_json(out, o.iters, b);
  if (!b.why_not.empty()) return b;
  b.ran = true;
  return b;
}

void read_baseline_json(const fs::path& out, int iters, BaselineResult& b) {
  try {
    std::ifstream f(out);
    if (!f) throw std::runtime_error("no JSON written at " + out.string());
    const nlohmann::json j = nlohmann::json::parse(f);
    b.dispatch = summary_of(j.at("dispatch").at("max_rank_us"));
    b.combine = summary_of(j.at("combine").at("max_rank_us"));
    b.dispatch.n = b.combine.n = static_cast<std::size_t>(iters);
    b.dispatch_rank_us = j.at("dispatch").at("rank_us").get<std::vector<double>>();
    b.combine_rank_us = j.at("combine").at("rank_us").get<std::vector<double>>();
    b.recv_rows = j.at("recv_rows").get<std::vector<std::int64_t>>();
    b.dispatch_hash = j.at("dispatch_hash").get<std::vector<std::string>>();
    b.combine_hash = j.at("combine_hash").get<std::vector<std::string>>();
    if (j.contains("payload_bytes_per_rank")) b.payload_bytes = j["payload_bytes_per_rank"].get<std::vector<std::int64_t>>();
  } catch (const std::exception& e) {
    b.why_not = std::string("cannot read epx_mpi_baseline's JSON: ") + e.what();
  }
}

std::vector<std::string> baseline_args(const BenchOptions& o, const fs::path& routing, const fs::path& json) {
  std::vector<std::string> args = {"--routing", routing.string(), "--iters", std::to_string(o.iters), "--warmup",
                                   std::to_string(o.warmup), "--json", json.string(), "--layout", o.layout,
                                   "--alignment", std::to_string(o.alignment)};
  if (o.dataplane.combine_order == CombineOrder::kNodeFirst) {  // the same order of additions as epx's combine
    std::string nodes;
    for (const RankPlace& r : load_topology(o.dataplane.topology, o.ranks).ranks) nodes += (nodes.empty() ? "" : ",") + std::to_string(r.server);
    args.insert(args.end(), {"--node-of-rank", nodes});
  }
  return args;
}

void verify_baseline(BaselineResult& b, const std::vector<BenchRankRecord>& records) {
  b.verified = false;
  const std::size_t P = records.size();
  if (b.recv_rows.size() != P || b.dispatch_hash.size() != P || b.combine_hash.size() != P) {
    b.verify_detail = "the baseline reported " + std::to_string(b.dispatch_hash.size()) + " ranks, epx ran " + std::to_string(P);
    return;
  }
  std::string diffs;
  int bad = 0;
  for (std::size_t r = 0; r < P; ++r) {
    const BenchRankRecord& e = records[r];
    if (!e.hashed) {
      b.verify_detail = "epx did not hash its outputs";
      return;
    }
    auto note = [&](const std::string& what) {
      if (++bad <= 4) diffs += (diffs.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " " + what);
    };
    if (b.recv_rows[r] != e.out_rows)
      note("rows " + std::to_string(e.out_rows) + " (epx) vs " + std::to_string(b.recv_rows[r]) + " (mpi)");
    else if (b.dispatch_hash[r] != hex64(e.dispatch_hash))
      note("dispatch output differs (" + hex64(e.dispatch_hash) + " vs " + b.dispatch_hash[r] + ")");
    if (b.combine_hash[r] != hex64(e.combine_hash))
      note("combine output differs (" + hex64(e.combine_hash) + " vs " + b.combine_hash[r] + ")");
  }
  b.verified = bad == 0;
  b.verify_detail = bad == 0 ? "same dispatch rows and combine output on all " + std::to_string(P) +
                                   " ranks (FNV-1a 64 of recv_x and combined_x, identity expert)"
                             : std::to_string(bad) + " difference(s): " + diffs;
}

}  // namespace epx::tools
