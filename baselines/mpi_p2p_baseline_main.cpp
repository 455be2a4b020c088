// epx_mpi_p2p_baseline: see mpi_p2p_baseline.cpp.
#include <mpi.h>

#include "mpi_p2p_baseline.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rc = epx_mpi_p2p_baseline::run(argc, argv);
  MPI_Finalize();
  return rc;
}
