// epx bench --op pp|engram --transport shmem: one rank per process, ranks from oshrun; every
// rank runs its timed loops on the shmem transport and sends its record to rank 0 through
// the bootstrap; the MPI peer runs afterwards in the same processes (MPI_COMM_WORLD = the
// PEs); the gloo peer does not run here (it starts its own processes on one machine).
#include "epx/bench/p2p.hpp"

#include <chrono>

#include "epx/bench/launched_job.hpp"
#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/shmem.hpp"
#include "p2p_peers.hpp"
#include "temp_dir.hpp"

namespace epx::tools {

namespace {

/// Runs `rank_fn` on this job's shmem transport; every rank's record, by rank.
template <class F>
std::vector<std::string> job_records(Bootstrap& boot, const P2PCommon& c, F&& rank_fn) {
  std::string mine;
  {
    ConnectOptions co;
    co.kind = ConnectKind::kShmem;
    co.timeout = std::chrono::milliseconds(c.timeout_ms);
    auto t = connect(boot, co);
    mine = rank_fn(*t);
  }
  return allgather_strings(boot, mine);
}

PeerRun gloo_not_here() {
  PeerRun r;
  r.name = "gloo";
  r.why_not = "not inside an oshrun job (the gloo peer starts its own processes on one machine)";
  return r;
}

}  // namespace

P2PJobResult<PPBenchReport> measure_pp_shmem(const PPBenchOptions& given) {
  const auto wall0 = std::chrono::steady_clock::now();
  auto boot = shmem_bootstrap();
  PPBenchOptions o = given;
  o.common.ranks = boot->size();
  check_pp_options(o, o.common.ranks);
  const NodeMap nodes = discover_nodes(*boot);
  P2PJobResult<PPBenchReport> m;
  m.node_layout = describe_nodes(*boot, nodes);
  TempDir tmp;
  const auto records = job_records(*boot, o.common, [&](Transport& t) { return run_pp_rank(t, o); });
  m.report = aggregate_pp(o, records);
  for (const std::string& peer : o.common.peers) {
    PeerRun run;
    nlohmann::json j;
    if (peer == "none") continue;
    if (peer == "mpi") j = run_mpi_p2p_in_job(o.common, pp_peer_args(o), boot->rank(), tmp.path(), run);
    else run = gloo_not_here();
    if (boot->rank() != 0) run.ran = false;  // only rank 0 has the JSON and aggregates
    attach_pp_peer(std::move(run), j, m.report);
  }
  m.root = boot->rank() == 0;
  boot->barrier();
  m.report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return m;
}

P2PJobResult<EngramBenchReport> measure_engram_shmem(const EngramBenchOptions& given) {
  const auto wall0 = std::chrono::steady_clock::now();
  auto boot = shmem_bootstrap();
  EngramBenchOptions o = given;
  o.common.ranks = boot->size();
  check_engram_options(o, o.common.ranks);
  const NodeMap nodes = discover_nodes(*boot);
  P2PJobResult<EngramBenchReport> m;
  m.node_layout = describe_nodes(*boot, nodes);
  TempDir tmp;
  const auto records = job_records(*boot, o.common, [&](Transport& t) { return run_engram_rank(t, o); });
  m.report = aggregate_engram(o, records);
  for (const std::string& peer : o.common.peers) {
    PeerRun run;
    nlohmann::json j;
    if (peer == "none") continue;
    if (peer == "mpi" && !o.fp8) j = run_mpi_p2p_in_job(o.common, engram_peer_args(o), boot->rank(), tmp.path(), run);
    else run = gloo_not_here(), run.name = peer;
    if (boot->rank() != 0) run.ran = false;
    attach_engram_peer(std::move(run), j, m.report);
  }
  m.root = boot->rank() == 0;
  boot->barrier();
  m.report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return m;
}

}  // namespace epx::tools
