#include "epx/sim/runner/hybridep.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epx/error.hpp"
#include "epx/sim/runner/ledger.hpp"

namespace epx::tools {

namespace {
[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "epx sim hybridep: " + what); }
}  // namespace

void validate_hybrid_options(const HybridOptions& o) {
  if (o.domains < 1 || o.ranks < o.domains || o.ranks % o.domains != 0)
    bad("--ep must be a multiple of --domains (got " + std::to_string(o.ranks) + " ranks, " + std::to_string(o.domains) + " domains)");
  if (o.tokens < 1 || o.hidden < 1 || o.topk < 1 || o.experts < o.topk) bad("shape: tokens, hidden, topk >= 1 and experts >= topk");
  if (o.experts % o.ranks != 0) bad("--experts must be a multiple of --ep");
  if (!(o.cross_bandwidth > 0)) bad("--cross-bandwidth must be > 0 GB/s");
  if (!(o.cross_latency_us >= 0) || !(o.compute_us >= 0)) bad("--cross-latency and --compute must be >= 0 us");
  if (!(o.overlap >= 0 && o.overlap <= 1)) bad("--overlap must be in [0, 1]");
  if (!(o.compression > 0) || !(o.weight_bytes > 0) || o.expert_intermediate < 1)
    bad("--compression, --weight-bytes must be > 0 and --expert-intermediate >= 1");
  if (o.p.empty()) bad("--p needs at least one value");
  for (double p : o.p)
    if (!(p >= 0 && p <= 1)) bad("every --p must be in [0, 1], got " + std::to_string(p));
}

HybridPoint hybrid_point(const HybridOptions& o, const sim::HardwareModel& hw, double p) {
  const double D = o.domains, Rd = static_cast<double>(o.ranks) / o.domains, S = static_cast<double>(o.tokens), K = o.topk;
  HybridPoint pt;
  pt.p = p;
  // An expert pick is served inside the token's domain when the expert lives there (1/D)
  // or is one of the copied fraction p of another domain's experts; the copies are spread
  // over the domain's ranks like its own experts.
  const double inside = 1 / D + p * (D - 1) / D;
  pt.unique_in_domain = Rd * (1 - std::pow(1 - inside / Rd, K));
  // The rest crosses, once per other domain the token reaches (its rows are fanned out there).
  pt.tokens_crossing = (D - 1) * (1 - std::pow(1 - (1 - p) / D, K));
  const double rows_d = dispatch_row_bytes(o.hidden, o.topk, o.fp8), rows_c = combine_row_bytes(o.hidden);
  const double link = hw.link_bandwidth.gbps * 1e3, cross = o.cross_bandwidth * 1e3;  // bytes per us
  const double lat = hw.link_latency.ns / 1e3;
  auto phase = [&](double row) {
    // Each rank's port carries its rows to the other ranks of its domain and its crossing
    // rows; the domain's slow link carries every crossing row of its R/D ranks.
    const double port = S * (pt.unique_in_domain * (1 - 1 / Rd) + pt.tokens_crossing) * row / link;
    const double slow = Rd * S * pt.tokens_crossing * row / cross;
    pt.intra_us += port;
    pt.cross_us += slow;
    pt.cross_token_bytes += Rd * S * pt.tokens_crossing * row;
    return std::max(port + lat, pt.tokens_crossing > 0 ? slow + o.cross_latency_us : 0.0);
  };
  pt.dispatch_us = phase(rows_d);
  pt.combine_us = phase(rows_c);
  // Expert all-gather: each domain receives the copied fraction of every other domain's
  // experts (3 H I weights each, compressed) before the layer; up to overlap * compute_us of
  // it hides behind the previous layer's compute.
  const double expert_bytes = 3.0 * o.hidden * o.expert_intermediate * o.weight_bytes * o.compression;
  pt.gather_bytes = p * o.experts * (D - 1) / D * expert_bytes;
  pt.gather_us = pt.gather_bytes > 0 ? pt.gather_bytes / cross + o.cross_latency_us : 0.0;
  pt.gather_exposed_us = std::max(0.0, pt.gather_us - o.overlap * o.compute_us);
  pt.layer_us = pt.gather_exposed_us + pt.dispatch_us + pt.combine_us;
  return pt;
}

std::vector<HybridPoint> hybrid_sweep(const HybridOptions& o, const sim::HardwareModel& hw) {
  validate_hybrid_options(o);
  std::vector<HybridPoint> out;
  for (double p : o.p) out.push_back(hybrid_point(o, hw, p));
  return out;
}

std::size_t best_point(const std::vector<HybridPoint>& points) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < points.size(); ++i)
    if (points[i].layer_us < points[best].layer_us) best = i;
  return best;
}

std::string hybrid_table(const std::vector<HybridPoint>& points, const HybridOptions& o, const sim::HardwareModel& hw) {
  std::ostringstream os;
  char line[512];
  const double expert_mb = 3.0 * o.hidden * o.expert_intermediate * o.weight_bytes / 1e6;
  std::snprintf(line, sizeof line,
                "epx sim hybridep: %d ranks in %d domains (inside: %s, %.1f GB/s per rank port), slow link %.1f GB/s per domain each "
                "direction, %.1f us\n",
                o.ranks, o.domains, hw.name.c_str(), hw.link_bandwidth.gbps, o.cross_bandwidth, o.cross_latency_us);
  os << line;
  std::snprintf(line, sizeof line,
                "shape: %lld tokens/rank, H=%d, top-%d of %d; expert = 3 x H x %d weights x %.2f B = %.1f MB, compressed x%.3f on the "
                "link; all-gather hidden behind %.0f%% of %.1f us compute\n",
                static_cast<long long>(o.tokens), o.hidden, o.topk, o.experts, o.expert_intermediate, o.weight_bytes, expert_mb,
                o.compression, 100 * o.overlap, o.compute_us);
  os << line;
  os << "    p | crossings/token | cross tokens GB | gather GB | gather us (exposed) | dispatch us | combine us | layer us\n";
  for (const HybridPoint& pt : points) {
    std::snprintf(line, sizeof line, "%5.2f | %15.3f | %15.3f | %9.3f | %9.1f (%7.1f) | %11.1f | %10.1f | %8.1f\n", pt.p,
                  pt.tokens_crossing, pt.cross_token_bytes / 1e9, pt.gather_bytes / 1e9, pt.gather_us, pt.gather_exposed_us,
                  pt.dispatch_us, pt.combine_us, pt.layer_us);
    os << line;
  }
  if (!points.empty()) {
    const HybridPoint& b = points[best_point(points)];
    std::snprintf(line, sizeof line, "best p = %.2f: %.1f us per layer (p=0 pure token all-to-all, p=1 pure expert all-gather)\n", b.p,
                  b.layer_us);
    os << line;
  }
  return os.str();
}

std::string hybrid_json(const std::vector<HybridPoint>& points, const HybridOptions& o) {
  nlohmann::ordered_json j;
  j["ranks"] = o.ranks;
  j["domains"] = o.domains;
  j["cross_bandwidth_gbps"] = o.cross_bandwidth;
  j["cross_latency_us"] = o.cross_latency_us;
  j["expert_bytes"] = 3.0 * o.hidden * o.expert_intermediate * o.weight_bytes;
  j["compression"] = o.compression;
  j["compute_us"] = o.compute_us;
  j["overlap"] = o.overlap;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const HybridPoint& pt : points)
    list.push_back({{"p", pt.p},
                    {"tokens_crossing", pt.tokens_crossing},
                    {"unique_in_domain", pt.unique_in_domain},
                    {"cross_token_bytes", pt.cross_token_bytes},
                    {"gather_bytes", pt.gather_bytes},
                    {"intra_us", pt.intra_us},
                    {"cross_us", pt.cross_us},
                    {"gather_us", pt.gather_us},
                    {"gather_exposed_us", pt.gather_exposed_us},
                    {"dispatch_us", pt.dispatch_us},
                    {"combine_us", pt.combine_us},
                    {"layer_us", pt.layer_us}});
  j["points"] = list;
  if (!points.empty()) j["best_p"] = points[best_point(points)].p;
  return j.dump(2) + "\n";
}

}  // namespace epx::tools
