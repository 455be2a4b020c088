// `epx sim hybridep`: move tokens or move experts across a slow link (docs/sim.md §7).
//
// Two-level topology: D domains of R/D ranks (a supernode each: inside, every rank has its
// port of hw.link_bandwidth), joined by one link per domain of `cross_bandwidth` (each
// direction) and `cross_latency`. A fraction p of every other domain's experts is copied
// into each domain (a compressed expert all-gather over the slow link, before the layer);
// tokens routed to a copied expert stay in their domain. Closed form, uniform routing.
#pragma once

#include <string>
#include <vector>

#include "epx/sim/hardware.hpp"

namespace epx::tools {

struct HybridOptions {
  int ranks = 128;             ///< R: all ranks
  int domains = 2;             ///< D: domains joined by the slow link
  std::int64_t tokens = 16384; ///< S per rank
  int hidden = 7168, topk = 6, experts = 256;
  bool fp8 = true;             ///< dispatch row: fp8 + scales (else bf16); combine bf16
  int expert_intermediate = 2048;  ///< I: an expert is gate + up + down = 3 H I weights
  double weight_bytes = 1.0;       ///< bytes per weight before compression (fp8 = 1)
  double compression = 1.0;        ///< bytes on the link per weight byte (0.25 = 4x smaller)
  double cross_bandwidth = 100;    ///< GB/s per domain, each direction
  double cross_latency_us = 10;    ///< one way
  double compute_us = 0;           ///< the layer's expert compute the all-gather can hide behind
  double overlap = 0;              ///< fraction of compute_us usable to hide the all-gather (0..1)
  std::vector<double> p = {0, 0.25, 0.5, 0.75, 1};
  std::string json;
};

struct HybridPoint {
  double p = 0;
  double tokens_crossing = 0;   ///< per token: other domains it is sent to (each once)
  double unique_in_domain = 0;  ///< per token: destination ranks inside its domain
  double cross_token_bytes = 0; ///< per domain per layer, each direction, dispatch + combine
  double gather_bytes = 0;      ///< per domain per layer: expert copies received
  double intra_us = 0, cross_us = 0, gather_us = 0, gather_exposed_us = 0;
  double dispatch_us = 0, combine_us = 0;
  double layer_us = 0;          ///< gather_exposed + dispatch + combine
};

void validate_hybrid_options(const HybridOptions& o);
/// The time per layer at one p (hw: link_bandwidth and link_latency inside a domain).
HybridPoint hybrid_point(const HybridOptions& o, const sim::HardwareModel& hw, double p);
std::vector<HybridPoint> hybrid_sweep(const HybridOptions& o, const sim::HardwareModel& hw);
/// Index of the smallest layer_us (the first one on a tie).
std::size_t best_point(const std::vector<HybridPoint>& points);
std::string hybrid_table(const std::vector<HybridPoint>& points, const HybridOptions& o, const sim::HardwareModel& hw);
std::string hybrid_json(const std::vector<HybridPoint>& points, const HybridOptions& o);

}  // namespace epx::tools
