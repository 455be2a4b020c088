#include "epx/bench/dataplane_options.hpp"

#include <charconv>
#include <limits>

#include "epx/error.hpp"
#include "epx/schedule.hpp"
#include "epx/spi/support.hpp"
#include "epx/topology.hpp"

namespace epx::tools {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

}  // namespace

const std::vector<std::string>& dataplane_option_names() {
  static const std::vector<std::string> names = {"topology", "schedule", "queues", "queue-split", "aggregate", "protocol",
                                                     "send-policy", "combine-order", "combine-replies", "replies-first-max",
                                                     "stream-min-call", "relay-chunk", "path"};
  return names;
}

std::size_t parse_byte_size(const std::string& text) {
  const auto fail = [&]() -> std::size_t {
    bad("'" + text + "' is not a byte count (an integer >= 0, optionally with K, M or G = 2^10, 2^20, 2^30)");
  };
  if (text.empty()) return fail();
  std::string_view digits(text);
  int shift = 0;
  switch (digits.back()) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    default: break;
  }
  if (shift) digits.remove_suffix(1);
  unsigned long long n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) return fail();
  if (n > (std::numeric_limits<std::size_t>::max() >> shift)) return fail();
  return static_cast<std::size_t>(n) << shift;
}

SendPolicy parse_send_policy(const std::string& text) {
  if (text == "auto") return {SendPolicyKind::kAuto, 0};
  if (text == "whole") return {SendPolicyKind::kWhole, 0};
  if (text.rfind("block:", 0) == 0) {
    const std::size_t bytes = parse_byte_size(text.substr(6));
    if (bytes > 0) return {SendPolicyKind::kBlock, bytes};
  }
  bad("'" + text + "' is not one of: auto, whole, block:BYTES (BYTES > 0, K/M/G suffixes)");
}

std::string to_string(const SendPolicy& p) {
  switch (p.kind) {
    case SendPolicyKind::kAuto: return "auto";
    case SendPolicyKind::kWhole: return "whole";
    case SendPolicyKind::kBlock: return "block:" + byte_size_text(p.block_bytes);
  }
  return "?";
}

std::string relay_chunk_text(std::size_t bytes) {
  return bytes == DataPlaneOptions::kRelayChunkAuto ? "auto" : byte_size_text(bytes);
}

std::string byte_size_text(std::size_t bytes) {
  for (const auto& [shift, suffix] : {std::pair{30, "G"}, std::pair{20, "M"}, std::pair{10, "K"}}) {
    const std::size_t unit = std::size_t{1} << shift;
    if (bytes > 0 && bytes % unit == 0) return std::to_string(bytes / unit) + suffix;
  }
  return std::to_string(bytes);
}

void set_dataplane_option(DataPlaneOptions& d, const std::string& name, const std::string& value) {
  try {
    if (name == "topology") {
      if (value.empty()) bad("empty (builtin:flat, builtin:servers:N, builtin:supernode128 or a JSON file)");
      d.topology = value;  // checked against P by check_dataplane
    } else if (name == "schedule") {
      d.schedule = parse_schedule(value);
    } else if (name == "queues") {
      if (value != "1" && value != "2" && value != "4") bad("'" + value + "' is not one of: 1, 2, 4");
      d.queues = value[0] - '0';
    } else if (name == "queue-split") {
      d.queue_split = parse_queue_split(value);
    } else if (name == "aggregate") {
      d.aggregate_bytes = parse_byte_size(value);
    } else if (name == "protocol") {
      d.protocol = parse_protocol(value);
    } else if (name == "send-policy") {
      d.send_policy = parse_send_policy(value);
    } else if (name == "combine-order") {
      d.combine_order = parse_combine_order(value);
    } else if (name == "combine-replies") {
      d.combine_replies = parse_combine_replies(value);
    } else if (name == "replies-first-max") {
      d.replies_first_max_bytes = parse_byte_size(value);
    } else if (name == "stream-min-call") {
      d.stream_min_call_bytes = parse_byte_size(value);
    } else if (name == "relay-chunk") {
      d.relay_chunk_bytes = value == "auto" ? DataPlaneOptions::kRelayChunkAuto : parse_byte_size(value);
    } else if (name == "path") {
      if (value.empty()) bad("empty (auto, or a registered base path: direct, relay, ring, ...)");
      d.path = value == "auto" ? std::string() : value;  // the name is checked against the registry by check_dataplane
    } else {
      bad("unknown data-plane option '" + name + "'");
    }
  } catch (const Error& e) {
    const std::string flag = "--" + name;
    const std::string what = e.what();
    throw Error(e.code(), what.rfind(flag, 0) == 0 ? what : flag + ": " + what);
  }
}

std::string dataplane_option_value(const DataPlaneOptions& d, const std::string& name) {
  if (name == "topology") return d.topology;
  if (name == "schedule") return to_string(d.schedule);
  if (name == "queues") return std::to_string(d.queues);
  if (name == "queue-split") return to_string(d.queue_split);
  if (name == "aggregate") return byte_size_text(d.aggregate_bytes);
  if (name == "protocol") return to_string(d.protocol);
  if (name == "send-policy") return to_string(d.send_policy);
  if (name == "combine-order") return to_string(d.combine_order);
  if (name == "combine-replies") return to_string(d.combine_replies);
  if (name == "replies-first-max") return byte_size_text(d.replies_first_max_bytes);
  if (name == "stream-min-call") return byte_size_text(d.stream_min_call_bytes);
  if (name == "relay-chunk") return relay_chunk_text(d.relay_chunk_bytes);
  if (name == "path") return d.path.empty() ? "auto" : d.path;
  bad("unknown data-plane option '" + name + "'");
}

void check_dataplane(const DataPlaneOptions& d, int ranks) {
  if (d.queue_split.kind == QueueSplitKind::kRatio && static_cast<int>(d.queue_split.ratio.size()) != d.queues)
    bad("--queue-split " + to_string(d.queue_split) + " has " + std::to_string(d.queue_split.ratio.size()) +
        " parts but --queues is " + std::to_string(d.queues) + " (a ratio needs one part per queue)");
  if (d.combine_order == CombineOrder::kNodeFirst && d.schedule.kind != ScheduleKind::kHierarchical)
    bad("--combine-order node-first sums a token's partials at the relays of --schedule hierarchical (the schedule is " +
        to_string(d.schedule) + ")");
  if (d.combine_replies == CombineReplies::kSelections && (d.schedule.kind == ScheduleKind::kHierarchical || d.protocol == Protocol::kFlag))
    bad("--combine-replies selections goes straight to the sources: not with --schedule hierarchical or --protocol flag");
  if (std::string why = spi::refuse_path_name(d.path); !why.empty()) bad("--path: " + why);
  if (ranks <= 0) return;
  // The table and the schedule the engine will build, so a mismatch fails before any rank starts.
  Topology topology;
  try {
    topology = load_topology(d.topology, ranks);
  } catch (const Error& e) {
    bad(std::string("--topology: ") + e.what());
  }
  try {
    for (int r = 0; r < ranks; ++r) peer_rounds(d.schedule, topology, r);
  } catch (const Error& e) {
    bad("--schedule " + to_string(d.schedule) + ": " + e.what());
  }
}

std::string describe_dataplane(const DataPlaneOptions& d) {
  return "topology " + d.topology + ", schedule " + to_string(d.schedule) + ", " + std::to_string(d.queues) +
         (d.queues == 1 ? " queue" : " queues") + " (split " + to_string(d.queue_split) + "), aggregate " +
         (d.aggregate_bytes == 0 ? std::string("off") : byte_size_text(d.aggregate_bytes)) + ", protocol " + to_string(d.protocol) +
         ", send policy " + to_string(d.send_policy) +
         (d.combine_order == CombineOrder::kFlat ? std::string() : std::string(", combine order ") + to_string(d.combine_order)) +
         (d.combine_replies == CombineReplies::kPartials ? std::string() : std::string(", combine replies ") + to_string(d.combine_replies)) +
         (d.replies_first_max_bytes == DataPlaneOptions{}.replies_first_max_bytes
              ? std::string()
              : ", replies first up to " + (d.replies_first_max_bytes == 0 ? std::string("never (with a pool)")
                                                                            : byte_size_text(d.replies_first_max_bytes))) +
         (d.stream_min_call_bytes == DataPlaneOptions{}.stream_min_call_bytes
              ? std::string()
              : ", streaming stores from " + (d.stream_min_call_bytes == 0 ? std::string("any call")
                                                                           : byte_size_text(d.stream_min_call_bytes) + " per call")) +
         (d.relay_chunk_bytes == DataPlaneOptions::kRelayChunkAuto
              ? std::string()
              : ", relay chunks " + (d.relay_chunk_bytes == 0 ? std::string("off") : byte_size_text(d.relay_chunk_bytes))) +
         (d.path.empty() ? std::string() : ", path " + d.path);
}

nlohmann::ordered_json dataplane_json(const DataPlaneOptions& d) {
  nlohmann::ordered_json j;
  j["topology"] = d.topology;
  j["schedule"] = to_string(d.schedule);
  j["queues"] = d.queues;
  j["queue_split"] = to_string(d.queue_split);
  j["aggregate_bytes"] = d.aggregate_bytes;
  j["protocol"] = to_string(d.protocol);
  j["send_policy"] = to_string(d.send_policy);
  j["combine_order"] = to_string(d.combine_order);
  j["combine_replies"] = to_string(d.combine_replies);
  j["replies_first_max_bytes"] = d.replies_first_max_bytes;
  j["stream_min_call_bytes"] = d.stream_min_call_bytes;
  j["relay_chunk"] = relay_chunk_text(d.relay_chunk_bytes);
  j["path"] = d.path.empty() ? "auto" : d.path;
  return j;
}

}  // namespace epx::tools
