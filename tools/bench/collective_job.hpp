// epx_mpi_collective::run inside an oshrun job (mpi_job.cpp; mpi_job_unavailable.cpp in a
// build without the MPI libraries or the shmem transport).
#pragma once

#include <string>
#include <vector>

namespace epx::tools {

/// Runs epx_mpi_collective with `args` (its options, no program name) over MPI_COMM_WORLD
/// of this job; collective. "" on success, else why not.
std::string run_mpi_collective_in_job(std::vector<std::string> args);

}  // namespace epx::tools
