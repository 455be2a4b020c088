// The peers of epx bench --op pp|engram (private to epx_bench): epx_mpi_p2p_baseline under
// mpirun and gloo_p2p_baseline.py under python3, on the same problem; their samples and
// hashes into the report, checked against epx's.
#pragma once

#include <filesystem>

#include "epx/bench/p2p.hpp"

namespace epx::tools {

void run_pp_peers(const PPBenchOptions& o, PPBenchReport& rep, const std::filesystem::path& dir);
void run_engram_peers(const EngramBenchOptions& o, EngramBenchReport& rep, const std::filesystem::path& dir);

}  // namespace epx::tools
