// epx bench --op <collective> --baseline mpi | gloo: the same op on the same inputs through
// Open MPI (epx_mpi_collective, via mpirun or inside the shmem job) or torch.distributed
// gloo (python -m epx.bench_collective), after epx's run, compared with epx's results.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "collective_data.hpp"
#include "collective_job.hpp"
#include "epx/bench/collective.hpp"
#include "epx/bench/dataplane_options.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

std::vector<std::string> baseline_args(const BenchOptions& o, const fs::path& json) {
  return {"--op", o.op, "--bytes", std::to_string(parse_byte_size(o.bytes)), "--tensors", std::to_string(o.tensors),
          "--iters", std::to_string(o.iters), "--warmup", std::to_string(o.warmup), "--seed", std::to_string(o.seed),
          "--json", json.string()};
}

/// mpirun -np P epx_mpi_collective ...: "" or why not.
std::string run_mpirun(const BenchOptions& o, int ranks, const fs::path& json, const fs::path& log, CollectiveBaseline& b) {
  const std::string mpirun = o.mpirun.empty() ? on_path("mpirun") : o.mpirun;
  if (mpirun.empty() || !executable(mpirun)) return "Open MPI is not installed (no mpirun on PATH)";
  std::string tried;
  const std::string bin = find_program_near_epx("epx_mpi_collective", tried);
  if (bin.empty()) return "epx_mpi_collective was not built (looked in " + tried + ")";
  std::vector<std::string> argv = {mpirun};
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  for (const char* a : {"--oversubscribe", "--mca", "btl", "self,vader", "--mca", "osc", "^rdma", "-np"}) argv.push_back(a);
  argv.push_back(std::to_string(ranks));
  argv.push_back(bin);
  for (const std::string& a : baseline_args(o, json)) argv.push_back(a);
  for (const std::string& a : argv) b.command += (b.command.empty() ? "" : " ") + shell_quote(a);
  const std::string failed = run_process(argv, log, std::chrono::seconds(900));
  return failed.empty() ? "" : "epx_mpi_collective failed (" + failed + "): " + tail_of(log, 600);
}

/// /usr/bin/python3 -m epx.bench_collective ...: "" or why not.
std::string run_gloo(const BenchOptions& o, int ranks, const fs::path& json, const fs::path& log, CollectiveBaseline& b) {
  if (o.transport == "shmem") return "gloo runs its own ranks on this machine (not inside a shmem job)";
  const std::string python = "/usr/bin/python3";
  if (!executable(python)) return "no /usr/bin/python3 (Debian's, with python3-torch)";
  // This build's package (<build>/src/tools/epx -> <build>/python/epx) first, else the installed one.
  std::vector<std::string> env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path dir = (exe.parent_path() / ".." / ".." / "python").lexically_normal();
  if (!ec && fs::exists(dir / "epx" / "__init__.py", ec)) env.push_back("PYTHONPATH=" + dir.string());
  std::vector<std::string> argv = {python, "-m", "epx.bench_collective", "--ranks", std::to_string(ranks)};
  for (const std::string& a : baseline_args(o, json)) argv.push_back(a);
  for (const std::string& a : env) b.command += a + " ";
  for (const std::string& a : argv) b.command += (a == argv.front() ? "" : " ") + shell_quote(a);
  const std::string failed = run_process(argv, log, std::chrono::seconds(900), env);
  return failed.empty() ? "" : "the gloo baseline failed (" + failed + "): " + tail_of(log, 600);
}

void read_json(const fs::path& json, CollectiveBaseline& b) {
  std::ifstream f(json);
  if (!f) {
    b.why_not = "the baseline wrote no " + json.string();
    return;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    const auto& m = j.at("max_rank_us");
    b.max_rank = {m.at("avg"), m.at("p50"), m.at("p95"), m.at("max"), 0};
    for (const auto& r : j.at("ranks_detail")) {
      b.rank_avg_us.push_back(r.at("avg_us"));
      b.hashes.push_back(r.at("hash"));
      b.samples.push_back(r.at("samples").get<std::vector<float>>());
    }
    if (j.contains("note")) b.note = j.at("note");
  } catch (const std::exception& e) {
    b.why_not = std::string("the baseline's JSON is malformed: ") + e.what();
  }
}

/// Bitwise where the order is the members' (all_gather moves bytes), else each sample
/// within float32 rounding of a sum of P terms of magnitude <= 4.
void verify(CollectiveBaseline& b, const std::vector<CollectiveRankRecord>& records, int ranks) {
  if (b.hashes.size() != records.size()) {
    b.verify_detail = "the baseline reports " + std::to_string(b.hashes.size()) + " ranks, epx " + std::to_string(records.size());
    return;
  }
  bool same_bits = true;
  for (std::size_t r = 0; r < records.size(); ++r) same_bits = same_bits && b.hashes[r] == records[r].hash;
  if (same_bits) {
    b.verified = true;
    b.verify_detail = "bitwise equal on every rank (FNV-1a 64 of the outputs)";
    return;
  }
  if (b.bitwise) {
    b.verify_detail = "outputs differ: rank 0 hash " + b.hashes[0] + " vs epx " + records[0].hash;
    return;
  }
  // A partial sum of P values in [-4, 4) stays below 4P: each of the P - 1 additions rounds
  // by at most half its ulp, on either side.
  const double tol = ranks * std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(4.0 * ranks))) - 23);
  double worst = 0;
  for (std::size_t r = 0; r < records.size(); ++r) {
    if (b.samples[r].size() != records[r].samples.size()) {
      b.verify_detail = "rank " + std::to_string(r) + ": " + std::to_string(b.samples[r].size()) + " samples, epx " +
                        std::to_string(records[r].samples.size());
      return;
    }
    for (std::size_t i = 0; i < b.samples[r].size(); ++i) {
      const double d = std::fabs(static_cast<double>(b.samples[r][i]) - records[r].samples[i]);
      worst = std::max(worst, d);
      if (d > tol) {
        b.verify_detail = "rank " + std::to_string(r) + " sample " + std::to_string(i) + ": " + std::to_string(b.samples[r][i]) +
                          " vs epx " + std::to_string(records[r].samples[i]) + " (tolerance " + std::to_string(tol) + ")";
        return;
      }
    }
  }
  b.verified = true;
  b.verify_detail = "within float32 tolerance " + std::to_string(tol) + " at " + std::to_string(records[0].samples.size()) +
                    " samples per rank (max difference " + std::to_string(worst) + "; another summation order, so not bitwise)";
}

}  // namespace

void run_collective_baseline(const BenchOptions& o, CollectiveReport& rep, const std::vector<CollectiveRankRecord>& records,
                             const fs::path& work_dir) {
  CollectiveBaseline& b = rep.baseline;
  b.requested = true;
  b.name = o.baseline;
  b.bitwise = o.op == "all_gather";
  const fs::path json = work_dir / "collective_baseline.json", log = work_dir / "collective_baseline.log";
  std::string failed;
  if (o.baseline == "mpi" && o.transport == "shmem") {
    b.command = "in this job: epx_mpi_collective::run over MPI_COMM_WORLD (the OpenSHMEM PEs), the same ranks and inputs";
    failed = run_mpi_collective_in_job(baseline_args(o, json));
    if (failed.empty() && records.size() > 0 && !fs::exists(json)) return;  // not rank 0: nothing to read
  } else if (o.baseline == "mpi") {
    failed = run_mpirun(o, rep.ranks, json, log, b);
  } else {
    failed = run_gloo(o, rep.ranks, json, log, b);
  }
  if (!failed.empty()) {
    b.why_not = failed;
    return;
  }
  read_json(json, b);
  if (!b.why_not.empty()) return;
  b.ran = true;
  verify(b, records, rep.ranks);
  b.speedup = rep.max_rank.avg > 0 ? b.max_rank.avg / rep.max_rank.avg : 0;
}

}  // namespace epx::tools
