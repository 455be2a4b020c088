// `epx sim` runs: the real epx::Buffer on sim-transport ranks (one dispatch, one combine;
// with `steady` or `cached` a second pair after them, which is what is timed), then the
// recorded trace timed on the hardware model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epx/bench/routing.hpp"
#include "epx/sim/timing.hpp"
#include "epx/sim/hardware.hpp"
#include "epx/sim/trace.hpp"

namespace epx::tools {

struct SimOptions {
  std::string hardware = "ascend950-supernode";
  /// Rank positions for the engine (hierarchical servers, grouped blocks) and the model
  /// (frame crossings, scale-out). auto: sim::default_topology_spec(P, hardware) —
  /// builtin:supernode128 at 128 ranks on 2 frames x 64, else builtin:servers:8 (or flat).
  /// A table for another P is an error.
  std::string topology = "auto";
  std::vector<int> ep = {8, 16, 32, 64, 128};
  // The calibration shape (Ascend 950DT notes).
  std::int64_t tokens = 16384;
  int hidden = 7168;
  int topk = 6;
  int experts = 256;
  bool fp8 = true;
  int alignment = 128;
  std::string layout = "expanded";
  std::uint64_t seed = 1;
  /// Group-limited top-k routing (BenchOptions::groups / topk_groups; 0 = uniform top-k).
  int groups = 0, topk_groups = 0;
  // Data plane (BufferConfig::dataplane).
  std::string schedule = "rotated";
  int queues = 1;
  std::string queue_split = "rr";
  std::int64_t aggregate = std::int64_t{1} << 20;
  std::string protocol = "explicit";
  /// Dispatch send policy (DataPlaneOptions::send_policy): auto | whole | block:BYTES. The
  /// engine sees the profile's put costs (HardwareModel::put_costs) through the sim transport.
  std::string send_policy = "auto";
  /// Combine's order of additions (DataPlaneOptions::combine_order): flat | node-first (the
  /// hierarchical schedule's relays sum a token's partials inside the server, DeepEP's
  /// internode combine).
  std::string combine_order = "flat";
  /// What an expanded combine sends back (DataPlaneOptions::combine_replies): partials (one
  /// row per (token, rank), summed at the expert) | selections (one row per (token, expert):
  /// DeepEP's low-latency combine; the source forms the partials).
  std::string combine_replies = "partials";
  std::string relay_chunk = "auto";  ///< --relay-chunk: auto | BYTES (0 = the serial relay), scaled as --aggregate
  /// Keep the engine's output pool in model-only mode (a real run has it; the model-only
  /// default leaves it out, so the calls keep their rows-first shape): dispatch rows land in
  /// the receiver's output block, one copy — an expanded block takes a row per selection
  /// (token, expert), as DeepEP's low-latency dispatch sends them. The pool holds the
  /// largest output of the run.
  bool one_copy = false;
  std::int64_t ring_rows = 0;  ///< BufferConfig::ring_rows (0 = a slot for every row)
  /// Time a second dispatch and combine, after a first pair: the steady state of a model's
  /// layers, where each call follows one of the other kind and goes rows first where the
  /// data plane allows it (docs/engine.md).
  bool steady = false;
  /// Steady, and the second dispatch is cached (the first dispatch's handle).
  bool cached = false;
  // How the engine runs.
  int workers = 1;       ///< engine workers per rank (the model spreads them over the hardware's)
  int run_hidden = 0;    ///< 0 = auto: H in model-only mode, else 128 with payload scaled by H/128
  // Model-only knobs (what the engine does not do itself; experiments).
  bool dense_scan = false;        ///< charge a dense [S, P] route scan instead of the compact plan
  std::string sync = "none";      ///< none | barrier (global barrier per call) | credits:W (per-group)
  bool progress = true;
  /// Keep the engine's own counters of every call (BufferConfig::collect_stats): SimRun's
  /// dispatch_counters / combine_counters (`epx sim ledger`).
  bool collect_stats = false;
  /// Also time each combine with one of its mechanisms removed (docs/sim.md §3b):
  /// SimPoint::combine_without.
  bool attribution = false;
  std::string json, svg;
};

/// One rank's put counters of one call, summed over its workers (epx::CallStats).
struct EngineCounters {
  std::uint64_t puts = 0, bytes = 0;              ///< puts to other ranks and their bytes
  std::uint64_t local_puts = 0, local_bytes = 0;  ///< puts into the rank's own window
};

/// One EP size's engine run: the trace and what the model charges besides it.
struct SimRun {
  int ep = 0;
  std::int64_t tokens = 0;  ///< S of the run (a dense [S, P] scan is charged from it)
  sim::Trace trace;
  Topology topology;  ///< the table the engine ran with; the timing places ranks by it
  int dispatch_call = 1, combine_call = 2;  ///< the timed calls (the second pair when steady)
  bool steady = false, cached = false;
  std::vector<sim::RankCompute> dispatch_compute, combine_compute;
  std::vector<std::int64_t> recv_rows;  ///< [P] compact rows received in dispatch
  double dispatch_row_bytes = 0;        ///< logical bytes per received token (x + scales + idx + weights)
  double combine_row_bytes = 0;         ///< logical bytes per combined token (bf16 x)
  /// DeepEP's bottleneck bandwidth (docs/sim.md §8): which of its definitions applies to
  /// this run ("normal intranode", "normal internode", "low-latency") and the bytes it
  /// counts per rank [P] for dispatch and combine.
  std::string bottleneck_metric;
  std::vector<double> bottleneck_dispatch_bytes, bottleneck_combine_bytes;
  bool model_only = false;
  int run_hidden = 0;
  double engine_seconds = 0;
  double engine_cpu_seconds = 0;  ///< process CPU time (all threads) of the engine run
  /// With SimOptions::collect_stats: [P] the engine's counters of the first dispatch and
  /// combine, and the rows the dispatch handle says it received.
  std::vector<EngineCounters> dispatch_counters, combine_counters;
  std::vector<std::int64_t> engine_recv_rows;
};

struct Split {
  double data_us = 0, control_us = 0, sync_us = 0, tail_us = 0;
  double reduce_tail_us = 0;  ///< of data_us: combine's sums after the rank's last op
  /// Payload out of a rank per port (sim::RankTiming::scaleup_out / nic_out), averages over
  /// ranks: the first put issued, the last landed, MB.
  double scaleup_first_us = 0, scaleup_last_us = 0, scaleup_mb = 0;
  double nic_first_us = 0, nic_last_us = 0, nic_mb = 0;
};

struct SimPoint {
  int ep = 0;
  double dispatch_gbps = 0, dispatch_gbps_slowest = 0, combine_gbps = 0, combine_gbps_slowest = 0;
  double dispatch_us = 0, combine_us = 0;  ///< max-rank latency
  /// DeepEP's bottleneck bandwidth, average over ranks of (its bytes / its time), and the
  /// definition used (SimRun::bottleneck_metric).
  double dispatch_bottleneck_gbps = 0, combine_bottleneck_gbps = 0;
  std::string bottleneck_metric;
  Split dispatch_split, combine_split;     ///< averages over ranks
  double engine_seconds = 0, timing_seconds = 0;  ///< the engine's run; timing its trace on the model
  double engine_cpu_seconds = 0, timing_cpu_seconds = 0;  ///< process CPU time (wall time depends on the machine's load)
  std::uint64_t events = 0;
  bool model_only = false;
  bool steady = false;  ///< the numbers are of a second dispatch and combine
  bool cached = false;  ///< ... whose dispatch is cached
  int run_hidden = 0;
  /// With SimOptions::attribution: combine GB/s (avg) with one mechanism removed, by name.
  std::vector<std::pair<std::string, double>> combine_without;
};

/// Whether the engine announces its payload region and skips payload loops on a
/// model-only transport (probed once with one rank).
bool engine_supports_model_only();

void validate_sim_options(const SimOptions& o);
/// Sets the option named by its `epx sim` flag without "--" (tokens, hidden, topk, experts,
/// groups, topk-groups, fp8, layout, alignment, schedule, topology, queues, queue-split,
/// aggregate, protocol, send-policy, combine-order, combine-replies, one-copy, seed) from its text: how a profile's published series
/// says how it was measured (sim::PublishedSeries::run). Throws kInvalidArgument naming the
/// option for an unknown name or a value that does not parse.
void set_sim_option(SimOptions& o, const std::string& name, const std::string& value);
/// The routing `epx sim` runs on `ep` ranks (the bench's generator: uniform or group-limited
/// top-k from o.seed; x is not used).
BenchProblem sim_problem(const SimOptions& o, int ep);
/// Runs the engine on `ep` sim ranks.
SimRun collect_run(const SimOptions& o, int ep);
/// Times a run's trace on a hardware model.
SimPoint evaluate_run(const SimRun& run, const sim::HardwareModel& hw, const SimOptions& o);
/// collect + evaluate for every o.ep, with progress on stderr.
std::vector<SimPoint> simulate(const SimOptions& o, const sim::HardwareModel& hw);

/// Output helpers.
std::string sim_table(const std::vector<SimPoint>& points, const sim::HardwareModel& hw);
std::string sim_json(const std::vector<SimPoint>& points);
std::string sim_svg(const std::vector<SimPoint>& points, const sim::HardwareModel& hw);

}  // namespace epx::tools
