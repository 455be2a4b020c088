// run_mpi_baseline_in_job: epx_mpi_baseline::run inside the oshrun job (built when the
// baseline library and the shmem transport are; mpi_job_unavailable.cpp otherwise).
#include <mpi.h>

#include <string>
#include <vector>

#include "collective_job.hpp"
#include "epx/bench/mpi.hpp"
#include "mpi_baseline.hpp"
#include "mpi_collective.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

BaselineResult run_mpi_baseline_in_job(const BenchOptions& o, const BenchProblem& p, int rank, const fs::path& work_dir) {
  BaselineResult b;
  if (p.fp8) {
    b.why_not = "epx_mpi_baseline moves bf16 rows only (this run is --fp8)";
    return b;
  }
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    b.why_not = "MPI is not initialised in this process (the shmem runtime of Open MPI starts it)";
    return b;
  }
  const fs::path routing = work_dir / "mpi_routing";
  const fs::path json = work_dir / "mpi_baseline.json";
  write_routing_dir(p, routing, rank);  // this rank's part, on this machine
  std::vector<std::string> args = baseline_args(o, routing, json);
  args.insert(args.begin(), "epx_mpi_baseline");
  args.push_back("--quiet");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  b.command = "in this job: epx_mpi_baseline::run over MPI_COMM_WORLD (the OpenSHMEM PEs), the same ranks and routing";
  const int rc = epx_mpi_baseline::run(static_cast<int>(args.size()), argv.data());
  if (rc != 0) {
    b.why_not = "epx_mpi_baseline failed (exit status " + std::to_string(rc) + ")";
    return b;
  }
  if (rank == 0) {
    read_baseline_json(json, o.iters, b);
    if (!b.why_not.empty()) return b;
  }
  b.ran = true;
  return b;
}

std::string run_mpi_collective_in_job(std::vector<std::string> args) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return "MPI is not initialised in this process (the shmem runtime of Open MPI starts it)";
  args.insert(args.begin(), "epx_mpi_collective");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = epx_mpi_collective::run(static_cast<int>(args.size()), argv.data());
  return rc == 0 ? "" : "epx_mpi_collective failed (exit status " + std::to_string(rc) + ")";
}

}  // namespace epx::tools
