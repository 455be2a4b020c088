#include "epx/bench/options.hpp"

#include <algorithm>
#include <string>

#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/routing.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/spi/resources.hpp"
#include "epx/io/replay.hpp"

namespace epx::tools {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

}  // namespace

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

namespace {

// --ring-rows and --zero-copy against each other and the data plane.
void validate_ring_and_views(const BenchOptions& o) {
  if (o.ring_rows < 0) bad("--ring-rows must be >= 0, got " + std::to_string(o.ring_rows));
  if (o.ring_rows > 0 && o.zero_copy) bad("--ring-rows cannot be combined with --zero-copy (a ring has no slot for every row)");
  if (o.ring_rows > 0 && o.dataplane.protocol == Protocol::kFlag) bad("--ring-rows needs --protocol explicit or tail");
  if (o.ring_rows > 0 && o.dataplane.schedule.kind == ScheduleKind::kHierarchical)
    bad("--ring-rows does not combine with --schedule hierarchical");
  if (o.zero_copy && o.dataplane.protocol == Protocol::kFlag)
    bad("--zero-copy cannot be combined with --protocol flag (flagged blocks are unpacked on arrival, so recv_x cannot be "
        "a view of the window)");
}

// The --eplb* options: each needs --eplb, and their values.
void validate_eplb_options(const BenchOptions& o) {
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

}  // namespace

void validate_options(const BenchOptions& o) {
  // shmem: one rank per process, started by oshrun/mpirun (run_shmem.cpp): P is the launcher's.
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
  if (o.weighted && o.layout != "expanded") bad("--weighted needs --layout expanded (in the compact layout the expert applies its weights)");
  if (o.weighted && o.baseline == "mpi") bad("--weighted: the MPI baseline's combine is unweighted, so the results could not be compared");
  if (o.output_pool < -1) bad("--output-pool must be >= 0 or -1 (auto)");
  if (o.alignment < 1) bad("--alignment must be >= 1, got " + std::to_string(o.alignment));
  check_workers(o.workers, o.routing.empty() ? o.ranks : 1, "epx bench");
  if (o.iters < 1) bad("--iters must be >= 1, got " + std::to_string(o.iters));
  if (o.warmup < 0) bad("--warmup must be >= 0, got " + std::to_string(o.warmup));
  if (o.diagnose && (o.diagnose_intervals < 1 || o.diagnose_intervals > o.iters))
    bad("--diagnose-intervals must be in [1, --iters = " + std::to_string(o.iters) + "], got " +
        std::to_string(o.diagnose_intervals));
  if (o.diagnose && (o.diagnose_need < 1 || o.diagnose_need > o.diagnose_intervals))
    bad("--diagnose-need must be in [1, --diagnose-intervals = " + std::to_string(o.diagnose_intervals) + "], got " +
        std::to_string(o.diagnose_need));
  if (o.overhead_iters < 0) bad("--counters-overhead must be >= 0, got " + std::to_string(o.overhead_iters));
  if (o.overhead_of != "counters" && o.overhead_of != "waits")
    bad("--overhead-of must be 'counters' or 'waits', got '" + o.overhead_of + "'");
  if (o.overhead_of == "waits" && o.cached) bad("--overhead-of waits: not with --cached (two Buffers would need two handles)");
  if (o.skew < 0) bad("--skew must be >= 0 (0 = uniform), got " + std::to_string(o.skew));
  check_group_limit(o.groups, o.topk_groups, o.experts, o.topk, o.skew);
  checked_timeout(o.timeout_ms);
  if (!o.baseline.empty() && o.baseline != "mpi") bad("--baseline must be 'mpi', got '" + o.baseline + "'");
  // With --routing, P is known once meta.json is read: run_bench checks the rest then.
  check_dataplane(o.dataplane, o.routing.empty() ? o.ranks : 0);
  validate_ring_and_views(o);
  if (!o.sweep.empty() && !o.trace.empty()) bad("--trace records one run; it cannot be combined with --sweep");
  if (!o.sweep.empty() && !o.html.empty()) bad("--html draws one run; it cannot be combined with --sweep (its table is the report)");
  if (!o.sweep.empty() && !o.baseline.empty())
    bad("--baseline does not depend on the data-plane options; run it without --sweep");
  validate_eplb_options(o);
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

}  // namespace epx::tools
