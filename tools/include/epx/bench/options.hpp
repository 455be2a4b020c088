// `epx bench` options: what to run, how often, and where the results go.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epx/dataplane.hpp"

namespace epx::tools {

struct BenchOptions {
  /// --op: what to time (tools/cli/bench/bench_ops.hpp lists them); "dispatch" = dispatch + combine.
  std::string op = "dispatch";
  // --op all_gather | reduce_scatter | all_reduce (epx/bench/collective.hpp).
  std::string bytes = "64M";   ///< N: the whole tensor of a call (K/M/G suffixes)
  int tensors = 1;             ///< T tensors of N / T bytes per call
  std::string dtype = "float32";  ///< float32 | bf16 (all_gather only: it moves bytes)
  std::string chunk_bytes = "0";  ///< BucketOptions::chunk_bytes (0 = auto), for A/B runs
  std::string algorithm = "auto";  ///< BucketOptions::algorithm: auto | staged | mapped | pipelined | two-level | direct
  // Shape (ignored with --routing, which brings its own meta.json).
  int ranks = 8;
  std::int64_t tokens = 512;  ///< tokens per rank (S)
  int hidden = 7168;
  int topk = 8;
  int experts = 256;
  bool fp8 = false;
  // Routing: generated (uniform top-k when skew == 0, else Zipf-like), or read from a dir.
  double skew = 0.0;
  /// Group-limited top-k (DeepSeek-V3; uniform scores, seeded): the E experts in `groups`
  /// groups of E/groups, each token keeps its `topk_groups` best groups and picks its K
  /// experts among theirs (group_limited_topk in epx/bench/routing.hpp). 0 = no group limit.
  int groups = 0;
  int topk_groups = 0;
  std::uint64_t seed = 1;
  std::string routing;  ///< docs/spec.md §7 input directory; empty = generate
  // Calls.
  std::string layout = "compact";
  int alignment = 1;
  bool cached = false;  ///< time cached dispatches (with the handle of a first fresh one)
  bool zero_copy = false;  ///< compact: recv_x is a view of the window (DispatchArgs::recv_in_window)
  bool weighted = false;   ///< expanded: weighted combine (CombineArgs::weighted: each slot's row times its weight)
  std::int64_t output_pool = -1;  ///< BufferConfig::output_pool_bytes (-1 auto: one copy; 0: copies, the old default)
  int workers = 0;      ///< 0 = the engine's auto choice
  std::int64_t ring_rows = 0;  ///< BufferConfig::ring_rows: bounded receive area (0 = unbounded)
  int warmup = 3;
  int iters = 20;
  std::string transport = "shm";
  std::int64_t timeout_ms = 60000;
  // Counters.
  bool counters = true;     ///< BufferConfig::collect_stats for the timed iterations
  /// --diagnose: an epx::Diagnose over the timed Buffer (its own endpoint); its exchange
  /// after the warmup and after the timed loop gives the timed loop's wait matrices and verdicts.
  bool diagnose = false;
  /// --diagnose-intervals K: the timed loop in K intervals of about iters / K iterations, an
  /// exchange after each; --diagnose-need N: the persistent verdict names what N of the K
  /// intervals' verdicts name (docs/diagnose.md, "Over intervals"). 1 <= N <= K <= iters.
  int diagnose_intervals = 5;
  int diagnose_need = 3;
  int overhead_iters = 3;   ///< iterations per comparison block with the other counters setting (0 = skip)
  /// --overhead-of: what --counters-overhead compares: "counters" (collect_stats: blocks of N
  /// iterations with the other setting before and after the timed loop) or "waits"
  /// (BufferConfig::record_waits: a second Buffer with it off runs next to each timed
  /// iteration, interleaved; not with --cached).
  std::string overhead_of = "counters";
  /// The timed loop runs with the compared setting on.
  bool overhead_main_on() const noexcept { return overhead_of == "waits" || counters; }
  // Outputs.
  std::string json;   ///< --json FILE
  std::string trace;  ///< --trace FILE (Chrome trace events)
  std::string html;   ///< --html FILE (the report as one self-contained page)
  bool progress = true;
  // Baseline.
  std::string baseline;      ///< "" | "mpi" | "gloo" (gloo: the collectives only)
  std::string mpi_baseline;  ///< path of epx_mpi_baseline (else located next to epx, or on PATH)
  std::string mpirun;        ///< path of mpirun (else on PATH)
  // EPLB: dispatch through redundant experts planned from this batch's own expert load.
  bool eplb = false;
  int eplb_replicas = 0;        ///< R physical experts; 0 = default_eplb_replicas(E, P)
  std::string eplb_choice;      ///< "" (= spread) | spread | rank | server
  int eplb_servers_of = 0;      ///< ranks per server for --eplb-choice server; 0 = default 1
  /// --eplb-choice dynamic: bytes of one expert's weights, for timing prefetch_weights and
  /// reduce_grads of the planned replicas (K/M/G suffixes); "0" skips the timing.
  std::string eplb_expert_bytes = "1M";
  // Data plane: BufferConfig::dataplane of every rank (--topology, --schedule, ...).
  DataPlaneOptions dataplane;
  /// Neither --schedule nor --combine-order was given: a --transport shmem job over several
  /// nodes (equal, consecutive ranks per node) then runs the hierarchical schedule with the
  /// node-first combine, each token crossing once per node pair (default_schedule_across_nodes).
  bool schedule_auto = false;
  // --sweep KEY=V1,V2,...: one run per combination of the values (epx/bench/sweep.hpp).
  std::vector<std::string> sweep;

  // --op pp / --op engram (epx/bench/p2p.hpp); --ranks, --tokens, --seed, --warmup, --iters,
  // --transport, --timeout-ms, --mpirun and --no-progress apply to them too.
  std::string pp_pattern = "pairs";          ///< --pp-pattern pairs | ring
  std::vector<std::uint64_t> pp_sizes;       ///< --pp-sizes (empty: 16 KiB .. 64 MiB)
  std::vector<int> pp_inflight;              ///< --pp-inflight (empty: 1, 2, 3)
  int pp_messages = 4;                       ///< --pp-messages per link per iteration
  int engram_layers = 2;                     ///< --engram-layers
  std::int64_t engram_rows = 131072;         ///< --engram-rows N_l per rank
  int engram_hidden = 256;                   ///< --engram-hidden
  int engram_entries = 24;                   ///< --engram-entries E' per token
  bool engram_fp8 = false;                   ///< --engram-fp8
  std::vector<std::string> peers = {"mpi", "gloo"};  ///< --peers of pp / engram (none: none)
  std::string peer_python;                   ///< --peer-python (default /usr/bin/python3)
  int peer_rounds = 1;                       ///< --peer-rounds: epx and the peers in turns, samples pooled

  bool expanded() const noexcept { return layout == "expanded"; }
  /// The pool the run's Buffers get: --output-pool, except that auto (-1) is no pool (0) for
  /// --zero-copy, whose outputs never use it (views), and — the expanded layout — room for
  /// the largest rank's expanded output of the run's routing (bench_buffer_config sizes it).
  std::int64_t output_pool_bytes() const noexcept { return output_pool == -1 && zero_copy ? 0 : output_pool; }
};

/// Throws epx::Error(kInvalidArgument) naming the option for values out of range (the
/// shape is checked again against the routing once it is known, see check_shape; so is
/// the data plane, see check_dataplane).
void validate_options(const BenchOptions& o);

/// The most worker threads per rank the tools accept (--workers); also bounded by what the
/// machine can still start (check_workers).
inline constexpr int kMaxWorkers = 256;

/// --workers W on P ranks: 0 <= W <= kMaxWorkers and P x (W + 1) threads within what this
/// user may still start (RLIMIT_NPROC, kernel.threads-max, the cgroup's pids.max). Throws
/// kInvalidArgument naming `who` before any rank starts (a thread that cannot be created
/// would otherwise abort a rank).
void check_workers(int workers, int ranks, const std::string& who);

/// P against launch()'s bound for `transport` (epx::max_ranks); throws kInvalidArgument.
void check_ranks(int ranks, const std::string& transport, const std::string& who);

/// Checks E % P, fp8 and H % 128, K <= E; `where` names the source ("--experts", meta.json).
void check_shape(int ranks, int experts, int hidden, int topk, bool fp8, const std::string& where);

/// The default --eplb-replicas: E + ceil(E/4) rounded up to a multiple of P (>= E + 1, so
/// the hottest experts get about a quarter more slots in total; 256 experts on 8 ranks -> 320).
int default_eplb_replicas(int experts, int ranks) noexcept;

/// --eplb-choice with the default applied: "spread", "rank" or "server".
std::string eplb_choice_name(const BenchOptions& o);

/// Checks --eplb-replicas (or its default) and --eplb-servers-of against P and E.
void check_eplb_shape(const BenchOptions& o, int ranks, int experts);

}  // namespace epx::tools
