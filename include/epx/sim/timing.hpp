// epx/sim/timing.hpp — timing a recorded trace (epx/sim/trace.hpp) on the discrete-event
// model of a machine (epx/sim/hardware.hpp): the simulated times of its calls.
//
// Each collective call is timed on its own, every rank starting at time 0 (the ranks
// are aligned at a call's start, as a benchmark's barrier aligns them). docs/sim.md states
// the model: streams, queues, ports, memory, signals, and how a rank's time is split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "epx/sim/hardware.hpp"
#include "epx/sim/trace.hpp"
#include "epx/sim/units.hpp"
#include "epx/topology.hpp"

namespace epx::sim {

/// The source side of a combine on one rank (docs/sim.md §2, "combine's reduction"): the
/// partials of its tokens land in its receive area, and a token's fixed-order sum starts
/// when the last of its partials has landed. The sum reads every partial back from memory
/// (ring read-back), widens and adds them on the vector units (FP32) and writes one BF16
/// row; that traffic shares the rank's memory with the incoming writes (contention).
struct SourceReduction {
  /// [peer] this rank's tokens whose partial `peer` sends, in the order the rows arrive
  /// (the dispatch plan's order: ascending token index). Local partials: peer = this rank.
  std::vector<std::vector<std::int32_t>> from;
  /// [token] its number of partials (unique destination ranks; 0 = routed nowhere).
  std::vector<std::uint8_t> partials;
  /// Payload bytes of one partial row as recorded in the trace (payload_scale applies).
  std::uint64_t row_bytes = 0;
};

/// Work of one rank in one call that is not a transport operation, charged by the model
/// from the shape (the runner fills it from the routing).
struct RankCompute {
  std::uint64_t plan_slots = 0;   ///< (token, k) slots the route plan scans (fresh dispatch)
  std::uint64_t plan_counts = 0;  ///< counts the prefix sums read (P x (P+E), fresh dispatch)
  std::uint64_t dense_cells = 0;  ///< cells of a dense [S, P] route scan (0: compact plan)
  /// Memory read at the sender per payload byte it sends (1 = the row itself; a combine
  /// that sums several slot rows into one partial reads and stages more).
  double read_per_payload_byte = 1.0;
  /// Vector-unit bytes at the sender per payload byte it sends: an expanded combine sums a
  /// row's slots into its partial (FP32) before the put; rows with one slot pass through.
  double presum_per_payload_byte = 0.0;
  /// The source side of a combine (null: not modelled, e.g. a dispatch).
  std::shared_ptr<const SourceReduction> reduction;
  /// Whether the source's sum moves bytes through the memory (false: vector units only;
  /// attribution of the contention with the incoming writes).
  bool reduction_memory = true;
  /// Whether the source hands each peer's receive area back after its partials are summed
  /// (per peer, serially: HardwareModel::combine_peer_release + the round trip to the peer;
  /// false: attribution).
  bool peer_release = true;
  /// Payload bytes are multiplied by this (runs at a reduced hidden size: H / H_run).
  double payload_scale = 1.0;
  /// Experiment knob: charged once at the call's end on the rank thread (e.g. a modelled
  /// per-group credit exchange or a global barrier that the engine does not issue).
  Picoseconds extra_sync{0};
};

/// Where one rank's time in a call went (rank thread's view; sums to `total`).
/// One port's payload out of a rank in one call (records that carry payload to another
/// rank): when the first was issued, when the last landed at its target, its bytes (scaled).
struct PortUse {
  Picoseconds first{0}, last{0};
  std::uint64_t bytes = 0;  ///< 0: the port carried no payload in this call
};

struct RankTiming {
  Picoseconds total{0};    ///< the rank's last operation completes
  Picoseconds control{0};  ///< launch + planning + issuing puts/signals
  Picoseconds data{0};     ///< waiting for payload to drain or arrive
  Picoseconds sync{0};     ///< quiet latency, barriers, waits for control-only signals
  /// Of `data`: the source's combine sums and per-peer hand-backs running past the rank's
  /// last operation.
  Picoseconds reduce_tail{0};
  std::uint64_t puts = 0;            ///< puts issued (all streams)
  std::uint64_t payload_bytes = 0;   ///< payload bytes sent (scaled)
  std::uint64_t remote_bytes = 0;    ///< all bytes sent to other ranks (scaled)
  /// Payload to ranks through the scale-up ports and through the NIC
  /// (HardwareModel::scaleout; without a NIC everything is scale-up): when each port's
  /// payload traffic starts and ends (docs/sim.md §8 reads the stages of a relay combine off it).
  PortUse scaleup_out, nic_out;
};

struct CallTiming {
  std::string name;
  std::vector<RankTiming> ranks;
  Picoseconds max_rank{0};
  std::uint64_t events = 0;  ///< discrete events processed
};

/// The topology `epx sim` uses when none is given (docs/sim.md): builtin:supernode128 at 128
/// ranks on a machine of 2 frames x 64 ranks (the table's shape); otherwise builtin:servers:8
/// when 8 divides P (for P <= 64 these are the first P places of the supernode: servers of
/// 8, all in frame 0), else builtin:flat.
std::string default_topology_spec(int num_ranks, const HardwareModel& hw);

/// Times call `call` of `trace` on the model. `compute` is per rank (empty: nothing charged).
/// `topology` places the ranks (frame crossings); it must describe trace.num_ranks ranks
/// in at most hw.frames frames of at most hw.ranks_per_frame ranks (kInvalidArgument).
/// Throws epx::Error(kInternal) if the trace cannot complete (a wait nobody signals).
CallTiming time_call(const Trace& trace, int call, const HardwareModel& hw, const std::vector<RankCompute>& compute,
                     const Topology& topology);
/// The same with load_topology(default_topology_spec(trace.num_ranks, hw)).
CallTiming time_call(const Trace& trace, int call, const HardwareModel& hw, const std::vector<RankCompute>& compute);

}  // namespace epx::sim
