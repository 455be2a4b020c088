// The state of the discrete-event timing of a call (timing.cpp): its events, the fluid memory
// server, and what a stream, a record (one put in flight), a waiter and a rank hold.
// Private to the simulator's timing; see docs/sim.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <set>
#include <unordered_map>
#include <variant>
#include <vector>

#include "epx/sim/events.hpp"
#include "epx/sim/timing.hpp"

namespace epx::sim::timing_state {

// ---- events -----------------------------------------------------------------------------
struct RunStream { std::uint32_t stream; };         // a stream executes its next op(s)
struct IngressArrive { std::uint32_t record; std::uint32_t bytes; bool last; bool scaleout; };
struct MemoryArrive { std::uint32_t record; std::uint32_t bytes; bool last; };
struct RecordDone { std::uint32_t record; };        // landed in the target's memory
struct Deliver { std::int32_t rank; std::uint64_t key; std::uint64_t value; bool flag; bool after_payload; };
struct BarrierRelease {};
using Event = std::variant<RunStream, IngressArrive, MemoryArrive, RecordDone, Deliver,
                           BarrierRelease>;

// Memory of a rank: a fluid server. Time is cut into 1 us buckets, each holding
// bandwidth x 1 us bytes; a request fills free capacity from its arrival on. Unlike a FIFO
// pointer, a read booked for later (paced with the egress port) leaves the capacity before
// it usable by incoming writes, so reads and writes share the bandwidth.
class FluidServer {
 public:
  static constexpr std::int64_t kBucketPs = 1000000;
  void set_rate(GBps rate) { bytes_per_ps_ = rate.gbps / 1000.0; }
  /// Completion time of `bytes` arriving at `t`.
  Picoseconds serve(Picoseconds t, std::uint64_t bytes) {
    if (bytes_per_ps_ <= 0 || bytes == 0) return t;
    const double cap = bytes_per_ps_ * kBucketPs;
    double left = static_cast<double>(bytes);
    std::int64_t cursor = t.ps;
    for (;;) {
      const auto b = static_cast<std::size_t>(cursor / kBucketPs);
      if (used_.size() <= b) used_.resize(b + 1024, 0.0);
      const std::int64_t end = static_cast<std::int64_t>(b + 1) * kBucketPs;
      const double room = std::min(cap - used_[b], static_cast<double>(end - cursor) * bytes_per_ps_);
      if (room > 0) {
        const double take = std::min(room, left);
        used_[b] += take;
        left -= take;
        if (left <= 0) {
          const auto start = static_cast<std::int64_t>(b) * kBucketPs;
          const auto fill = start + static_cast<std::int64_t>(used_[b] / bytes_per_ps_);
          return Picoseconds{std::max(cursor + static_cast<std::int64_t>(take / bytes_per_ps_), std::min(fill, end))};
        }
      }
      cursor = end;
    }
  }

 private:
  double bytes_per_ps_ = 0;
  std::vector<double> used_;
};

enum class Block { kNone, kQuiet, kWait, kDep, kBarrier, kDone };

struct PendingSignal {
  std::uint64_t watermark;  // every record of the queue with seq <= watermark must be done
  std::int32_t peer;
  std::uint64_t slot, value;
  Picoseconds ready;
  bool after_payload;
};

struct Stream {
  int rank = 0;
  std::vector<const TraceOp*> ops;
  std::size_t pos = 0;
  Block block = Block::kNone;
  int block_queue = 0;
  std::uint64_t block_dep = 0;
  Picoseconds block_start{0};
  bool payload_issued = false;
  Picoseconds end{0};
  std::vector<std::uint64_t> issued;                // per queue: records issued
  std::vector<std::set<std::uint64_t>> incomplete;  // per queue: seqs not landed yet
  std::vector<std::deque<PendingSignal>> pending;   // per queue: ordered signals held back
  std::vector<int> last_peer;                       // per queue: peer of the last record
  Picoseconds control{0}, data{0}, sync{0};
  std::size_t first_op = 0;  // the trace index of ops[0] (a call's ops are consecutive)
  Picoseconds ready{0};      // when the op it is on ends (its next step)
  struct Joiner {
    std::size_t ops;      // released once this stream has completed that many of its ops
    std::uint32_t stream;  // the rank thread waiting
  };
  std::vector<Joiner> joiners;
};

struct Record {
  std::uint32_t stream;
  std::int32_t src, peer;
  std::int16_t queue;
  std::uint64_t seq;
  std::uint64_t bytes;
  std::uint64_t raw_payload;  // payload bytes as recorded (before payload_scale)
  std::uint64_t pre_mem;
  std::uint64_t pre_vec;      // vector-unit bytes before the put (combine's pre-sum)
  bool flagged;
  std::uint64_t flag_key, flag_value;
  Picoseconds issued{0};
};

struct Waiter {
  std::uint32_t stream;
  std::uint64_t at_least;
};

struct Rank {
  std::vector<Picoseconds> queue_free;
  Picoseconds egress_free{0}, ingress_free{0};
  // The NIC into the scale-out fabric (HardwareModel::scaleout): its message processing
  // and its two directions, FIFO like the scale-up ports.
  Picoseconds nic_wr_free{0}, nic_egress_free{0}, nic_ingress_free{0};
  Picoseconds local_free{0};  // the local copy path (a put into the own window), FIFO
  FluidServer memory;
  FluidServer vector;  // the vector units (combine's FP32 sums)
  bool nic_call = false;  // this rank puts through its NIC in the timed call (scaleup_share_with_nic)
  // Source side of a combine (RankCompute::reduction): partial rows landed per peer, the
  // partials each token still waits for, when the last token's sum is done.
  std::vector<std::uint64_t> landed_bytes;
  std::vector<std::size_t> landed_rows;
  std::vector<std::uint8_t> waiting;
  std::vector<Picoseconds> summed;  // [token] its sum is done (0: not summed)
  Picoseconds reduce_end{0};
  std::unordered_map<std::uint64_t, std::uint64_t> slots, flags;
  std::unordered_map<std::uint64_t, std::vector<Waiter>> slot_waiters, flag_waiters;
  std::unordered_map<std::uint64_t, Picoseconds> main_wait_done;  // wait_index -> completion
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> dep_waiters;
  std::unordered_map<std::uint64_t, std::uint64_t> carried;   // slot -> value left by earlier calls
  std::unordered_map<std::uint64_t, std::uint64_t> call_max;  // slot -> largest value signalled in this call
  std::vector<std::uint32_t> streams;
  std::vector<std::int64_t> of_trace;  // trace stream index -> streams_ index (-1: no ops in this call)
  int parallel = 1;  // hardware workers behind each recorded stream
  RankTiming timing;
};

constexpr int kQueues = 64;

}  // namespace epx::sim::timing_state
