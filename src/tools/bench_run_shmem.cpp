// epx bench --transport shmem: one rank per process, ranks from the launcher (oshrun /
// mpirun); epx forks nothing. Every rank builds the same problem, runs its part through
// the shmem transport, and sends its record to rank 0 through the bootstrap; rank 0
// aggregates and prints the report (with the node layout), the others print nothing.
// --baseline mpi runs epx_mpi_baseline's dispatcher afterwards in the same processes
// (MPI_COMM_WORLD = the PEs), on the same routing, and the report compares the two.
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "bench_dataplane.hpp"
#include "bench_mpi.hpp"
#include "bench_output.hpp"
#include "bench_routing.hpp"
#include "bench_run.hpp"
#include "bench_runner.hpp"
#include "launched_job.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "epx/shmem.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

fs::path private_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/epx-bench-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) throw Error(ErrorCode::kIo, "cannot create a temporary directory " + templ);
  return templ;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int run_bench_shmem(const BenchOptions& given, std::FILE* out, BenchReport* report) {
  if (!given.sweep.empty() || given.eplb || !given.trace.empty())
    throw Error(ErrorCode::kUnsupported, "epx bench --transport shmem: --sweep, --eplb and --trace need the fork launcher");
  auto boot = shmem_bootstrap();
  const NodeMap nodes = discover_nodes(*boot);
  BenchOptions o = given;
  o.ranks = boot->size();  // from the launcher
  // The hierarchical schedule follows the job's real node layout unless --topology says otherwise.
  default_topology_from_nodes(o.dataplane, *boot, nodes, "epx bench");
  validate_options(o);
  const std::string layout = describe_nodes(*boot, nodes);
  BenchProblem problem = make_problem(o);
  if (problem.ranks != boot->size())
    throw Error(ErrorCode::kInvalidArgument, "epx bench: the routing has " + std::to_string(problem.ranks) +
                                                 " ranks, the launcher started " + std::to_string(boot->size()));
  check_dataplane(o.dataplane, problem.ranks);
  const RouteCount count = count_routes(problem, o.expanded(), o.alignment);
  const fs::path dir = private_dir();
  const int me = boot->rank();
  std::string record;
  {
    ConnectOptions co;
    co.kind = ConnectKind::kShmem;
    co.timeout = std::chrono::milliseconds(o.timeout_ms);
    auto t = connect(*boot, co);
    run_bench_rank(*t, problem, count, o, dir);
    record = read_file(bench_record_path(dir, me));
  }
  const auto blobs = gather_blobs(*boot, record);
  // --baseline mpi: the same ranks of this job, the same routing, after epx's run.
  BaselineResult baseline;
  if (o.baseline == "mpi") {
    if (o.progress && me == 0) std::fprintf(stderr, "epx bench: running the MPI baseline in this job ...\n");
    baseline = run_mpi_baseline_in_job(o, problem, me, dir);
  }
  int status = 0;
  if (me == 0) {
    std::vector<BenchRankRecord> records;
    for (int r = 0; r < problem.ranks; ++r) {
      std::ofstream(bench_record_path(dir, r), std::ios::binary) << blobs[static_cast<std::size_t>(r)];
      records.push_back(read_bench_record(bench_record_path(dir, r)));
    }
    BenchReport rep = aggregate_bench(o, problem, count, records);
    if (o.baseline == "mpi") attach_baseline(rep, std::move(baseline), records, count);
    status = bench_status(rep);
    std::fprintf(out, "transport shmem (ranks from the launcher): %d nodes; %s\n", nodes.num_nodes, layout.c_str());
    print_bench_report(out, rep);
    if (!o.json.empty()) {
      write_bench_json(o.json, rep);
      std::fprintf(out, "\nwrote %s\n", o.json.c_str());
    }
    std::fflush(out);
    if (report) *report = std::move(rep);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  boot->barrier();
  return status;
}

}  // namespace epx::tools
