// `epx bench --op pp` and `--op engram`: PPBuffer and EngramBuffer timed in one run with the
// measurement plane (a memcpy of the same bytes on every rank, interleaved with the timed
// iterations) and their peers — the same problem through Open MPI (epx_mpi_p2p_baseline)
// and torch gloo (gloo_p2p_baseline.py), each checked to deliver the same bytes as epx.
// The data of both problems is baselines/p2p_data.hpp's.
//
// pp: links `pairs` (rank 2k sends to 2k+1: pipelines of two) or `ring` (r to r+1 mod P).
//   stream: per timed iteration, every link carries `messages` messages; the time per
//           message at the receiver (max over receivers) from a 0-byte "go" it sends its
//           sender after the barrier, with `inflight` slots per pair,
//           received into a tensor of the rank's own (recv) and, apart, as slot views
//           (recv_view + release) and into a tensor planned in the buffer's window (recv
//           into pp.tensor("recv"): the sender writes into it, one copy);
//   latency: ping-pong between 2k and 2k+1 after one untimed round trip, one-way = round
//            trip / 2 over 8 rounds, per pair; into the rank's own tensor, and apart into
//            the planned one;
//   copy:    `messages` memcpys of the size on every rank at once, per message.
// engram: per timed iteration one fetch of L layers of T tokens x E' uniform random rows of
//   the whole table and every hook; the slowest rank's time; rows/s = P * L * T * E' / that;
//   copy: a memcpy of the fetched bytes on every rank at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epx/bench/stats.hpp"
#include "epx/transport.hpp"

namespace epx::tools {

/// What both ops share.
struct P2PCommon {
  int ranks = 0;  ///< 0: the op's default (pp 8, engram 4)
  std::string transport = "shm";
  int warmup = 2;
  int iters = 10;
  std::int64_t timeout_ms = 60000;
  bool progress = true;
  std::vector<std::string> peers = {"mpi", "gloo"};  ///< which peers to run ("none": none)
  /// epx and the peers run this many times in turns (epx, mpi, gloo, epx, ...), their samples
  /// pooled: a machine whose load changes meanwhile weighs on all of them alike.
  int rounds = 1;
  std::string mpirun;  ///< else on PATH
  std::string python;  ///< the peers' python3 (else /usr/bin/python3)
};

struct PPBenchOptions {
  P2PCommon common;
  std::string pattern = "pairs";  ///< pairs | ring
  std::vector<std::uint64_t> sizes = {16384, 262144, 4194304, 58720256, 67108864};
  std::vector<int> inflight = {1, 2, 3};
  int messages = 4;  ///< per link per timed iteration
};

struct EngramBenchOptions {
  P2PCommon common;
  int layers = 2;
  std::int64_t rows = 131072;  ///< N_l per rank
  int hidden = 256;
  bool fp8 = false;
  std::int64_t tokens = 512;
  int entries = 24;  ///< E'
  std::uint64_t seed = 1;
};

/// One peer's run (mpi or gloo).
struct PeerRun {
  std::string name;     ///< "mpi" | "gloo"
  bool ran = false;
  std::string why_not;  ///< when !ran
  std::string command;
  bool verified = false;  ///< the same bytes as epx on every rank
  std::string verify_detail;
};

struct PPSizeResult {
  std::uint64_t bytes = 0;
  std::vector<int> inflight;            ///< per row of the two below
  std::vector<Summary> stream_us;       ///< epx recv, per inflight
  std::vector<Summary> view_us;         ///< epx recv_view, per inflight
  std::vector<Summary> planned_us;      ///< epx recv into the planned tensor, per inflight
  Summary copy_us;                      ///< the measurement plane: one memcpy per message
  std::vector<Summary> pair_latency_us; ///< epx, per pair (2k, 2k+1)
  std::vector<Summary> pair_latency_planned_us; ///< epx into the planned tensor, per pair
  std::vector<std::uint64_t> hashes;    ///< per rank: the last message received (0: none)
  bool correct = false;                 ///< every receiver's last message equals the data
  std::vector<Summary> peer_stream_us;  ///< per peer (PPBenchReport::peers order)
  std::vector<std::vector<Summary>> peer_pair_latency_us;
};

struct PPBenchReport {
  PPBenchOptions options;
  int ranks = 0;
  std::vector<PPSizeResult> sizes;
  std::vector<PeerRun> peers;
  double wall_s = 0;
};

struct EngramBenchReport {
  EngramBenchOptions options;
  int ranks = 0;
  Summary fetch_us;   ///< slowest rank, per fetch + every hook
  Summary copy_us;    ///< slowest rank, one memcpy of the fetched bytes
  std::int64_t rows_per_rank = 0;
  std::uint64_t bytes_per_rank = 0;  ///< fetched bytes (data + scales)
  std::string path;   ///< how remote rows moved
  double local_hit_rate = 0;  ///< rows owned by the fetching rank / rows
  std::vector<std::uint64_t> hashes;  ///< per rank, of every layer's output
  bool correct = false;  ///< every rank's outputs equal the table indexed directly
  std::vector<Summary> peer_us;  ///< per peer
  std::vector<PeerRun> peers;
  double wall_s = 0;
};

/// One rank's timed loops on `t` (collective: every rank of t calls it with the same
/// options): its samples, as the JSON text the aggregation reads.
std::string run_pp_rank(Transport& t, const PPBenchOptions& o);
std::string run_engram_rank(Transport& t, const EngramBenchOptions& o);
/// The report of every rank's record (by rank), without peers.
PPBenchReport aggregate_pp(const PPBenchOptions& o, const std::vector<std::string>& records);
EngramBenchReport aggregate_engram(const EngramBenchOptions& o, const std::vector<std::string>& records);
/// The options' checks for `ranks` ranks (kInvalidArgument).
void check_pp_options(const PPBenchOptions& o, int ranks);
void check_engram_options(const EngramBenchOptions& o, int ranks);

/// Runs the op (epx, the plane, then the peers) and aggregates. Throws kInvalidArgument for
/// bad options; peers that cannot run say why in their PeerRun.
PPBenchReport measure_pp(const PPBenchOptions& o);
EngramBenchReport measure_engram(const EngramBenchOptions& o);

/// --transport shmem: this process is one rank of an oshrun job (every rank calls it; the
/// MPI peer runs in the same job). Only rank 0 (root) has the report.
template <class Report>
struct P2PJobResult {
  bool root = false;
  std::string node_layout;  ///< which ranks share a machine
  Report report;
};
P2PJobResult<PPBenchReport> measure_pp_shmem(const PPBenchOptions& o);
P2PJobResult<EngramBenchReport> measure_engram_shmem(const EngramBenchOptions& o);

/// 0, or 3 when epx's bytes are wrong or a peer's differ from epx's (epx bench's exit status).
int p2p_status(const std::vector<PeerRun>& peers, bool epx_correct);

}  // namespace epx::tools
