#include "epx/bench/run.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/eplb.hpp"
#include "epx/bench/mpi.hpp"
#include "epx/bench/routing.hpp"
#include "epx/bench/runner.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "temp_dir.hpp"
#include "wait_mode.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

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
  const DiagnoseWaitMode waits(o.diagnose, problem.ranks);
  if (waits.chose_sleep() && o.progress)
    std::fprintf(stderr, "epx bench: diagnose: %d ranks outnumber the cores: they wait in epx's sleep mode "
                 "(EPX_WAIT=sleep; set EPX_WAIT to choose)\n", problem.ranks);

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

}  // namespace epx::tools
