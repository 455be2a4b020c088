// epx_mpi_p2p_baseline as a library (baselines/mpi_p2p_baseline.cpp): the MPI peers of
// `epx bench --op pp|engram`, no epx header.
#pragma once

namespace epx_mpi_p2p_baseline {

/// The program but MPI_Init / MPI_Finalize (argv as the program's; argv[0] ignored), over an
/// initialised MPI_COMM_WORLD (MPI_Init, or Open MPI's shmem_init). Collective. Returns 0, or
/// 1 when rank 0 could not write the JSON (on every rank); bad options abort the job.
int run(int argc, char** argv);

}  // namespace epx_mpi_p2p_baseline
