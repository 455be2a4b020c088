// epx_mpi_baseline as a library: the Megatron-style MPI_Alltoallv dispatcher of
// baselines/mpi_baseline.cpp (what a user writes without epx; no epx header here either).
#pragma once

namespace epx_mpi_baseline {

/// The whole program but MPI_Init / MPI_Finalize: `argv` are epx_mpi_baseline's arguments
/// (argv[0] is ignored; see its usage), over MPI_COMM_WORLD, which must be initialised —
/// by MPI_Init, or by shmem_init in an OpenSHMEM job of Open MPI, whose PEs are
/// MPI_COMM_WORLD's ranks. Collective. Returns the exit status (0, or 1 when rank 0 could
/// not write the JSON); a bad input or option aborts the job (MPI_Abort, exit code 2), as
/// the program does; other failures throw std::exception.
int run(int argc, char** argv);

}  // namespace epx_mpi_baseline
