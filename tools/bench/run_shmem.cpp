// epx bench --transport shmem: one rank per process, ranks from the launcher (oshrun /
// mpirun); epx forks nothing. Every rank builds the same problem, runs its part through
// the shmem transport, and sends its record to rank 0 through the bootstrap; rank 0
// aggregates the report (the tool prints it with the node layout), the others get none.
// --baseline mpi runs epx_mpi_baseline's dispatcher afterwards in the same processes
// (MPI_COMM_WORLD = the PEs), on the same routing, and the report compares the two.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/mpi.hpp"
#include "epx/bench/routing.hpp"
#include "epx/bench/run.hpp"
#include "epx/bench/runner.hpp"
#include "epx/bench/launched_job.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "epx/shmem.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// "heap 5.6 GiB per PE (epx default: ...); epx set OMPI_MCA_osc=ucx, SMA_SYMMETRIC_SIZE=5734M"
std::string describe_runtime(const ShmemRuntimeInfo& info) {
  std::string s = "heap " + (info.heap_bytes ? std::to_string(info.heap_bytes >> 20) + " MiB" : std::string("of unknown size")) +
                  " per PE (" + info.heap_from + ")";
  std::string set;
  for (const std::string& v : info.set_by_epx) set += (set.empty() ? "" : ", ") + v;
  return s + (set.empty() ? "; epx set nothing (the launcher had)" : "; epx set " + set + " (the launcher had not)");
}

}  // namespace

ShmemBenchMeasurement measure_bench_shmem(const BenchOptions& given) {
  if (!given.sweep.empty() || given.eplb || !given.trace.empty())
    throw Error(ErrorCode::kUnsupported, "epx bench --transport shmem: --sweep, --eplb and --trace need the fork launcher");
  auto boot = shmem_bootstrap();
  const NodeMap nodes = discover_nodes(*boot);
  BenchOptions o = given;
  o.ranks = boot->size();  // from the launcher
  // No schedule chosen: across nodes, each token crosses once per node pair (hierarchical,
  // node-first combine). The hierarchical schedule follows the job's real node layout unless
  // --topology says otherwise.
  if (o.schedule_auto) default_schedule_across_nodes(o.dataplane, nodes);
  default_topology_from_nodes(o.dataplane, *boot, nodes, "epx bench");
  validate_options(o);
  ShmemBenchMeasurement m;
  m.num_nodes = nodes.num_nodes;
  m.node_layout = describe_nodes(*boot, nodes);
  m.runtime = describe_runtime(shmem_runtime_info());
  BenchProblem problem = make_problem(o);
  if (problem.ranks != boot->size())
    throw Error(ErrorCode::kInvalidArgument, "epx bench: the routing has " + std::to_string(problem.ranks) +
                                                 " ranks, the launcher started " + std::to_string(boot->size()));
  check_dataplane(o.dataplane, problem.ranks);
  const RouteCount count = count_routes(problem, o.expanded(), o.alignment);
  auto tmp = std::make_unique<TempDir>();  // removed before the final barrier
  const fs::path& dir = tmp->path();
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
  const auto blobs = allgather_strings(*boot, record);
  // --baseline mpi: the same ranks of this job, the same routing, after epx's run.
  BaselineResult baseline;
  if (o.baseline == "mpi") {
    if (o.progress && me == 0) std::fprintf(stderr, "epx bench: running the MPI baseline in this job ...\n");
    baseline = run_mpi_baseline_in_job(o, problem, me, dir);
  }
  if (me == 0) {
    std::vector<BenchRankRecord> records;
    for (int r = 0; r < problem.ranks; ++r) {
      std::ofstream(bench_record_path(dir, r), std::ios::binary) << blobs[static_cast<std::size_t>(r)];
      records.push_back(read_bench_record(bench_record_path(dir, r)));
    }
    m.report = aggregate_bench(o, problem, count, records);
    if (o.baseline == "mpi") attach_baseline(m.report, std::move(baseline), records, count);
    m.root = true;
  }
  tmp.reset();
  boot->barrier();
  return m;
}

}  // namespace epx::tools
