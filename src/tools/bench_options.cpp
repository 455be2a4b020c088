#include "bench_options.hpp"

#include <algorithm>
#include <string>

#include "bench_dataplane.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/spi/resources.hpp"
#include "replay.hpp"

namespace epx::tools {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

}  // namespace

const char* bench_definitions() {
  return R"(What the numbers count (the same way on every run):
  latency      wall time of one dispatch() or combine() call on one rank (CLOCK_MONOTONIC),
               after a barrier that aligns the ranks; warmup iterations are not counted.
  max-rank     per iteration, the largest latency over the ranks (what a training step waits
               for); avg/p50/p95/max are taken over the timed iterations. p50/p95 are
               nearest-rank percentiles: the smallest sample with at least 50% / 95% of the
               samples <= it.
  payload      counted from the routing itself, not from epx's counters. Dispatch: a token
               counts once per unique destination rank of its valid experts, times one x row
               (bf16: H*2 bytes; fp8: H + H/128*4 bytes incl. its scales), at the sending
               rank; "local" is the part whose destination is the sender itself, "remote" the
               rest. Combine: the same (token, destination) rows flowing back, bf16 (H*2
               bytes), counted at the sender of the combine (the expert rank) = the compact
               rows it received in dispatch. Metadata (indices, weights) is not payload.
  moved        payload, plus for an expanded dispatch the receivers' local expansion copies
               (one x row per slot routed to the rank's experts).
  algbw        moved bytes / time, GB/s = 1e9 B/s. Per rank: its bytes / its avg latency;
               total: the sum of all ranks' bytes / avg max-rank latency.
  memcpy       measured in the same run, interleaved with the epx iterations, in the same P
               processes at once: each rank memcpy()s exactly its moved bytes for the op,
               row by row, between pre-faulted private buffers. memcpy GB/s = total moved /
               avg max-rank memcpy time; ratio = epx algbw / memcpy GB/s for the same bytes.
               Top-level memcpy_gbps = (dispatch + combine bytes) / (both max-rank times).
  limit        the faster of that memcpy and a streaming-store copy (epx::stream_copy,
               non-temporal AVX2 stores) of the same bytes, row by row, by the same
               processes right after it; the report names which one it was. ratio vs
               limit = epx algbw / limit GB/s.
  output       where each timed dispatch's recv_x came from (CallStats::output): one copy
               (a block of the output pool the senders put into), copy (out of the receive
               area, with the reason: output pool exhausted / off, expanded layout, ...) or
               view (--zero-copy). Also the window bytes and peak RSS per rank.
  puts         epx's own counters (per call, summed over workers): remote puts + puts into
               the rank's own window; bytes/put = their bytes / their number. Dispatch puts
               also carry row metadata, so epx's byte count exceeds the payload by that.
  queues       per queue q < --queues, per call: puts and bytes summed over the ranks and
               workers (every put counts on exactly one queue); wait = the senders' quiet()
               wait for that queue's puts to complete, summed over a rank's workers, avg
               over ranks (~0 on shm/threads, where a put completes when it returns).
  data plane   --topology --schedule --queues --queue-split --aggregate --protocol set
               BufferConfig::dataplane on every rank (epx/dataplane.hpp). All choices give
               the same results; they differ in put order, put count and synchronisation.
  sweep        --sweep KEY=V1,V2,... (repeatable): one full bench (same warmup, iterations,
               memcpy reference and payload check) per combination of the values, the last
               --sweep varying fastest; combinations whose options do not fit together are
               skipped with the reason. Table columns: # = combination; swept keys topo,
               sched, q (queues), split, aggr, proto, S (tokens), W (workers), ring (ring-rows); d_ = dispatch,
               c_ = combine: us = avg max-rank latency, GB/s = algbw total, xmc = ratio vs
               memcpy, puts = puts per call (all ranks), B/put = bytes per put; q_bytes% =
               each queue's share of the dispatch + combine bytes; wait_us = the queues'
               completion wait (quiet) per dispatch + combine, avg over ranks; chk = ok if the payload
               check passed, WARN otherwise (the warnings are listed under the table).
  phases       per rank, avg over iterations of the max over workers of the time a worker
               spent in the phase (plan, notify, put_issue, wait_data, barrier, epilogue);
               "other" = latency minus their sum (output allocation, receiving row metadata,
               building the handle and layout, worker fork/join).
  rows first   a call right after one of the other kind (no zero-copy views, no ring) puts
               its rows before the header exchange, which then completes them: no notify
               phase, the exchange counts as wait_data (docs/engine.md). JSON data_first:
               every timed call of the op on every rank went that way; pulled: every combine
               read the experts' rows in place.
  counters     epx's per-worker counters are on for the timed loop (--no-counters: off).
               --counters-overhead N: N iterations with the other setting (fresh Buffer, same
               iteration structure incl. memcpy) before and N after the timed loop; ratio =
               median max-rank latency with counters on / off.
  span, skew   per iteration, first rank's call start to last rank's call end, and the spread
               of the call starts (how well the barrier aligned the ranks).
  slowest rank the rank with the highest avg latency (per op; for the route histogram: of
               dispatch + combine). "dominant" = the phase with the most time.
  baseline     --baseline mpi: epx_mpi_baseline (MPI_Alltoallv) on the same routing and
               iterations, each op timed after an MPI_Barrier, the same max-rank and
               percentile definitions; speed ratio = MPI time / epx time (> 1: epx faster).
               The outputs are compared by FNV-1a 64 hashes of every rank's recv_x and of
               combined_x with the identity expert (exit status 3 if they differ).
  routing      uniform: each token picks K distinct experts uniformly; --skew s > 0: expert e
               is drawn with weight 1/(e+1)^s (no repeats), so low experts and ranks are hot.
  eplb         --eplb: the load of each logical expert = its (t, k) slots over all ranks of
               this very routing (an oracle: a deployment plans from past batches) is given
               to rebalance_experts(load, 1 layer, E, R, 1 group, 1 node, P GPUs); every
               rank's topk_idx is mapped to physical experts with map_to_replicas (choice
               spread: token index mod replicas; rank / server: a replica on the token's own
               rank / server if any) and the timed dispatch/combine, the payload, the route
               histogram and "experts" are those of the PHYSICAL routing (R experts). The
               EPLB section compares, per rank, the compact rows and the slots received
               without replicas (logical routing, not timed) and with them (physical,
               timed): imbalance = max / avg over the ranks; most loaded rank = the one
               with the most rows; planned load = the planner's per-GPU load (slots,
               eplb_gpu_load*). Every physical slot is checked to map back (phy2log) to the
               logical expert it came from.)";
}

int default_eplb_replicas(int experts, int ranks) noexcept {
  if (experts < 1 || ranks < 1) return experts;
  const int target = experts + (experts + 3) / 4;
  return (target + ranks - 1) / ranks * ranks;
}

std::string eplb_choice_name(const BenchOptions& o) { return o.eplb_choice.empty() ? "spread" : o.eplb_choice; }

void check_workers(int workers, int ranks, const std::string& who) {
  if (workers < 0 || workers > kMaxWorkers)
    bad(who + ": --workers must be in [0, " + std::to_string(kMaxWorkers) + "] (0 = auto), got " + std::to_string(workers));
  const std::int64_t want = static_cast<std::int64_t>(ranks) * (std::max(workers, 1) + 1);
  const std::int64_t can = detail::threads_available();
  if (want > can)
    bad(who + ": --workers " + std::to_string(workers) + " on " + std::to_string(ranks) + " ranks needs about " +
        std::to_string(want) + " threads, but only " + std::to_string(can) +
        " more can be started here (RLIMIT_NPROC, kernel.threads-max, pids.max)");
}

void check_ranks(int ranks, const std::string& transport, const std::string& who) {
  const int most = max_ranks(parse_transport_kind(transport));
  if (ranks < 1 || ranks > most)
    bad(who + ": the number of ranks P must be in [1, " + std::to_string(most) + "] on transport '" + transport +
        "' (at most " + std::to_string(kMaxRanks) + ", and " + std::to_string(kMaxRanksPerCore) +
        " per online core with processes), got " + std::to_string(ranks));
}

void check_shape(int ranks, int experts, int hidden, int topk, bool fp8, const std::string& where) {
  if (ranks < 1) bad(where + ": the number of ranks must be >= 1, got " + std::to_string(ranks));
  if (experts < 1 || experts % ranks != 0)
    bad(where + ": the number of experts E = " + std::to_string(experts) + " must be a positive multiple of the ranks P = " +
        std::to_string(ranks));
  if (hidden < 1) bad(where + ": hidden must be >= 1, got " + std::to_string(hidden));
  if (topk < 1 || topk > experts)
    bad(where + ": topk K = " + std::to_string(topk) + " must be in [1, E = " + std::to_string(experts) + "]");
  if (fp8 && hidden % 128 != 0) bad(where + ": --fp8 needs hidden % 128 == 0, got H = " + std::to_string(hidden));
}

void validate_options(const BenchOptions& o) {
  // shmem: one rank per process, started by oshrun/mpirun (bench_run_shmem.cpp): P is the launcher's.
  const bool forked = o.transport != "shmem";
  if (forked) parse_transport_kind(o.transport);
  if (o.routing.empty()) {
    check_shape(o.ranks, o.experts, o.hidden, o.topk, o.fp8, "epx bench");
    if (o.tokens < 0) bad("--tokens must be >= 0, got " + std::to_string(o.tokens));
    // Before the routing is generated: the launcher holds every rank's inputs, each rank its
    // window, outputs and a copy of its inputs.
    if (forked) {
      check_ranks(o.ranks, o.transport, "epx bench");
      const RankFootprint f = rank_footprint(o.ranks, o.hidden, o.topk, o.tokens, o.tokens, 0, o.output_pool_bytes());
      check_footprint("epx bench: ", {f.window, detail::add_sat(f.total, f.inputs), f.inputs}, o.ranks,
                      parse_transport_kind(o.transport) == TransportKind::kShm);
    }
  }
  if (o.layout != "compact" && o.layout != "expanded") bad("--layout must be 'compact' or 'expanded', got '" + o.layout + "'");
  if (o.zero_copy && o.layout != "compact") bad("--zero-copy needs --layout compact");
  if (o.output_pool < -1) bad("--output-pool must be >= 0 or -1 (auto)");
  if (o.alignment < 1) bad("--alignment must be >= 1, got " + std::to_string(o.alignment));
  check_workers(o.workers, o.routing.empty() ? o.ranks : 1, "epx bench");
  if (o.iters < 1) bad("--iters must be >= 1, got " + std::to_string(o.iters));
  if (o.warmup < 0) bad("--warmup must be >= 0, got " + std::to_string(o.warmup));
  if (o.overhead_iters < 0) bad("--counters-overhead must be >= 0, got " + std::to_string(o.overhead_iters));
  if (o.skew < 0) bad("--skew must be >= 0 (0 = uniform), got " + std::to_string(o.skew));
  checked_timeout(o.timeout_ms);
  if (!o.baseline.empty() && o.baseline != "mpi") bad("--baseline must be 'mpi', got '" + o.baseline + "'");
  // With --routing, P is known once meta.json is read: run_bench checks the rest then.
  check_dataplane(o.dataplane, o.routing.empty() ? o.ranks : 0);
  if (o.ring_rows < 0) bad("--ring-rows must be >= 0, got " + std::to_string(o.ring_rows));
  if (o.ring_rows > 0 && o.zero_copy) bad("--ring-rows cannot be combined with --zero-copy (a ring has no slot for every row)");
  if (o.ring_rows > 0 && o.dataplane.protocol == Protocol::kFlag) bad("--ring-rows needs --protocol explicit or tail");
  if (o.ring_rows > 0 && o.dataplane.schedule.kind == ScheduleKind::kHierarchical)
    bad("--ring-rows does not combine with --schedule hierarchical");
  if (o.zero_copy && o.dataplane.protocol == Protocol::kFlag)
    bad("--zero-copy cannot be combined with --protocol flag (flagged blocks are unpacked on arrival, so recv_x cannot be "
        "a view of the window)");
  if (!o.sweep.empty() && !o.trace.empty()) bad("--trace records one run; it cannot be combined with --sweep");
  if (!o.sweep.empty() && !o.baseline.empty())
    bad("--baseline does not depend on the data-plane options; run it without --sweep");
  if (!o.eplb) {
    if (o.eplb_replicas != 0) bad("--eplb-replicas needs --eplb");
    if (!o.eplb_choice.empty()) bad("--eplb-choice needs --eplb");
    if (o.eplb_servers_of != 0) bad("--eplb-servers-of needs --eplb");
    return;
  }
  if (o.eplb_expert_bytes != "1M" && eplb_choice_name(o) != "dynamic")
    bad("--eplb-expert-bytes only applies to --eplb-choice dynamic");
  if (parse_byte_size(o.eplb_expert_bytes) % 4 != 0)
    bad("--eplb-expert-bytes must be a multiple of 4 (the gradients are float32), got " + o.eplb_expert_bytes);
  if (o.eplb_replicas < 0) bad("--eplb-replicas must be >= 0 (0 = default), got " + std::to_string(o.eplb_replicas));
  const std::string choice = eplb_choice_name(o);
  if (choice != "spread" && choice != "rank" && choice != "server" && choice != "dynamic")
    bad("--eplb-choice must be 'spread', 'rank', 'server' or 'dynamic', got '" + o.eplb_choice + "'");
  if (o.eplb_servers_of < 0) bad("--eplb-servers-of must be >= 1, got " + std::to_string(o.eplb_servers_of));
  if (o.eplb_servers_of != 0 && choice != "server")
    bad("--eplb-servers-of only applies to --eplb-choice server (got --eplb-choice " + choice + ")");
  // The replicas against the shape: here for a generated routing, again in apply_eplb for --routing.
  if (o.routing.empty()) check_eplb_shape(o, o.ranks, o.experts);
}

void check_eplb_shape(const BenchOptions& o, int ranks, int experts) {
  const int R = o.eplb_replicas > 0 ? o.eplb_replicas : default_eplb_replicas(experts, ranks);
  if (R < experts || R % ranks != 0)
    bad("--eplb-replicas R = " + std::to_string(R) + " must be >= the logical experts E = " + std::to_string(experts) +
        " and a multiple of the ranks P = " + std::to_string(ranks));
  const int n = o.eplb_servers_of > 0 ? o.eplb_servers_of : 1;
  if (ranks % n != 0)
    bad("--eplb-servers-of " + std::to_string(n) + " must divide the ranks P = " + std::to_string(ranks));
}

void add_bench_options(CLI::App* sub, BenchOptions& o) {
  sub->add_option("--ranks", o.ranks, "P: ranks (processes with shm, threads with --transport threads)")->capture_default_str();
  sub->add_option("--tokens", o.tokens, "S: tokens per rank")->capture_default_str();
  sub->add_option("--hidden", o.hidden, "H: hidden size")->capture_default_str();
  sub->add_option("--topk", o.topk, "K: experts per token")->capture_default_str();
  sub->add_option("--experts", o.experts, "E: experts (a multiple of P)")->capture_default_str();
  sub->add_flag("--fp8", o.fp8, "dispatch FP8 E4M3 x with float32 scales (H % 128 == 0); combine stays bf16");
  sub->add_option("--layout", o.layout, "dispatch output layout: compact | expanded")->capture_default_str();
  sub->add_option("--alignment", o.alignment, "expert_alignment A of the expanded layout")->capture_default_str();
  sub->add_flag("--cached", o.cached, "time cached dispatches (the handle of one fresh dispatch made before warmup)");
  sub->add_flag("--zero-copy", o.zero_copy,
                "compact layout: recv_x is a view of the receive window where the senders put the rows "
                "(DispatchArgs::recv_in_window), so dispatch copies each row once; the identity expert's y is that "
                "recv_x in place, so combine runs in pull mode on shm/threads (sources read the rows where they lie)");
  sub->add_option("--output-pool", o.output_pool,
                  "bytes of each rank's window for one-copy dispatch outputs (BufferConfig::output_pool_bytes; "
                  "-1 = auto: one output of the largest size (none with --layout expanded or --zero-copy, which do not use it); 0 = no pool: recv_x is a copy out of the receive area, "
                  "the behaviour before one copy became the default)")
      ->capture_default_str();
  sub->add_option("--ring-rows", o.ring_rows,
                  "bounded receive area: a ring of N rows per source with credits (0 = a slot for every row; "
                  "BufferConfig::ring_rows)")
      ->capture_default_str();
  sub->add_option("--workers", o.workers, "worker threads per rank (0 = auto: cores / ranks)")->capture_default_str();
  sub->add_option("--warmup", o.warmup, "untimed iterations first")->capture_default_str();
  sub->add_option("--iters", o.iters, "timed iterations (one dispatch + one combine each)")->capture_default_str();
  sub->add_option("--routing", o.routing,
                  "read the routing from a SPEC 7 input directory (meta.json, rank<r>/topk_idx.npy; optional "
                  "topk_weights.npy and x.npy or x_fp8.npy + x_scales.npy; random x when absent). P, E, H, K "
                  "and the tokens come from there")
      ->type_name("DIR");
  sub->add_option("--skew", o.skew, "generated routing: 0 = uniform top-k, s > 0 = Zipf-like, expert e drawn with weight 1/(e+1)^s")
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "seed of the generated routing and x")->capture_default_str();
  sub->add_option("--json", o.json, "write every number of the report, machine-readable, to FILE")->type_name("FILE");
  sub->add_option("--trace", o.trace, "write a Chrome trace (Perfetto, chrome://tracing): a track per rank and worker, a slice per phase and iteration")
      ->type_name("FILE");
  sub->add_option("--transport", o.transport, "shm (ranks are processes) | threads | shmem (one rank per process started by oshrun/mpirun)")->capture_default_str();
  sub->add_option("--timeout-ms", o.timeout_ms, "a rank that waits longer than this fails")->capture_default_str();
  sub->add_flag("!--no-counters", o.counters, "time with epx's per-worker counters off (no phases, no put counts)");
  sub->add_option("--counters-overhead", o.overhead_iters,
                  "counters off-vs-on ratio: N iterations with the other counters setting before and N after the timed loop (0 = skip)")
      ->capture_default_str();
  sub->add_flag("!--no-progress", o.progress, "no progress line on stderr");
  sub->add_option("--baseline", o.baseline,
                  "mpi: also run epx_mpi_baseline (Megatron-style MPI all-to-all dispatcher) via mpirun on the same "
                  "routing (--transport shmem: inside this oshrun job, on the same ranks), check it produces the same "
                  "rows and print it side by side");
  sub->add_option("--mpi-baseline", o.mpi_baseline, "path of epx_mpi_baseline (default: <build>/bench/, then PATH)")->type_name("PATH");
  sub->add_option("--mpirun", o.mpirun, "path of mpirun (default: PATH)")->type_name("PATH");
  sub->add_flag("--eplb", o.eplb,
                "dispatch through EPLB replicas planned from this routing's own expert load (oracle) and report the "
                "per-rank received rows and their max/avg imbalance without and with replicas");
  sub->add_option("--eplb-replicas", o.eplb_replicas,
                  "R physical experts, >= E and a multiple of P (0 = default: E + ceil(E/4) rounded up to a multiple of P)")
      ->capture_default_str();
  sub->add_option("--eplb-choice", o.eplb_choice,
                  "which replica a (token, slot) uses: spread (token index mod replicas, the default) | rank (one on the "
                  "token's own rank if any) | server (one on the token's own server if any) | dynamic (replicas chosen from "
                  "this batch's counts by plan_dynamic_replicas, (R - E) / P slots per rank, exact shares)")
      ->type_name("CHOICE");
  sub->add_option("--eplb-expert-bytes", o.eplb_expert_bytes,
                  "--eplb-choice dynamic: bytes of one expert's weights (K/M/G); the bench times prefetch_weights of the "
                  "planned replicas and reduce_grads of their float32 gradients of that size (0 = not timed)")
      ->capture_default_str();
  sub->add_option("--eplb-servers-of", o.eplb_servers_of, "ranks per server for --eplb-choice server (divides P; default 1)")
      ->type_name("N");
  add_dataplane_options(sub, o.dataplane);
  sub->add_option("--sweep", o.sweep,
                  "run every combination of the values and print one comparison table: KEY=V1,V2,... with KEY one of "
                  "topology, schedule, queues, queue-split, aggregate, protocol, tokens, workers, ring-rows (repeatable; the "
                  "first --sweep varies slowest)")
      ->type_name("KEY=V1,V2,...")
      ->allow_extra_args(false);
  sub->footer(bench_definitions());
}

}  // namespace epx::tools
