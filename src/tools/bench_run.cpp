#include "bench_run.hpp"

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "bench_dataplane.hpp"
#include "bench_eplb.hpp"
#include "bench_mpi.hpp"
#include "bench_output.hpp"
#include "bench_routing.hpp"
#include "bench_runner.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/spi/janitor.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

// A private temp dir for the ranks' records (and the baseline's input), removed on exit.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/epx-bench-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) throw Error(ErrorCode::kIo, "cannot create a temporary directory " + templ);
    path_ = templ;
    // Removed by the janitor too if this process dies without unwinding (SIGKILL, SIGINT).
    detail::remove_at_exit(path_.string());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

}  // namespace

void attach_baseline(BenchReport& rep, BaselineResult baseline, const std::vector<BenchRankRecord>& records,
                     const RouteCount& count) {
  rep.baseline_requested = true;
  rep.baseline = std::move(baseline);
  if (!rep.baseline.ran) return;
  verify_baseline(rep.baseline, records);
  if (!rep.baseline.payload_bytes.empty()) {
    std::vector<std::int64_t> mine;
    for (std::size_t r = 0; r < records.size(); ++r) mine.push_back(count.dispatch_bytes(static_cast<int>(r)));
    if (rep.baseline.payload_bytes != mine)
      rep.warnings.push_back("the MPI baseline counts different dispatch payload bytes per rank than epx bench");
  }
}

int bench_status(const BenchReport& rep) {
  return rep.baseline_requested && rep.baseline.ran && !rep.baseline.verified ? 3 : 0;
}

BenchMeasurement measure_bench(const BenchOptions& o) {
  const auto wall0 = std::chrono::steady_clock::now();
  validate_options(o);
  BenchProblem problem = make_problem(o);
  check_dataplane(o.dataplane, problem.ranks);  // again: with --routing, P is known only now
  EplbReport eplb;
  if (o.eplb) eplb = apply_eplb(o, problem);  // from here on, the problem's routing is the physical one
  const RouteCount count = count_routes(problem, o.expanded(), o.alignment);
  TempDir tmp;

  LaunchOptions lo;
  lo.num_ranks = problem.ranks;
  lo.transport = parse_transport_kind(o.transport);
  lo.timeout = checked_timeout(o.timeout_ms);
  launch(lo, [&](Transport& t) { run_bench_rank(t, problem, count, o, tmp.path()); });
  if (eplb.dynamic) time_lb_transfers(o, problem, lo, std::max(1, std::min(o.iters, 5)), tmp.path().string(), eplb);

  std::vector<BenchRankRecord> records;
  for (int r = 0; r < problem.ranks; ++r) records.push_back(read_bench_record(bench_record_path(tmp.path(), r)));

  BenchReport rep = aggregate_bench(o, problem, count, records);
  if (eplb.enabled) {
    eplb.measured_slowest_rank = rep.route.slowest_rank;
    if (eplb.with.recv_rows != count.recv_rows || eplb.with.recv_slots != count.recv_slots)
      rep.warnings.push_back("eplb: the physical routing's received rows differ from those of the timed run's count");
    rep.eplb = std::move(eplb);
  }
  if (o.baseline == "mpi") {
    rep.baseline_requested = true;
    if (o.progress) std::fprintf(stderr, "epx bench: running the MPI baseline ...\n");
    attach_baseline(rep, run_mpi_baseline(o, problem, tmp.path()), records, count);
    if (!rep.baseline.ran && o.progress)
      std::fprintf(stderr, "epx bench: MPI baseline unavailable: %s\n", rep.baseline.why_not.c_str());
  }
  rep.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return {std::move(rep), std::move(records)};
}

int run_bench(const BenchOptions& o, std::FILE* out, BenchReport* report) {
  if (o.transport == "shmem") return run_bench_shmem(o, out, report);  // ranks from oshrun (bench_run_shmem.cpp)
  BenchMeasurement run = measure_bench(o);
  BenchReport& rep = run.report;
  print_bench_report(out, rep);
  if (!o.json.empty()) {
    write_bench_json(o.json, rep);
    std::fprintf(out, "\nwrote %s\n", o.json.c_str());
  }
  if (!o.trace.empty()) {
    write_bench_trace(o.trace, run.records);
    std::fprintf(out, "wrote %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o.trace.c_str());
  }
  std::fflush(out);
  const int status = bench_status(rep);
  if (report) *report = std::move(rep);
  return status;
}

}  // namespace epx::tools
