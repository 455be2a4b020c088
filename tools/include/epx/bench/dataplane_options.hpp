// The data-plane options on the command line (`epx bench`, `epx bench --sweep`, `epx replay`):
// one text form per option, shared by the flags and the sweep axes, so a value means the
// same thing wherever it is typed and every error names the option it came from.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epx/dataplane.hpp"

namespace epx::tools {

/// The option names without "--", in DataPlaneOptions order: topology, schedule, queues,
/// queue-split, aggregate, protocol, send-policy, combine-order, combine-replies, replies-first-max,
/// stream-min-call, relay-chunk, path.
const std::vector<std::string>& dataplane_option_names();

/// Sets the option `name` (one of dataplane_option_names()) of `d` from its text.
/// Throws epx::Error(kInvalidArgument) "--<name>: <why>" for a value that does not parse.
/// Only the value itself is checked; how it combines with the others: check_dataplane.
void set_dataplane_option(DataPlaneOptions& d, const std::string& name, const std::string& value);

/// The canonical text of option `name` of `d` (parses back to the same value).
std::string dataplane_option_value(const DataPlaneOptions& d, const std::string& name);

/// "0", "4096", "64K", "1M", "2G" (K/M/G = 2^10/2^20/2^30, either case) -> bytes; throws
/// kInvalidArgument otherwise.
std::size_t parse_byte_size(const std::string& text);
/// The shortest exact form: 1048576 -> "1M", 65536 -> "64K", 1000 -> "1000".
std::string byte_size_text(std::size_t bytes);
/// --relay-chunk's text: "auto" (DataPlaneOptions::kRelayChunkAuto) or byte_size_text.
std::string relay_chunk_text(std::size_t bytes);

/// "auto" | "whole" | "block:BYTES" (parse_byte_size, > 0) -> SendPolicy; throws
/// kInvalidArgument listing the accepted forms. to_string gives the canonical text.
SendPolicy parse_send_policy(const std::string& text);
std::string to_string(const SendPolicy& policy);

/// The options against each other and the shape, before anything runs: a ratio split needs
/// one part per queue; grouped:W needs W to divide the ranks; the builtin topologies
/// (epx/topology.hpp) must fit the ranks, and hierarchical needs more than one server;
/// combine order node-first needs the hierarchical schedule; a path name must be a registered
/// base path (spi::refuse_path_name; whether it takes the config is the engine's check).
/// Throws kInvalidArgument naming the options involved. ranks == 0 (not known yet): only the
/// checks that do not need P. A topology file is checked by the engine (load_topology)
/// when the Buffer is made.
void check_dataplane(const DataPlaneOptions& d, int ranks);

/// "topology builtin:flat, schedule rotated, 1 queue (split rr), aggregate 1M, protocol explicit,
/// send policy auto"
std::string describe_dataplane(const DataPlaneOptions& d);

/// {"topology", "schedule", "queues", "queue_split", "aggregate_bytes", "protocol", "send_policy", "combine_order",
/// "combine_replies", "replies_first_max_bytes", "stream_min_call_bytes", "relay_chunk", "path" ("auto": by the config)}
nlohmann::ordered_json dataplane_json(const DataPlaneOptions& d);

}  // namespace epx::tools
