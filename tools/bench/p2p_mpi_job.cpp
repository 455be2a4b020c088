// run_mpi_p2p_in_job: epx_mpi_p2p_baseline::run inside the oshrun job (built with the MPI
// baseline and the shmem transport; p2p_mpi_job_unavailable.cpp otherwise).
#include <mpi.h>

#include <fstream>

#include "mpi_p2p_baseline.hpp"
#include "p2p_peers.hpp"

namespace epx::tools {

nlohmann::json run_mpi_p2p_in_job(const P2PCommon& c, const std::vector<std::string>& op_args, int rank,
                                  const std::filesystem::path& dir, PeerRun& run) {
  run.name = "mpi";
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    run.why_not = "MPI is not initialised in this process (the shmem runtime of Open MPI starts it)";
    return nullptr;
  }
  const std::filesystem::path json = dir / "mpi_p2p.json";
  std::vector<std::string> args = {"epx_mpi_p2p_baseline"};
  args.insert(args.end(), op_args.begin(), op_args.end());
  for (const std::string& a : {std::string("--iters"), std::to_string(c.iters), std::string("--warmup"),
                               std::to_string(c.warmup), std::string("--json"), json.string()})
    args.push_back(a);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  run.command = "in this job: epx_mpi_p2p_baseline::run over MPI_COMM_WORLD (the OpenSHMEM PEs), the same ranks";
  if (epx_mpi_p2p_baseline::run(static_cast<int>(args.size()), argv.data()) != 0) {
    run.why_not = "epx_mpi_p2p_baseline failed";
    return nullptr;
  }
  run.ran = true;
  if (rank != 0) return nullptr;
  try {
    return nlohmann::json::parse(std::ifstream(json));
  } catch (const std::exception& e) {
    run.ran = false;
    run.why_not = std::string("cannot read the baseline's JSON: ") + e.what();
    return nullptr;
  }
}

}  // namespace epx::tools
