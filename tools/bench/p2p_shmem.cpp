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

/// One op's parts for the shmem job (PP and Engram differ only in these).
template <class Options, class Report>
struct P2POp {
  void (*check)(const Options&, int ranks);
  std::string (*run_rank)(Transport&, const Options&);
  Report (*aggregate)(const Options&, const std::vector<std::string>& records);
  std::vector<std::string> (*peer_args)(const Options&);
  void (*attach)(PeerRun, const nlohmann::json&, Report&);
  /// Why the MPI peer cannot run with these options ("" = it can).
  std::string (*why_no_mpi)(const Options&);
};

/// The peer `peer` when it does not run in this job: `why`, or (gloo) that it starts its own
/// processes on one machine.
PeerRun not_here(const std::string& peer, std::string why) {
  PeerRun r;
  r.name = peer;
  r.why_not = why.empty() ? "not inside an oshrun job (the gloo peer starts its own processes on one machine)" : std::move(why);
  return r;
}

/// The job: every rank's timed loops on the shmem transport, rank 0's report, then the MPI
/// peer in the same processes (MPI_COMM_WORLD = the PEs).
template <class Options, class Report>
P2PJobResult<Report> measure_in_job(const Options& given, const P2POp<Options, Report>& op) {
  const auto wall0 = std::chrono::steady_clock::now();
  auto boot = shmem_bootstrap();
  Options o = given;
  o.common.ranks = boot->size();
  op.check(o, o.common.ranks);
  const NodeMap nodes = discover_nodes(*boot);
  P2PJobResult<Report> m;
  m.node_layout = describe_nodes(*boot, nodes);
  TempDir tmp;
  const auto records = job_records(*boot, o.common, [&](Transport& t) { return op.run_rank(t, o); });
  m.report = op.aggregate(o, records);
  for (const std::string& peer : o.common.peers) {
    if (peer == "none") continue;
    PeerRun run;
    nlohmann::json j;
    const std::string why = peer == "mpi" ? op.why_no_mpi(o) : "";
    if (peer == "mpi" && why.empty()) j = run_mpi_p2p_in_job(o.common, op.peer_args(o), boot->rank(), tmp.path(), run);
    else run = not_here(peer, why);
    if (boot->rank() != 0) run.ran = false;  // only rank 0 has the JSON and aggregates
    op.attach(std::move(run), j, m.report);
  }
  m.root = boot->rank() == 0;
  boot->barrier();
  m.report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return m;
}

}  // namespace

P2PJobResult<PPBenchReport> measure_pp_shmem(const PPBenchOptions& o) {
  return measure_in_job<PPBenchOptions, PPBenchReport>(
      o, {check_pp_options, run_pp_rank, aggregate_pp, pp_peer_args, attach_pp_peer,
          [](const PPBenchOptions&) { return std::string(); }});
}

P2PJobResult<EngramBenchReport> measure_engram_shmem(const EngramBenchOptions& o) {
  return measure_in_job<EngramBenchOptions, EngramBenchReport>(
      o, {check_engram_options, run_engram_rank, aggregate_engram, engram_peer_args, attach_engram_peer,
          engram_peers_why_not});
}

}  // namespace epx::tools
