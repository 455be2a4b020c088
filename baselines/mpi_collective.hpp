// epx_mpi_collective as a library: Open MPI's MPI_Allgather / MPI_Reduce_scatter_block /
// MPI_Allreduce on the inputs of `epx bench --op` (baselines/collective_data.hpp), timed the
// same way (what a user calls without epx; no epx header here either).
#pragma once

namespace epx_mpi_collective {

/// The whole program but MPI_Init / MPI_Finalize over MPI_COMM_WORLD (initialised by
/// MPI_Init or by Open MPI's shmem_init). `argv` as the program's (argv[0] ignored):
///   --op all_gather|reduce_scatter|all_reduce --bytes N --tensors T --iters I --warmup W
///   --seed S --json OUT
/// Collective. Returns 0, or 1 when rank 0 could not write the JSON; a bad option aborts the
/// job (MPI_Abort, exit code 2).
int run(int argc, char** argv);

}  // namespace epx_mpi_collective
