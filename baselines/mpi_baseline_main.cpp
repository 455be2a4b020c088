// epx_mpi_baseline: the program (baselines/mpi_baseline.cpp says what it does).
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "mpi_baseline.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = epx_mpi_baseline::run(argc, argv);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "epx_mpi_baseline: error on rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return rc;
}
