// epx/sim/hardware.hpp — the hardware/topology model of `epx sim`, read from JSON.
//
// Every parameter carries its value, its unit and its source (a published number, a
// calibration, or an assumption), and the loader checks the unit, so a file cannot silently
// mean microseconds where the model reads nanoseconds. Format:
//   {"name": "ascend950-supernode", "description": "...",
//    "parameters": {"link_bandwidth": {"value": 330, "unit": "GB/s", "source": "..."}, ...}}
// Parameters (all required; docs/sim.md explains how each enters the model):
//   frames, ranks_per_frame  the machine's size; rank positions (which frame a rank sits
//                            in) come from the topology table, checked against these [count]
//   workers_per_rank                                                [count]
//   link_bandwidth        per-rank egress and ingress port, netlayer 1 [GB/s]
//   link_latency          one-way, same frame                          [ns]
//   frame_crossing_latency extra one-way latency when crossing frames  [ns]
//   local_latency         a put/signal into the own window             [ns]
//   chunk_bytes           ports serve FIFO in chunks of this size      [bytes]
//   queue_wr_time         work-request processing per put, per queue   [ns]
//   doorbell              per batch of puts (one trace record)         [ns]
//   put_issue             issuing thread's cost per put (per hw worker)[ns]
//   signal_issue          issuing thread's cost per signal             [ns]
//   quiet_latency         completion round trip of quiet               [ns]
//   poll_latency          a waiter notices a landed signal / flag      [ns]
//   barrier_base, barrier_per_log2  barrier = base + per_log2 * log2 P [ns]
//   launch_init           kernel launch + init per call                [ns]
//   memory_bandwidth      per rank, shared by incoming puts, local copies and the
//                         combine's local reduction                   [GB/s]
//   reduce_bandwidth      per rank, the vector units summing BF16 partials in FP32
//                         (BF16 input bytes per second; combine's pre-sum at the expert
//                         and the source's sum share them)             [GB/s]
//   combine_peer_release  per peer, at the source of a combine: once every partial a peer
//                         sent has been summed, its receive area is handed back, one peer
//                         after another: this bookkeeping, plus the credit's round trip to
//                         the peer (2 x its latency, from the topology)       [ns]
//   plan_per_slot         compact route plan per (token, k) slot       [ns]
//   plan_per_count        prefix sums per gathered count (P x (P+E))   [ns]
//   dense_scan_per_cell   a dense [S, P] route scan per cell           [ns]
//   payload_limit_low, payload_limit_high  physical payload limit per rank (reporting) [GB/s]
#pragma once

#include <string>
#include <vector>

#include "epx/sim/units.hpp"

namespace epx::sim {

struct HardwareParam {
  std::string name;
  double value = 0;
  std::string unit;
  std::string source;
};

struct HardwareModel {
  std::string name;
  std::string description;
  int frames = 1;
  int ranks_per_frame = 1;
  int workers_per_rank = 1;
  GBps link_bandwidth;
  Nanoseconds link_latency, frame_crossing_latency, local_latency;
  Bytes chunk_bytes{65536};
  Nanoseconds queue_wr_time, doorbell, put_issue, signal_issue;
  Nanoseconds quiet_latency, poll_latency;
  Nanoseconds barrier_base, barrier_per_log2;
  Nanoseconds launch_init;
  GBps memory_bandwidth;
  GBps reduce_bandwidth;
  Nanoseconds combine_peer_release;
  Nanoseconds plan_per_slot, plan_per_count, dense_scan_per_cell;
  GBps payload_limit_low, payload_limit_high;
  /// Every parameter as read (file order), with unit and source.
  std::vector<HardwareParam> params;

  /// barrier_base + barrier_per_log2 * log2(P)
  Picoseconds barrier_cost(int ranks) const;
  /// One-way latency from rank `src` in frame `src_frame` to rank `dst` in frame
  /// `dst_frame` (local, same frame, or crossing frames). Frames come from the topology
  /// table (epx/topology.hpp), never from rank arithmetic.
  Picoseconds latency(int src, int dst, int src_frame, int dst_frame) const;

  /// Sets a parameter by name (value only; keeps unit, replaces the source) and refreshes
  /// the typed fields. Throws epx::Error(kInvalidArgument) for an unknown name.
  void set(const std::string& name, double value, const std::string& source);
  double get(const std::string& name) const;
};

/// Names of the built-in profiles ("ascend950-supernode").
std::vector<std::string> builtin_hardware_names();
/// The JSON text of a built-in profile (throws kInvalidArgument naming the known ones).
std::string builtin_hardware_json(const std::string& name);

/// A built-in profile by name, or a JSON file by path. Throws epx::Error(kInvalidArgument)
/// naming the file, the parameter and what was expected.
HardwareModel load_hardware(const std::string& name_or_file);
HardwareModel parse_hardware_json(const std::string& text, const std::string& where);
std::string to_json(const HardwareModel& model);

}  // namespace epx::sim
