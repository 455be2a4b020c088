// epx/sim/hardware.hpp — the hardware/topology model of `epx sim`, read from JSON.
//
// Every parameter carries its value, its unit and its source (a published number, a
// calibration, or an assumption), and the loader checks the unit, so a file cannot silently
// mean microseconds where the model reads nanoseconds. Format:
//   {"name": "ascend950-supernode", "description": "...",
//    "parameters": {"link_bandwidth": {"value": 330, "unit": "GB/s", "source": "..."}, ...},
//    "calibrate": ["link_bandwidth", ...],          (optional: what `epx sim calibrate` fits)
//    "published": [PublishedSeries, ...]}           (optional: the system's published figures)
// Parameters (required unless listed as optional below; docs/sim.md explains how each enters the model):
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
// Optional (a file without them gets the default, which switches the mechanism off):
//   scaleout_bandwidth    per-rank NIC into a scale-out (RDMA) fabric, each direction: a
//                         put between ranks of different servers (topology table) goes
//                         through the NICs instead of the scale-up ports; 0 = no scale-out
//                         network, every pair on the scale-up fabric        [GB/s]
//   scaleout_latency      one-way latency across the scale-out fabric        [ns]
//   scaleout_wr_time      the NIC's processing per put (message), per rank   [ns]
//   local_copy_bandwidth  the rate of a put into the own window (the node's copy engine);
//                         0 = link_bandwidth                                 [GB/s]
//   combine_handback      1: a combine's source hands each peer's receive area back, one
//                         peer after another, after the sums (combine_peer_release + the
//                         round trip, docs/sim.md §2 item 4); 0: the combine's receive
//                         areas need no hand-back (default 1)                [count]
//   scaleup_share_with_nic  in (0, 1]: in a call where a rank also puts through its NIC,
//                         its scale-up egress port moves at this share of link_bandwidth
//                         (a GPU kernel that drives both fabrics splits its SMs between
//                         fixed roles — RDMA senders, NVLink forwarders — so fewer push
//                         NVLink than in a kernel that uses NVLink only); 0 = off (default:
//                         link_bandwidth whatever the NIC does)                 [ratio]
#pragma once

#include <string>
#include <vector>

#include "epx/sim/units.hpp"
#include "epx/topology.hpp"

namespace epx::sim {

struct HardwareParam {
  std::string name;
  double value = 0;
  std::string unit;
  std::string source;
};

/// A published measurement of the system a profile models (GB/s per rank in the series'
/// metric; a range [lo, hi], lo == hi for a single figure; 0 = not published).
struct PublishedPoint {
  int ep = 0;
  double dispatch_lo = 0, dispatch_hi = 0, combine_lo = 0, combine_hi = 0;  ///< GB/s
  double dispatch_us = 0, combine_us = 0;  ///< max-rank µs, where published
  bool calibrate = false;  ///< `epx sim calibrate` fits on it (else held out: only compared)
};

/// One published setting of the system (e.g. DeepEP's normal kernels): how `epx sim` runs
/// it, the EP sizes it is predicted at, and the published points among them. Format:
///   {"label": "normal kernels", "metric": "deepep", "source": "...",
///    "run": {"tokens": 4096, "topk": 8, "groups": 8, "schedule": "hierarchical", ...},
///    "ep": [8, 16, 32, 64],
///    "points": [{"ep": 8, "dispatch_gbps": 153, "combine_gbps": 158, "calibrate": true},
///               {"ep": 32, "dispatch_gbps": [335, 340], ...}]}
/// metric: "epx" (GB/s per rank as the README defines it) or "deepep" (DeepEP's bottleneck
/// bandwidth, docs/sim.md). run: `epx sim` options by their flag name without "--" (their
/// text; the runner applies them, epx/sim/runner/published.hpp).
struct PublishedSeries {
  std::string label, metric, source;
  std::vector<std::pair<std::string, std::string>> run;
  std::vector<int> ep;
  std::vector<PublishedPoint> points;
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
  GBps scaleout_bandwidth;  ///< 0: no scale-out network
  Nanoseconds scaleout_latency, scaleout_wr_time;
  GBps local_copy_bandwidth;  ///< resolved: link_bandwidth when the file says 0
  bool combine_handback = true;
  double scaleup_share_with_nic = 0;  ///< (0, 1]: scale-up egress rate share in a call that uses the NIC; 0 = off
  /// Every parameter as read (file order), with unit and source.
  std::vector<HardwareParam> params;
  /// What was published about the modelled system ("published": [...], optional).
  std::vector<PublishedSeries> published;
  /// The parameters `epx sim calibrate` fits ("calibrate": [names], optional).
  std::vector<std::string> calibrate;

  /// barrier_base + barrier_per_log2 * log2(P)
  Picoseconds barrier_cost(int ranks) const;
  /// Whether a put from `src` to `dst` crosses the scale-out fabric (NICs): the profile has
  /// one and the two ranks sit in different servers of the topology table.
  bool scaleout(const RankPlace& src, const RankPlace& dst) const;
  /// One-way latency from rank `src` at place `a` to rank `dst` at place `b`: local, the
  /// scale-out fabric (scaleout), same frame, or crossing frames. Places come from the
  /// topology table (epx/topology.hpp), never from rank arithmetic.
  Picoseconds latency(int src, int dst, const RankPlace& a, const RankPlace& b) const;

  /// What one put costs on this machine besides its bytes — doorbell + put_issue on one of
  /// the rank's workers_per_rank + queue_wr_time [ns] — and the port rate its bytes then
  /// move at (link_bandwidth) [GB/s]: what the sim transport reports to the engine's send
  /// policy (TransportCaps::put_overhead_ns / put_gbps). With a scale-out network, of the
  /// two tiers (+ scaleout_wr_time at scaleout_bandwidth) the one whose overhead x rate is
  /// larger (it needs the larger puts).
  struct PutCosts {
    double overhead_ns = 0, gbps = 0;
  };
  PutCosts put_costs() const;

  /// Sets a parameter by name (value only; keeps unit, replaces the source) and refreshes
  /// the typed fields. Throws epx::Error(kInvalidArgument) for an unknown name.
  void set(const std::string& name, double value, const std::string& source);
  double get(const std::string& name) const;
};

/// Names of the built-in profiles ("ascend950-supernode", "h800-deepep").
std::vector<std::string> builtin_hardware_names();
/// The JSON text of a built-in profile (throws kInvalidArgument naming the known ones).
std::string builtin_hardware_json(const std::string& name);

/// A built-in profile by name, or a JSON file by path. Throws epx::Error(kInvalidArgument)
/// naming the file, the parameter and what was expected.
HardwareModel load_hardware(const std::string& name_or_file);
HardwareModel parse_hardware_json(const std::string& text, const std::string& where);
std::string to_json(const HardwareModel& model);

}  // namespace epx::sim
