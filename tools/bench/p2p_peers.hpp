// The peers of epx bench --op pp|engram (private to epx_bench): epx_mpi_p2p_baseline under
// mpirun and gloo_p2p_baseline.py under python3, on the same problem; their samples and
// hashes into the report, checked against epx's.
#pragma once

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epx/bench/p2p.hpp"

namespace epx::tools {

/// The peers' arguments for the op's problem (their --iters/--warmup/--json come apart).
std::vector<std::string> pp_peer_args(const PPBenchOptions& o);
std::vector<std::string> engram_peer_args(const EngramBenchOptions& o);
/// Why no peer can run Engram with these options ("" = they can: the peers gather bf16 rows only).
std::string engram_peers_why_not(const EngramBenchOptions& o);

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

/// The rounds of one op (P2PCommon::rounds): each launches c.ranks ranks (on c.transport) of
/// which each writes `rank_record(t)` (its JSON text), pooled into records[rank], then runs
/// every peer (peer_json[i], pooled likewise; a peer that did not run in round 0 is not run
/// again). `no_peers`: why the peers cannot run this problem ("" when they can). Returns the
/// peers' runs (round 0's, or the round that failed).
std::vector<PeerRun> run_rounds(const P2PCommon& c, int ranks, const std::vector<std::string>& peer_args,
                                const std::function<std::string(Transport&)>& rank_record, const std::string& no_peers,
                                std::vector<nlohmann::json>& records, std::vector<nlohmann::json>& peer_json);

/// Pools the samples of another round into `into` (number arrays concatenated, everything
/// else — hashes, counts — kept from the first round).
void merge_samples(nlohmann::json& into, const nlohmann::json& more);

}  // namespace epx::tools
