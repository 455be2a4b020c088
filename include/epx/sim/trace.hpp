// epx/sim/trace.hpp — what the simulator transport records: every transport operation of
// every rank, per calling thread (= worker stream), in program order.
//
// Consecutive puts of one stream to the same (peer, queue) are coalesced into one record
// with a put count and their total bytes. Worker streams (threads other than the rank's
// own) carry an explicit dependency on the rank thread: "starts after the rank thread's
// n-th completed wait" (the engine forks its workers after a wait and joins them before
// the next one). Only waits the rank thread makes outside a worker task count (notify,
// data waits, barriers); waits inside a task (wait_flag of the flag protocol, a relay's
// wait_signal, the ring's read_signal polls) block only their own stream, like any worker's
// wait. The rank thread's next ops after a task wait for its workers' last ones (a join
// record per worker stream). Each record names the collective call it belongs to (sim_begin_call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace epx {

class Transport;

namespace sim {

enum class OpKind : std::uint8_t {
  kPut,            ///< count puts, bytes total (payload_bytes of them inside the payload region)
  kPutFlagged,     ///< one data-as-flag block: bytes, then the flag at key = offset + bytes
  kSignal,         ///< key = slot, value
  kWaitSignal,     ///< key = slot, value = at_least
  kWaitFlag,       ///< key = window offset, value = at_least
  kQuiet,          ///< queue
  kBarrier,        ///< collective
  kAfterMainWait,  ///< worker stream: key = index of the rank thread's completed wait it follows
  /// read_signal (a poll loop, e.g. the bounded ring) that saw a value it had not seen
  /// before: key = slot, value = the value observed. The model times it as a wait for that value.
  kPollSignal,
  /// Rank thread, after a task's workers finished (Transport::workers_joined): waits until
  /// worker stream `peer` (index in RankTrace::streams) has completed its first `key` ops
  /// (counted over the whole trace, every call).
  kJoin,
};
const char* to_string(OpKind kind) noexcept;

struct TraceOp {
  OpKind kind = OpKind::kPut;
  std::int16_t queue = 0;
  std::int32_t peer = -1;
  std::uint32_t call = 0;           ///< index into Trace::calls (0 = before the first call)
  std::uint64_t count = 0;          ///< puts merged into this record (puts only)
  std::uint64_t bytes = 0;          ///< all bytes of those puts
  std::uint64_t payload_bytes = 0;  ///< the part inside the payload region
  std::uint64_t key = 0;            ///< slot / flag offset / wait index
  std::uint64_t value = 0;          ///< signal value / at_least / flag value
  std::uint64_t wait_index = 0;     ///< waits of the rank thread: its running wait number (1-based)
};

struct StreamTrace {
  std::vector<TraceOp> ops;  ///< program order
};

struct RankTrace {
  std::vector<StreamTrace> streams;  ///< [0] = the rank thread, then workers in first-use order
};

struct Trace {
  int num_ranks = 0;
  std::vector<std::string> calls = {"setup"};  ///< call names; 0 = setup (Buffer creation)
  std::vector<RankTrace> ranks;                ///< [P]
};

/// Put counts and bytes per (rank, peer, queue) of one call (or of all calls: call < 0).
struct PutSummary {
  std::uint64_t puts = 0;
  std::uint64_t bytes = 0;
};
/// [rank][peer][queue]
using PutTable = std::vector<std::vector<std::vector<PutSummary>>>;
PutTable summarize_puts(const Trace& trace, int call, int max_queues = 4);

/// How the simulator transport runs: copy mode (bytes move, results are exact) or
/// model-only (puts inside the payload region are recorded but not copied, and the payload
/// region of the window is never touched). `trace` receives every rank's records when the
/// launch returns.
struct SimTransportOptions {
  bool model_only = false;
  Trace* trace = nullptr;
  /// The modelled machine's cost of one put, reported as TransportCaps::put_overhead_ns /
  /// put_gbps so the engine's send policy sees the simulated hardware (HardwareModel::put_costs).
  double put_overhead_ns = 0;
  double put_gbps = 0;
};

/// Marks the start of a collective call on this rank (called by the rank thread before the
/// call, on every rank, in the same order). No-op on other transports. Returns the call index.
int sim_begin_call(Transport& transport, const std::string& name);

/// Whether `transport` is a simulator transport whose engine announced a payload region.
bool sim_saw_payload_region(const Transport& transport) noexcept;

}  // namespace sim
}  // namespace epx
