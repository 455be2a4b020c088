// The peers of epx bench --op pp|engram (private to epx_bench): epx_mpi_p2p_baseline under
// mpirun and gloo_p2p_baseline.py under python3, on the same problem; their samples and
// hashes into the report, checked against epx's.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epx/bench/p2p.hpp"

namespace epx::tools {

/// The peers' arguments for the op's problem (their --iters/--warmup/--json come apart).
std::vector<std::string> pp_peer_args(const PPBenchOptions& o);
std::vector<std::string> engram_peer_args(const EngramBenchOptions& o);

/// A peer's JSON (null when it did not run) into the report, checked against epx's hashes.
void attach_pp_peer(PeerRun run, const nlohmann::json& j, PPBenchReport& rep);
void attach_engram_peer(PeerRun run, const nlohmann::json& j, EngramBenchReport& rep);

/// In an oshrun job: epx_mpi_p2p_baseline::run over MPI_COMM_WORLD (the PEs) with `args`;
/// collective. Rank 0 gets the JSON; run says why when it could not run (on every rank).
nlohmann::json run_mpi_p2p_in_job(const P2PCommon& c, const std::vector<std::string>& args, int rank,
                                  const std::filesystem::path& dir, PeerRun& run);

/// Runs `peer` ("mpi" | "gloo") on `ranks` ranks with the op's arguments; its JSON, or null
/// when it did not run (run.why_not says why).
nlohmann::json run_peer(const P2PCommon& c, const std::string& peer, int ranks, const std::vector<std::string>& args,
                        const std::filesystem::path& dir, PeerRun& run);

/// Pools the samples of another round into `into` (number arrays concatenated, everything
/// else — hashes, counts — kept from the first round).
void merge_samples(nlohmann::json& into, const nlohmann::json& more);

}  // namespace epx::tools
