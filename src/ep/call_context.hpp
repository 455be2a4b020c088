// What one collective call of a Buffer works in, beside the Setup it reads: its epoch, its
// statistics and waits (stats.cpp), and the staging its senders build rows in. One per
// Buffer, reused call after call (the staging keeps its capacity); a call's front resets
// what it reads (begin_stats), its workers fill it, its back reports it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "epx/stats.hpp"

namespace epx::detail {

struct CallContext {
  explicit CallContext(int P) : waits(std::make_shared<PeerWaits>(P)) {}

  std::uint64_t epoch = 0;  // collective calls made so far (the same on every rank)
  /// This call's puts and copies may stream (StreamScope, set by run_workers on each worker):
  /// the payload this rank writes in the call is at least DataPlaneOptions::stream_min_call_bytes.
  bool stream_stores = true;

  // Statistics (when collecting) and waits (always; epx/stats.hpp's PeerWaits).
  CallStats stats;
  std::chrono::steady_clock::time_point call_start;
  std::shared_ptr<PeerWaits> waits;
  std::vector<std::uint64_t> call_waits;  // this call's ns per (worker, source): [W][P]
  std::vector<std::uint64_t> call_laps;   // this call's end-of-call quiet per peer it waited for: [P]
  std::vector<std::uint64_t> call_held;   // each source's announced held_ns (its header): [P]
  std::uint64_t held_ns = 0;              // what held me after my last header (into my next header)
  std::uint64_t laps_announced = 0;       // this call's laps before its header (announced in it)
  WaitOp wait_op = WaitOp::kDispatch;
  int wait_first = 0;

  // Staging: what the senders build before they put it.
  std::vector<std::byte> meta_stage;       // sender's row metadata, per plan entry
  std::vector<std::byte> scale_stage;      // sender's FP8 scale rows, per plan entry (put_segment_scales)
  std::vector<std::byte> relay_stage;      // hierarchical: records of my relayed rows, per relay
  std::vector<std::uint16_t> reply_stage;  // combine partials that need rounding
  std::vector<std::uint16_t> relay_sums;   // node-first relays: one sum per relayed row (paths/combine_relay.cpp)
};

}  // namespace epx::detail
