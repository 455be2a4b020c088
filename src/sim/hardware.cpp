// Hardware model: JSON with value / unit / source per parameter; the built-in profile.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epx/error.hpp"
#include "epx/sim/hardware.hpp"

namespace epx::sim {

namespace {

struct Spec {
  const char* name;
  const char* unit;
  /// Optional parameters (mechanisms added after the first profile) take this value and
  /// source when a file leaves them out; nullptr: required.
  const char* default_source = nullptr;
  double default_value = 0;
};
// Every parameter the model reads, with the one unit it accepts.
constexpr Spec kSpecs[] = {
    {"frames", "count"},
    {"ranks_per_frame", "count"},
    {"workers_per_rank", "count"},
    {"link_bandwidth", "GB/s"},
    {"link_latency", "ns"},
    {"frame_crossing_latency", "ns"},
    {"local_latency", "ns"},
    {"chunk_bytes", "bytes"},
    {"queue_wr_time", "ns"},
    {"doorbell", "ns"},
    {"put_issue", "ns"},
    {"signal_issue", "ns"},
    {"quiet_latency", "ns"},
    {"poll_latency", "ns"},
    {"barrier_base", "ns"},
    {"barrier_per_log2", "ns"},
    {"launch_init", "ns"},
    {"memory_bandwidth", "GB/s"},
    {"reduce_bandwidth", "GB/s"},
    {"combine_peer_release", "ns"},
    {"plan_per_slot", "ns"},
    {"plan_per_count", "ns"},
    {"dense_scan_per_cell", "ns"},
    {"payload_limit_low", "GB/s"},
    {"payload_limit_high", "GB/s"},
    {"scaleout_bandwidth", "GB/s", "default: no scale-out network (every pair of ranks on the scale-up fabric)", 0},
    {"scaleout_latency", "ns", "default: no scale-out network", 0},
    {"scaleout_wr_time", "ns", "default: no scale-out network", 0},
    {"local_copy_bandwidth", "GB/s", "default: a local put moves at link_bandwidth", 0},
    {"combine_handback", "count", "default: 1, the source hands every peer's receive area back after its sums", 1},
    {"scaleup_share_with_nic", "ratio", "default: 0, the scale-up ports keep link_bandwidth when the NIC is used too", 0},
};

// The calibrated values come from `epx sim calibrate` (tools/sim_runner/calibrate.cpp); the
// calibration shape and the fitted points are in docs/sim.md.
constexpr const char* kAscend950 = R"json({
  "name": "ascend950-supernode",
  "description": "Ascend 950DT supernode: netlayer-1 Clos (every pair of ranks directly reachable), 2 frames x 64 ranks, 64 vector workers per rank",
  "parameters": {
    "frames":                 {"value": 2,     "unit": "count", "source": "published: DeepEP-Ascend notes, 2 frames x 64 ranks"},
    "ranks_per_frame":        {"value": 64,    "unit": "count", "source": "published: DeepEP-Ascend notes"},
    "workers_per_rank":       {"value": 64,    "unit": "count", "source": "published: 64 vector workers per rank"},
    "link_bandwidth":         {"value": 337.1, "unit": "GB/s",  "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back)"},
    "link_latency":           {"value": 1500,  "unit": "ns",    "source": "assumption: one netlayer-1 Clos hop incl. switch"},
    "frame_crossing_latency": {"value": 500,   "unit": "ns",    "source": "assumption: extra switch stage between frames"},
    "local_latency":          {"value": 200,   "unit": "ns",    "source": "assumption: write into own HBM window"},
    "chunk_bytes":            {"value": 65536, "unit": "bytes", "source": "assumption: port arbitration granularity"},
    "queue_wr_time":          {"value": 4.457, "unit": "ns",    "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back)"},
    "doorbell":               {"value": 100,   "unit": "ns",    "source": "assumption: one MMIO doorbell per batch of puts"},
    "put_issue":              {"value": 50,    "unit": "ns",    "source": "assumption: descriptor build per put on one vector worker"},
    "signal_issue":           {"value": 50,    "unit": "ns",    "source": "assumption: like put_issue"},
    "quiet_latency":          {"value": 1000,  "unit": "ns",    "source": "assumption: completion round trip"},
    "poll_latency":           {"value": 100,   "unit": "ns",    "source": "assumption: flag polling interval"},
    "barrier_base":           {"value": 1000,  "unit": "ns",    "source": "published: barrier ~4 us at 8 ranks (split base/slope is an assumption)"},
    "barrier_per_log2":       {"value": 1000,  "unit": "ns",    "source": "published: barrier ~4 us at 8 ranks (split base/slope is an assumption)"},
    "launch_init":            {"value": 1900,  "unit": "ns",    "source": "published: kernel launch + init ~1.9 us"},
    "memory_bandwidth":       {"value": 2645,  "unit": "GB/s",  "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back)"},
    "reduce_bandwidth":       {"value": 1201,  "unit": "GB/s",  "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back)"},
    "combine_peer_release":   {"value": 501,   "unit": "ns",    "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1, with combine's per-peer hand-back) fitted 3501 ns per peer for bookkeeping + round trip; at EP8/16/32 every peer is in frame 0, so the round trip is 2 x link_latency = 3000 ns and this is the rest"},
    "plan_per_slot":          {"value": 0.05,  "unit": "ns",    "source": "assumption: 64 workers scan S*K slots (~3 ns per slot per worker)"},
    "plan_per_count":         {"value": 0.02,  "unit": "ns",    "source": "assumption: 64 workers, prefix sums over P*(P+E) counts"},
    "dense_scan_per_cell":    {"value": 0.05,  "unit": "ns",    "source": "assumption: 64 workers scan a dense [S,P] bool table"},
    "payload_limit_low":      {"value": 350,   "unit": "GB/s",  "source": "published: physical payload limit estimate, low"},
    "payload_limit_high":     {"value": 420,   "unit": "GB/s",  "source": "published: physical payload limit estimate, high"}
  },
  "calibrate": ["link_bandwidth", "memory_bandwidth", "queue_wr_time", "reduce_bandwidth", "combine_peer_release"],
  "published": [
    {"label": "DeepEP-Ascend", "metric": "epx",
     "source": "published: Ascend 950DT notes, GB/s per rank (ranges), FP8 dispatch with row-major scales, BF16 combine",
     "run": {"tokens": 16384, "hidden": 7168, "topk": 6, "experts": 256, "fp8": true, "layout": "expanded", "alignment": 128,
             "schedule": "rotated"},
     "ep": [8, 16, 32, 64, 128],
     "points": [
       {"ep": 8,  "dispatch_gbps": [373, 375], "combine_gbps": [345, 347], "calibrate": true},
       {"ep": 16, "dispatch_gbps": [348, 352], "combine_gbps": [338, 341], "calibrate": true},
       {"ep": 32, "dispatch_gbps": [335, 340], "combine_gbps": [320, 324], "calibrate": true}]}
  ]
})json";

// DeepEP's own setting (deepseek-ai/DeepEP docs/legacy.md): H800,
// NVLink ~160 GB/s inside a node of 8, one ConnectX-7 400 Gb/s NIC (~50 GB/s) per GPU into
// an RDMA fabric. Only the four calibration rows are in "published": the rest
// of DeepEP's table is predicted blind (docs/sim.md §8).
constexpr const char* kH800 = R"json({
  "name": "h800-deepep",
  "description": "DeepEP's test system: H800 GPUs, NVLink domains of 8 (one node), one ConnectX-7 400 Gb/s NIC per GPU into an RDMA fabric",
  "parameters": {
    "frames":                 {"value": 1,     "unit": "count", "source": "assumption: one RDMA fabric, no frame crossings (a node is a server of the topology table)"},
    "ranks_per_frame":        {"value": 256,   "unit": "count", "source": "published: DeepEP's table goes up to EP256"},
    "workers_per_rank":       {"value": 24,    "unit": "count", "source": "assumption: DeepEP's normal kernels use ~24 SMs for communication"},
    "link_bandwidth":         {"value": 145.3, "unit": "GB/s",  "source": "calibrated: epx sim calibrate --hardware h800-deepep (Nelder-Mead on the 4 calibration rows: normal EP8/16 with the chunked relay dispatch and combine, low-latency EP8/16 per selection on grouped:8, seed 1; started from the previous fit); published: NVLink ~160 GB/s per GPU"},
    "link_latency":           {"value": 2060,  "unit": "ns",    "source": "calibrated: epx sim calibrate --hardware h800-deepep (Nelder-Mead on the 4 calibration rows: normal EP8/16 with the chunked relay dispatch and combine, low-latency EP8/16 per selection on grouped:8, seed 1; started from the previous fit); a GPU-initiated NVLink put and its flag: ~1-3 us"},
    "frame_crossing_latency": {"value": 0,     "unit": "ns",    "source": "assumption: no frames"},
    "local_latency":          {"value": 200,   "unit": "ns",    "source": "assumption: write into own HBM"},
    "chunk_bytes":            {"value": 16384, "unit": "bytes", "source": "assumption: port arbitration granularity"},
    "queue_wr_time":          {"value": 5,     "unit": "ns",    "source": "assumption: work-request build per put"},
    "doorbell":               {"value": 10,    "unit": "ns",    "source": "assumption: an NVLink put is the SMs' stores, no doorbell (the NIC's per-message cost is scaleout_wr_time)"},
    "put_issue":              {"value": 50,    "unit": "ns",    "source": "assumption: address computation per put on one SM"},
    "signal_issue":           {"value": 50,    "unit": "ns",    "source": "assumption: like put_issue"},
    "quiet_latency":          {"value": 1000,  "unit": "ns",    "source": "assumption: completion round trip"},
    "poll_latency":           {"value": 100,   "unit": "ns",    "source": "assumption: flag polling interval"},
    "barrier_base":           {"value": 2000,  "unit": "ns",    "source": "assumption"},
    "barrier_per_log2":       {"value": 1000,  "unit": "ns",    "source": "assumption"},
    "launch_init":            {"value": 13470, "unit": "ns",    "source": "calibrated: epx sim calibrate --hardware h800-deepep (Nelder-Mead on the 4 calibration rows: normal EP8/16 with the chunked relay dispatch and combine, low-latency EP8/16 per selection on grouped:8, seed 1; started from the previous fit); more than a launch: it carries fixed costs of DeepEP's low-latency kernels that epx's engine does not have (docs/sim.md §8)"},
    "memory_bandwidth":       {"value": 3000,  "unit": "GB/s",  "source": "published: H800 HBM3 3.35 TB/s; assumption: ~90 % reachable"},
    "reduce_bandwidth":       {"value": 4324,  "unit": "GB/s",  "source": "calibrated: epx sim calibrate --hardware h800-deepep (Nelder-Mead on the 4 calibration rows: normal EP8/16 with the chunked relay dispatch and combine, low-latency EP8/16 per selection on grouped:8, seed 1; started from the previous fit)"},
    "combine_peer_release":   {"value": 0,     "unit": "ns",    "source": "assumption: not modelled (combine_handback 0)"},
    "plan_per_slot":          {"value": 0.05,  "unit": "ns",    "source": "assumption: the SMs scan S*K slots"},
    "plan_per_count":         {"value": 0.02,  "unit": "ns",    "source": "assumption: prefix sums over P*(P+E) counts"},
    "dense_scan_per_cell":    {"value": 0.05,  "unit": "ns",    "source": "assumption: a dense [S,P] bool table"},
    "payload_limit_low":      {"value": 50,    "unit": "GB/s",  "source": "published: one CX7 NIC ~50 GB/s per GPU (the scale-out limit)"},
    "payload_limit_high":     {"value": 160,   "unit": "GB/s",  "source": "published: NVLink ~160 GB/s per GPU (the scale-up limit)"},
    "scaleout_bandwidth":     {"value": 50,    "unit": "GB/s",  "source": "published: one ConnectX-7 400 Gb/s NIC ~50 GB/s per GPU (not fitted: a fit put it above the line rate)"},
    "scaleout_latency":       {"value": 3233, "unit": "ns",    "source": "calibrated: epx sim calibrate --hardware h800-deepep (Nelder-Mead on the 4 calibration rows: normal EP8/16 with the chunked relay dispatch and combine, low-latency EP8/16 per selection on grouped:8, seed 1; started from the previous fit)"},
    "scaleout_wr_time":       {"value": 6.90, "unit": "ns",    "source": "calibrated: epx sim calibrate --hardware h800-deepep (Nelder-Mead on the 4 calibration rows: normal EP8/16 with the chunked relay dispatch and combine, low-latency EP8/16 per selection on grouped:8, seed 1; started from the previous fit); the NIC's cost per message (a CX7 posts ~150-200 M messages/s)"},
    "local_copy_bandwidth":   {"value": 1500,  "unit": "GB/s",  "source": "assumption: SM copy inside HBM (read + write)"},
    "combine_handback":       {"value": 0,     "unit": "count", "source": "assumption: DeepEP's combines release their buffers as they go (no serial per-peer hand-back)"},
    "scaleup_share_with_nic": {"value": 0.7845, "unit": "ratio", "source": "calibrated: epx sim calibrate --hardware h800-deepep (Nelder-Mead on the 4 calibration rows: normal EP8/16 with the chunked relay dispatch and combine, low-latency EP8/16 per selection on grouped:8, seed 1; started from the previous fit); mechanism: DeepEP's internode kernels split their SMs between fixed roles (RDMA senders, NVLink forwarders / senders, receivers), so a GPU whose kernel also drives its NIC pushes NVLink with a share of the SMs its intranode kernels use for it (docs/sim.md §8)"}
  },
  "calibrate": ["link_bandwidth", "link_latency", "scaleout_latency", "scaleout_wr_time", "launch_init", "reduce_bandwidth", "scaleup_share_with_nic"],
  "published": [
    {"label": "normal kernels", "metric": "deepep",
     "source": "published: DeepEP docs/legacy.md (H800, CX7), 4096 tokens/rank, H 7168, top-4 groups / top-8 of 256, FP8 dispatch, BF16 combine; the calibration rows only",
     "run": {"tokens": 4096, "hidden": 7168, "topk": 8, "experts": 256, "groups": 8, "topk-groups": 4, "fp8": true,
             "layout": "compact", "schedule": "hierarchical", "combine-order": "node-first", "topology": "auto"},
     "ep": [8, 16, 32, 64],
     "points": [
       {"ep": 8,  "dispatch_gbps": 153, "combine_gbps": 158, "calibrate": true},
       {"ep": 16, "dispatch_gbps": 43,  "combine_gbps": 43,  "calibrate": true}]},
    {"label": "low-latency kernels", "metric": "deepep",
     "source": "published: DeepEP docs/legacy.md (H800, CX7), 128 tokens/rank, H 7168, top-8 of 256, FP8 dispatch, BF16 combine, every peer directly; the calibration rows only",
     "run": {"tokens": 128, "hidden": 7168, "topk": 8, "experts": 256, "groups": 0, "topk-groups": 0, "fp8": true,
             "layout": "expanded", "alignment": 1, "schedule": "grouped:8", "one-copy": true, "combine-replies": "selections",
             "topology": "auto"},
     "ep": [8, 16, 32, 64, 128, 256],
     "points": [
       {"ep": 8,  "dispatch_us": 77,  "dispatch_gbps": 98, "combine_us": 114, "combine_gbps": 127, "calibrate": true},
       {"ep": 16, "dispatch_us": 118, "dispatch_gbps": 63, "combine_us": 195, "combine_gbps": 74,  "calibrate": true}]}
  ]
})json";

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, where + ": " + what);
}

// A published figure: a number, or a range [lo, hi].
void read_range(const nlohmann::ordered_json& p, const char* key, double& lo, double& hi, const std::string& where) {
  if (!p.contains(key)) return;
  const auto& v = p[key];
  if (v.is_number()) {
    lo = hi = v.get<double>();
  } else if (v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number()) {
    lo = v[0].get<double>(), hi = v[1].get<double>();
  } else {
    bad(where, std::string("\"") + key + "\" must be a number or [lo, hi]");
  }
  if (!(lo > 0) || hi < lo) bad(where, std::string("\"") + key + "\" must be > 0 with lo <= hi");
}

PublishedSeries read_series(const nlohmann::ordered_json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("label") || !j.contains("metric") || !j.contains("run") || !j["run"].is_object() ||
      !j.contains("ep") || !j["ep"].is_array())
    bad(where, "a published series needs \"label\", \"metric\", \"run\" {flag: value} and \"ep\" [sizes]");
  PublishedSeries s;
  s.label = j["label"].get<std::string>();
  s.metric = j["metric"].get<std::string>();
  s.source = j.value("source", "");
  const std::string at = where + ", published series '" + s.label + "'";
  if (s.metric != "epx" && s.metric != "deepep") bad(at, "metric must be \"epx\" or \"deepep\", got \"" + s.metric + "\"");
  for (const auto& [k, v] : j["run"].items())
    s.run.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
  for (const auto& e : j["ep"]) s.ep.push_back(e.get<int>());
  for (const auto& p : j.value("points", nlohmann::ordered_json::array())) {
    PublishedPoint pt;
    pt.ep = p.value("ep", 0);
    if (std::find(s.ep.begin(), s.ep.end(), pt.ep) == s.ep.end())
      bad(at, "a point at EP" + std::to_string(pt.ep) + " is not among the series' \"ep\"");
    read_range(p, "dispatch_gbps", pt.dispatch_lo, pt.dispatch_hi, at);
    read_range(p, "combine_gbps", pt.combine_lo, pt.combine_hi, at);
    pt.dispatch_us = p.value("dispatch_us", 0.0);
    pt.combine_us = p.value("combine_us", 0.0);
    pt.calibrate = p.value("calibrate", false);
    if (pt.dispatch_hi <= 0 || pt.combine_hi <= 0) bad(at, "a point needs dispatch_gbps and combine_gbps");
    s.points.push_back(pt);
  }
  return s;
}

nlohmann::ordered_json series_json(const PublishedSeries& s) {
  nlohmann::ordered_json j;
  j["label"] = s.label;
  j["metric"] = s.metric;
  j["source"] = s.source;
  nlohmann::ordered_json run = nlohmann::ordered_json::object();
  for (const auto& [k, v] : s.run) run[k] = v;
  j["run"] = run;
  j["ep"] = s.ep;
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (const PublishedPoint& p : s.points) {
    nlohmann::ordered_json q;
    q["ep"] = p.ep;
    q["dispatch_gbps"] = {p.dispatch_lo, p.dispatch_hi};
    q["combine_gbps"] = {p.combine_lo, p.combine_hi};
    if (p.dispatch_us > 0) q["dispatch_us"] = p.dispatch_us;
    if (p.combine_us > 0) q["combine_us"] = p.combine_us;
    q["calibrate"] = p.calibrate;
    points.push_back(q);
  }
  j["points"] = points;
  return j;
}

void refresh(HardwareModel& m) {
  auto v = [&](const char* n) { return m.get(n); };
  auto ns = [&](const char* n) { return Nanoseconds{v(n)}; };
  m.frames = static_cast<int>(v("frames"));
  m.ranks_per_frame = static_cast<int>(v("ranks_per_frame"));
  m.workers_per_rank = static_cast<int>(v("workers_per_rank"));
  m.link_bandwidth = GBps{v("link_bandwidth")};
  m.link_latency = ns("link_latency");
  m.frame_crossing_latency = ns("frame_crossing_latency");
  m.local_latency = ns("local_latency");
  m.chunk_bytes = Bytes{static_cast<std::uint64_t>(v("chunk_bytes"))};
  m.queue_wr_time = ns("queue_wr_time");
  m.doorbell = ns("doorbell");
  m.put_issue = ns("put_issue");
  m.signal_issue = ns("signal_issue");
  m.quiet_latency = ns("quiet_latency");
  m.poll_latency = ns("poll_latency");
  m.barrier_base = ns("barrier_base");
  m.barrier_per_log2 = ns("barrier_per_log2");
  m.launch_init = ns("launch_init");
  m.memory_bandwidth = GBps{v("memory_bandwidth")};
  m.reduce_bandwidth = GBps{v("reduce_bandwidth")};
  m.combine_peer_release = ns("combine_peer_release");
  m.plan_per_slot = ns("plan_per_slot");
  m.plan_per_count = ns("plan_per_count");
  m.dense_scan_per_cell = ns("dense_scan_per_cell");
  m.payload_limit_low = GBps{v("payload_limit_low")};
  m.payload_limit_high = GBps{v("payload_limit_high")};
  m.scaleout_bandwidth = GBps{v("scaleout_bandwidth")};
  m.scaleout_latency = ns("scaleout_latency");
  m.scaleout_wr_time = ns("scaleout_wr_time");
  m.combine_handback = v("combine_handback") != 0;
  m.scaleup_share_with_nic = v("scaleup_share_with_nic");
  m.local_copy_bandwidth = GBps{v("local_copy_bandwidth") > 0 ? v("local_copy_bandwidth") : v("link_bandwidth")};
}

}  // namespace

Picoseconds HardwareModel::barrier_cost(int ranks) const {
  const double l = ranks > 1 ? std::log2(static_cast<double>(ranks)) : 0.0;
  return Nanoseconds{barrier_base.ns + barrier_per_log2.ns * l}.to_ps();
}

bool HardwareModel::scaleout(const RankPlace& src, const RankPlace& dst) const {
  return scaleout_bandwidth.gbps > 0 && src.server != dst.server;
}

Picoseconds HardwareModel::latency(int src, int dst, const RankPlace& a, const RankPlace& b) const {
  if (src == dst) return local_latency.to_ps();
  if (scaleout(a, b)) return scaleout_latency.to_ps();
  Picoseconds t = link_latency.to_ps();
  if (a.frame != b.frame) t += frame_crossing_latency.to_ps();
  return t;
}

HardwareModel::PutCosts HardwareModel::put_costs() const {
  const PutCosts up{doorbell.ns + put_issue.ns / std::max(1, workers_per_rank) + queue_wr_time.ns, link_bandwidth.gbps};
  if (scaleout_bandwidth.gbps <= 0) return up;
  const PutCosts out{up.overhead_ns + scaleout_wr_time.ns, scaleout_bandwidth.gbps};
  return out.overhead_ns * out.gbps > up.overhead_ns * up.gbps ? out : up;  // the tier that needs the larger puts
}

double HardwareModel::get(const std::string& name) const {
  for (const HardwareParam& p : params)
    if (p.name == name) return p.value;
  throw Error(ErrorCode::kInvalidArgument, "hardware model '" + this->name + "' has no parameter '" + name + "'");
}

void HardwareModel::set(const std::string& name, double value, const std::string& source) {
  for (HardwareParam& p : params)
    if (p.name == name) {
      p.value = value;
      p.source = source;
      refresh(*this);
      return;
    }
  throw Error(ErrorCode::kInvalidArgument, "hardware model '" + this->name + "' has no parameter '" + name + "'");
}

std::vector<std::string> builtin_hardware_names() { return {"ascend950-supernode", "h800-deepep"}; }

std::string builtin_hardware_json(const std::string& name) {
  if (name == "ascend950-supernode") return kAscend950;
  if (name == "h800-deepep") return kH800;
  throw Error(ErrorCode::kInvalidArgument, "unknown built-in hardware profile '" + name + "' (known: ascend950-supernode, h800-deepep)");
}

HardwareModel parse_hardware_json(const std::string& text, const std::string& where) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    bad(where, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("parameters") || !j["parameters"].is_object())
    bad(where, "expected an object with \"parameters\": {name: {value, unit, source}}");
  HardwareModel m;
  m.name = j.value("name", where);
  m.description = j.value("description", "");
  const auto& ps = j["parameters"];
  for (const Spec& s : kSpecs) {
    if (!ps.contains(s.name) && s.default_source) {
      m.params.push_back({s.name, s.default_value, s.unit, s.default_source});
      continue;
    }
    if (!ps.contains(s.name)) bad(where, std::string("parameter '") + s.name + "' is missing (unit " + s.unit + ")");
    const auto& p = ps[s.name];
    if (!p.is_object() || !p.contains("value") || !p["value"].is_number() || !p.contains("unit") ||
        !p["unit"].is_string() || !p.contains("source") || !p["source"].is_string())
      bad(where, std::string("parameter '") + s.name + "' must be {\"value\": number, \"unit\": \"" + s.unit +
                     "\", \"source\": \"...\"}");
    const std::string unit = p["unit"].get<std::string>();
    if (unit != s.unit) bad(where, std::string("parameter '") + s.name + "' has unit '" + unit + "', expected '" + s.unit + "'");
    const double value = p["value"].get<double>();
    if (!(value >= 0) || !std::isfinite(value)) bad(where, std::string("parameter '") + s.name + "' must be a finite number >= 0");
    m.params.push_back({s.name, value, unit, p["source"].get<std::string>()});
  }
  for (const auto& [name, p] : ps.items()) {
    bool known = false;
    for (const Spec& s : kSpecs) known = known || name == s.name;
    if (!known) bad(where, "unknown parameter '" + name + "'");
  }
  for (const auto& n : j.value("calibrate", nlohmann::ordered_json::array())) {
    const std::string name = n.get<std::string>();
    bool known = false;
    for (const Spec& sp : kSpecs) known = known || name == sp.name;
    if (!known) bad(where, "\"calibrate\" names an unknown parameter '" + name + "'");
    m.calibrate.push_back(name);
  }
  for (const auto& series : j.value("published", nlohmann::ordered_json::array())) m.published.push_back(read_series(series, where));
  refresh(m);
  if (m.frames < 1 || m.ranks_per_frame < 1 || m.workers_per_rank < 1 || m.chunk_bytes.n < 64)
    bad(where, "frames, ranks_per_frame, workers_per_rank must be >= 1 and chunk_bytes >= 64");
  if (m.link_bandwidth.gbps <= 0 || m.memory_bandwidth.gbps <= 0 || m.reduce_bandwidth.gbps <= 0)
    bad(where, "link_bandwidth, memory_bandwidth and reduce_bandwidth must be > 0");
  return m;
}

HardwareModel load_hardware(const std::string& name_or_file) {
  for (const std::string& n : builtin_hardware_names())
    if (n == name_or_file) return parse_hardware_json(builtin_hardware_json(n), n);
  std::ifstream in(name_or_file);
  if (!in)
    throw Error(ErrorCode::kInvalidArgument, "--hardware '" + name_or_file +
                                                 "' is neither a built-in profile (ascend950-supernode, h800-deepep) nor a readable file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hardware_json(ss.str(), name_or_file);
}

std::string to_json(const HardwareModel& m) {
  nlohmann::ordered_json j;
  j["name"] = m.name;
  j["description"] = m.description;
  nlohmann::ordered_json ps = nlohmann::ordered_json::object();
  for (const HardwareParam& p : m.params) ps[p.name] = {{"value", p.value}, {"unit", p.unit}, {"source", p.source}};
  j["parameters"] = ps;
  if (!m.calibrate.empty()) j["calibrate"] = m.calibrate;
  if (!m.published.empty()) {
    nlohmann::ordered_json pub = nlohmann::ordered_json::array();
    for (const PublishedSeries& s : m.published) pub.push_back(series_json(s));
    j["published"] = pub;
  }
  return j.dump(2);
}

}  // namespace epx::sim
