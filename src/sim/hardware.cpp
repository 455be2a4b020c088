// Hardware model: JSON with value / unit / source per parameter; the built-in profile.
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
};

// The calibrated values come from `epx sim calibrate` (src/sim/runner/calibrate.cpp); the
// calibration shape and the fitted points are in docs/sim.md.
constexpr const char* kAscend950 = R"json({
  "name": "ascend950-supernode",
  "description": "Ascend 950DT supernode: netlayer-1 Clos (every pair of ranks directly reachable), 2 frames x 64 ranks, 64 vector workers per rank",
  "parameters": {
    "frames":                 {"value": 2,     "unit": "count", "source": "published: DeepEP-Ascend notes, 2 frames x 64 ranks"},
    "ranks_per_frame":        {"value": 64,    "unit": "count", "source": "published: DeepEP-Ascend notes"},
    "workers_per_rank":       {"value": 64,    "unit": "count", "source": "published: 64 vector workers per rank"},
    "link_bandwidth":         {"value": 337.1, "unit": "GB/s",  "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back, issue #18)"},
    "link_latency":           {"value": 1500,  "unit": "ns",    "source": "assumption: one netlayer-1 Clos hop incl. switch"},
    "frame_crossing_latency": {"value": 500,   "unit": "ns",    "source": "assumption: extra switch stage between frames"},
    "local_latency":          {"value": 200,   "unit": "ns",    "source": "assumption: write into own HBM window"},
    "chunk_bytes":            {"value": 65536, "unit": "bytes", "source": "assumption: port arbitration granularity"},
    "queue_wr_time":          {"value": 4.457, "unit": "ns",    "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back, issue #18)"},
    "doorbell":               {"value": 100,   "unit": "ns",    "source": "assumption: one MMIO doorbell per batch of puts"},
    "put_issue":              {"value": 50,    "unit": "ns",    "source": "assumption: descriptor build per put on one vector worker"},
    "signal_issue":           {"value": 50,    "unit": "ns",    "source": "assumption: like put_issue"},
    "quiet_latency":          {"value": 1000,  "unit": "ns",    "source": "assumption: completion round trip"},
    "poll_latency":           {"value": 100,   "unit": "ns",    "source": "assumption: flag polling interval"},
    "barrier_base":           {"value": 1000,  "unit": "ns",    "source": "published: barrier ~4 us at 8 ranks (split base/slope is an assumption)"},
    "barrier_per_log2":       {"value": 1000,  "unit": "ns",    "source": "published: barrier ~4 us at 8 ranks (split base/slope is an assumption)"},
    "launch_init":            {"value": 1900,  "unit": "ns",    "source": "published: kernel launch + init ~1.9 us"},
    "memory_bandwidth":       {"value": 2645,  "unit": "GB/s",  "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back, issue #18)"},
    "reduce_bandwidth":       {"value": 1201,  "unit": "GB/s",  "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; refitted with combine's per-peer hand-back, issue #18)"},
    "combine_peer_release":   {"value": 501,   "unit": "ns",    "source": "calibrated: epx sim calibrate (Nelder-Mead, EP8/16/32 dispatch+combine, seed 1; issue #18) fitted 3501 ns per peer for bookkeeping + round trip; at EP8/16/32 every peer is in frame 0, so the round trip is 2 x link_latency = 3000 ns and this is the rest"},
    "plan_per_slot":          {"value": 0.05,  "unit": "ns",    "source": "assumption: 64 workers scan S*K slots (~3 ns per slot per worker)"},
    "plan_per_count":         {"value": 0.02,  "unit": "ns",    "source": "assumption: 64 workers, prefix sums over P*(P+E) counts"},
    "dense_scan_per_cell":    {"value": 0.05,  "unit": "ns",    "source": "assumption: 64 workers scan a dense [S,P] bool table"},
    "payload_limit_low":      {"value": 350,   "unit": "GB/s",  "source": "published: physical payload limit estimate, low"},
    "payload_limit_high":     {"value": 420,   "unit": "GB/s",  "source": "published: physical payload limit estimate, high"}
  }
})json";

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, where + ": " + what);
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
}

}  // namespace

Picoseconds HardwareModel::barrier_cost(int ranks) const {
  const double l = ranks > 1 ? std::log2(static_cast<double>(ranks)) : 0.0;
  return Nanoseconds{barrier_base.ns + barrier_per_log2.ns * l}.to_ps();
}

Picoseconds HardwareModel::latency(int src, int dst, int src_frame, int dst_frame) const {
  if (src == dst) return local_latency.to_ps();
  Picoseconds t = link_latency.to_ps();
  if (src_frame != dst_frame) t += frame_crossing_latency.to_ps();
  return t;
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

std::vector<std::string> builtin_hardware_names() { return {"ascend950-supernode"}; }

std::string builtin_hardware_json(const std::string& name) {
  if (name == "ascend950-supernode") return kAscend950;
  throw Error(ErrorCode::kInvalidArgument, "unknown built-in hardware profile '" + name + "' (known: ascend950-supernode)");
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
                                                 "' is neither a built-in profile (ascend950-supernode) nor a readable file");
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
  return j.dump(2);
}

}  // namespace epx::sim
