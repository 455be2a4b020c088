// run_mpi_baseline_in_job in a build without the MPI baseline library or the shmem transport.
#include "collective_job.hpp"
#include "epx/bench/mpi.hpp"

namespace epx::tools {

BaselineResult run_mpi_baseline_in_job(const BenchOptions&, const BenchProblem&, int, const std::filesystem::path&) {
  BaselineResult b;
  b.why_not = "this build has no MPI baseline library in epx (needs Open MPI with OpenSHMEM: apt-get install "
              "libopenmpi-dev openmpi-bin, and a build that is not a sanitizer build)";
  return b;
}

std::string run_mpi_collective_in_job(std::vector<std::string>) {
  return "this build has no MPI collective baseline library in epx (needs Open MPI with OpenSHMEM, not a sanitizer build)";
}

}  // namespace epx::tools
