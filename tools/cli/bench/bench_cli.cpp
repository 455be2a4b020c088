// `epx bench` on the command line: its options (CLI11) and the --help footer.
#include "bench/bench_cli.hpp"

#include <string>

#include "dataplane_cli.hpp"

namespace epx::tools {

// The --help footer, in three pieces joined once: what is timed
// and counted; how a run can be shaped and read; the baselines, collectives and routing.
constexpr const char kMeasures[] = R"(What the numbers count (the same way on every run):
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
  moved        the rows of the layout, what any copy producing the same result moves:
               compact, the payload; expanded, one row per slot (t, k) — dispatch: x's row
               for each slot of the sender's tokens (the expert-grouped output has a row per
               slot); combine: y's row of each slot, at the expert rank. epx's one-copy
               expanded dispatch puts exactly these; the copying one (no output pool) puts
               the payload, then copies each row into its slots (more bytes).
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
)";
constexpr const char kRunShapes[] = R"(  data plane   --topology --schedule --queues --queue-split --aggregate --protocol set
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
               "other" = latency minus their sum (output allocation, building the handle and
               layout, worker fork/join). A fresh dispatch reads each source's row metadata
               as its rows land, inside wait_data (explicit and tail protocols; flag: after it).
  rows first   a call right after one of the other kind (no zero-copy views, no ring) puts
               its rows before the header exchange, which then completes them: no notify
               phase, the exchange counts as wait_data (docs/engine.md). JSON data_first:
               every timed call of the op on every rank went that way; pulled: every combine
               read the experts' rows in place.
  counters     epx's per-worker counters are on for the timed loop (--no-counters: off).
               --counters-overhead N: N iterations with the other setting (fresh Buffer, same
               iteration structure incl. memcpy) before and N after the timed loop; ratio =
               median max-rank latency with counters on / off. --overhead-of waits: the
               always-on waits per peer (what --diagnose reads) on / off, a waits-off
               Buffer interleaved with the timed one (one iteration next to each, after
               and before in turn).
  diagnose     --diagnose: matrix[src][dst] = us per call that rank dst waited for rank
               src's header and rows in the timed loop (epx::Diagnose over the Buffer's
               PeerWaits, exchanged on an endpoint of its own); abnormal rows (slow
               sources) and columns (slow destinations) at 3x the mean of the OTHER rows /
               columns, points (slow links) at 5x the mean of the other links, outside
               abnormal rows and columns and above an absolute floor (docs/diagnose.md). JSON: "diagnose"; every rank's pid and node: "ranks".
               The loop in --diagnose-intervals K exchanges (5): each interval's verdict, and
               the persistent verdicts: what --diagnose-need N (3) of the K verdicts name
               (a fault stays, a rank the scheduler left behind once does not), per rank and
               link over both ops (a rank: a row or column of either op; a link: a point of
               both ops) and per op. JSON: "diagnose" keeps the whole loop's matrices and
               verdict; "persistent_ranks" (per rank), "persistent" (per op), "persist" and
               "intervals" are the intervals'.
  span, skew   per iteration, first rank's call start to last rank's call end, and the spread
               of the call starts (how well the barrier aligned the ranks).
  slowest rank the rank with the highest avg latency (per op; for the route histogram: of
               dispatch + combine). "dominant" = the phase with the most time.
)";
constexpr const char kInputs[] = R"(  baseline     --baseline mpi: epx_mpi_baseline (MPI_Alltoallv) on the same routing and
               iterations, each op timed after an MPI_Barrier, the same max-rank and
               percentile definitions; speed ratio = MPI time / epx time (> 1: epx faster).
               The outputs are compared by FNV-1a 64 hashes of every rank's recv_x and of
               combined_x with the identity expert (exit status 3 if they differ).
  collectives  --op all_gather | reduce_scatter | all_reduce: one BucketBuffer call of --bytes N
               (the whole tensor: all_gather's result, reduce_scatter's input) in --tensors T
               tensors of N/T bytes (rounded down to a multiple of P x 64), float32 inputs
               restored before every iteration (untimed), scale 1. latency = the call's wall
               time (all T tensors); algbw = N / avg max-rank latency; busbw = algbw x
               2(P-1)/P (all_reduce) or x (P-1)/P (all_gather, reduce_scatter), as nccl-tests.
               limit = each rank copying N bytes at once (memcpy, then streaming stores),
               interleaved with the calls in the same processes: per-rank GB/s = N / avg
               max-rank copy time; busbw / limit is the ratio the targets quote. phases:
               header exchange (every member's call header, and for small calls its data),
               data (sum / copy / puts, including the wait for the other members' done
               signals). results: every rank's outputs at 257 samples per tensor against
               docs/spec.md §8 (bit for bit); --baseline mpi (epx_mpi_collective: one MPI
               call per tensor) or gloo (torch.distributed, python -m epx.bench_collective):
               the same inputs and iterations, results compared bit for bit where the order
               is the same (all_gather), else within float32 rounding; speed ratio =
               baseline / epx avg max-rank latency.
  routing      uniform: each token picks K distinct experts uniformly; --skew s > 0: expert e
               is drawn with weight 1/(e+1)^s (no repeats), so low experts and ranks are hot.
               --groups G --topk-groups T (DeepSeek-V3): every expert gets a uniform score,
               a group's score is its two best summed, the token keeps its T best groups
               and its K best experts among them.
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

const char* bench_definitions() {
  static const std::string text = std::string(kMeasures) + kRunShapes + kInputs;
  return text.c_str();
}

namespace {

// The problem and how it is run: P, S, H, K, E, dtype, layout, outputs, workers, iterations.
void add_shape_options(CLI::App* sub, BenchOptions& o) {
  sub->add_option("--ranks", o.ranks, "P: ranks (processes with shm, threads with --transport threads)")->capture_default_str();
  sub->add_option("--tokens", o.tokens, "S: tokens per rank")->capture_default_str();
  sub->add_option("--hidden", o.hidden, "H: hidden size")->capture_default_str();
  sub->add_option("--topk", o.topk, "K: experts per token")->capture_default_str();
  sub->add_option("--experts", o.experts, "E: experts (a multiple of P)")->capture_default_str();
  sub->add_flag("--fp8", o.fp8, "dispatch FP8 E4M3 x with float32 scales (H % 128 == 0); combine stays bf16");
  sub->add_option("--layout", o.layout, "dispatch output layout: compact | expanded")->capture_default_str();
  sub->add_option("--alignment", o.alignment, "expert_alignment A of the expanded layout")->capture_default_str();
  sub->add_flag("--cached", o.cached, "time cached dispatches (the handle of one fresh dispatch made before warmup)");
  sub->add_flag("--weighted", o.weighted,
                "--layout expanded: a weighted combine (CombineArgs::weighted): each slot's row times its routing weight, "
                "every partial rounded to bf16 (docs/spec.md §4)");
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
}

// Where the routing comes from: a docs/spec.md §7 directory or the generator's knobs.
void add_routing_options(CLI::App* sub, BenchOptions& o) {
  sub->add_option("--routing", o.routing,
                  "read the routing from a docs/spec.md §7 input directory (meta.json, rank<r>/topk_idx.npy; optional "
                  "topk_weights.npy and x.npy or x_fp8.npy + x_scales.npy; random x when absent). P, E, H, K "
                  "and the tokens come from there")
      ->type_name("DIR");
  sub->add_option("--skew", o.skew, "generated routing: 0 = uniform top-k, s > 0 = Zipf-like, expert e drawn with weight 1/(e+1)^s")
      ->capture_default_str();
  sub->add_option("--groups", o.groups, "generated routing: group-limited top-k (DeepSeek-V3), E experts in this many groups (0 = no limit)")
      ->capture_default_str();
  sub->add_option("--topk-groups", o.topk_groups, "with --groups: each token picks its K experts among its best this-many groups")
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "seed of the generated routing and x")->capture_default_str();
}

// What is written and measured besides the table: JSON, trace, HTML, transport, counters, progress.
void add_report_options(CLI::App* sub, BenchOptions& o) {
  sub->add_option("--json", o.json, "write every number of the report, machine-readable, to FILE")->type_name("FILE");
  sub->add_option("--trace", o.trace, "write a Chrome trace (Perfetto, chrome://tracing): a track per rank and worker, a slice per phase and iteration")
      ->type_name("FILE");
  sub->add_option("--html", o.html,
                  "write the report as one self-contained HTML page to FILE (charts drawn by the page itself; no network)")
      ->type_name("FILE");
  sub->add_option("--transport", o.transport, "shm (ranks are processes) | threads | shmem (one rank per process started by oshrun/mpirun)")->capture_default_str();
  sub->add_option("--timeout-ms", o.timeout_ms, "a rank that waits longer than this fails")->capture_default_str();
  sub->add_flag("!--no-counters", o.counters, "time with epx's per-worker counters off (no phases, no put counts)");
  sub->add_flag("--diagnose", o.diagnose,
                "the timed loop's wait matrices per op (rank src x rank dst, epx::Diagnose) and their verdict: slow ranks and links");
  sub->add_option("--diagnose-intervals", o.diagnose_intervals,
                  "--diagnose: the timed loop in K exchanges, a verdict for each")
      ->capture_default_str();
  sub->add_option("--diagnose-need", o.diagnose_need,
                  "--diagnose: the persistent verdict names what the verdicts of N of the K intervals name")
      ->capture_default_str();
  sub->add_option("--counters-overhead", o.overhead_iters,
                  "counters off-vs-on ratio: N iterations with the other counters setting before and N after the timed loop (0 = skip)")
      ->capture_default_str();
  sub->add_option("--overhead-of", o.overhead_of,
                  "what --counters-overhead compares: counters (collect_stats) | waits (the always-on waits per peer, "
                  "BufferConfig::record_waits)")
      ->capture_default_str();
  sub->add_flag("!--no-progress", o.progress, "no progress line on stderr");
}

// The peers run beside epx and the EPLB replicas.
void add_peer_options(CLI::App* sub, BenchOptions& o) {
  sub->add_option("--baseline", o.baseline,
                  "mpi: also run epx_mpi_baseline (Megatron-style MPI all-to-all dispatcher) via mpirun on the same "
                  "routing (--transport shmem: inside this oshrun job, on the same ranks), check it produces the same "
                  "rows and print it side by side; with --op <collective>: mpi = epx_mpi_collective (MPI_Allgather / "
                  "MPI_Reduce_scatter_block / MPI_Allreduce), gloo = torch.distributed gloo, on the same inputs");
  sub->add_option("--mpi-baseline", o.mpi_baseline, "path of epx_mpi_baseline (default: <build>/baselines/, then PATH)")->type_name("PATH");
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
}

// --op all_gather | reduce_scatter | all_reduce.
void add_collective_options(CLI::App* sub, BenchOptions& o) {
  sub->add_option("--bytes", o.bytes, "--op all_gather | reduce_scatter | all_reduce: N bytes per call, the whole tensor "
                  "(all_gather's result, reduce_scatter's input; K/M/G suffixes)")->capture_default_str();
  sub->add_option("--tensors", o.tensors, "--op <collective>: T tensors of N / T bytes per call (1..64)")->capture_default_str();
  sub->add_option("--dtype", o.dtype, "--op all_gather: float32 | bf16 (the reductions are float32)")->capture_default_str();
  sub->add_option("--chunk-bytes", o.chunk_bytes, "--op <collective>: BucketOptions::chunk_bytes, a staging slot's payload (0 = auto)")
      ->capture_default_str();
  sub->add_option("--algorithm", o.algorithm,
                  "--op <collective>: auto | staged | mapped | pipelined | two-level | direct | one-shot (BucketOptions::algorithm: "
                  "the one to use where it can run; for A/B runs)")->capture_default_str();
}

}  // namespace

void add_bench_options(CLI::App* sub, BenchOptions& o) {
  add_shape_options(sub, o);
  add_routing_options(sub, o);
  add_report_options(sub, o);
  add_peer_options(sub, o);
  add_collective_options(sub, o);
  add_dataplane_options(sub, o.dataplane);
  sub->parse_complete_callback([sub, &o] {
    o.schedule_auto = sub->get_option("--schedule")->count() == 0 && sub->get_option("--combine-order")->count() == 0;
  });
  sub->add_option("--sweep", o.sweep,
                  "run every combination of the values and print one comparison table: KEY=V1,V2,... with KEY one of "
                  "topology, schedule, queues, queue-split, aggregate, protocol, tokens, workers, ring-rows (repeatable; the "
                  "first --sweep varies slowest)")
      ->type_name("KEY=V1,V2,...")
      ->allow_extra_args(false);
  sub->footer(bench_definitions());
}

}  // namespace epx::tools
