// run_mpi_p2p_in_job without the MPI baseline library or the shmem transport in this build.
#include "p2p_peers.hpp"

namespace epx::tools {

nlohmann::json run_mpi_p2p_in_job(const P2PCommon&, const std::vector<std::string>&, int, const std::filesystem::path&,
                                  PeerRun& run) {
  run.name = "mpi";
  run.why_not = "this build has no MPI baseline library or no shmem transport";
  return nullptr;
}

}  // namespace epx::tools
