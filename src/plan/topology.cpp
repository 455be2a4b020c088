// Topology tables: the builtins, the JSON file format and its checks.
#include "epx/topology.hpp"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epx/error.hpp"
#include "epx/spi/resources.hpp"

namespace epx {

namespace {

using nlohmann::json;

constexpr const char* kAcceptedSpecs =
    "builtin:flat, builtin:servers:N, builtin:supernode128 or a path to a JSON topology file";

// Every message starts with the source so a user with several tables knows which is wrong.
[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "topology '" + where + "': " + what);
}

Topology flat(int p) {
  Topology t{"builtin:flat", std::vector<RankPlace>(static_cast<std::size_t>(p))};
  for (int r = 0; r < p; ++r) {
    auto& x = t.ranks[static_cast<std::size_t>(r)];
    x.column = r;
    x.lane = r;
  }
  return t;
}

Topology servers(const std::string& spec, int p) {
  // std::from_chars rejects a sign and trailing text, so "servers:+4" or "servers:4x" fail.
  const std::string digits = spec.substr(std::string("builtin:servers:").size());
  int n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size() || n < 1)
    fail(spec, "expected builtin:servers:N with N a positive integer dividing the job's " + std::to_string(p) +
                   " ranks");
  if (p % n != 0)
    fail(spec, "servers of " + std::to_string(n) + " ranks do not divide the job's " + std::to_string(p) +
                   " ranks; expected N dividing " + std::to_string(p));
  Topology t{spec, std::vector<RankPlace>(static_cast<std::size_t>(p))};
  for (int r = 0; r < p; ++r) {
    auto& x = t.ranks[static_cast<std::size_t>(r)];
    x.server = r / n;
    x.lane = r % n;
    x.row = x.server;
    x.column = x.lane;
    x.group = x.server;
  }
  return t;
}

Topology supernode128(int p) {
  if (p != 128)
    fail("builtin:supernode128", "builtin:supernode128 describes 128 ranks, the job has " + std::to_string(p));
  Topology t{"builtin:supernode128", std::vector<RankPlace>(128)};
  for (int r = 0; r < 128; ++r) {
    auto& x = t.ranks[static_cast<std::size_t>(r)];
    x.frame = r / 64;
    x.row = (r % 64) / 8;
    x.column = r % 8;
    x.server = r / 8;  // a row of 8 is a server
    x.lane = x.column;
    x.group = x.frame * 4 + (x.row / 4) * 2 + x.column / 4;  // 4x4 blocks, 4 per frame
  }
  return t;
}

std::string read_file(const std::string& path) {
  try {
    return detail::read_file_bounded(path, detail::kMaxTextFileBytes, "topology file");
  } catch (const Error& e) {
    fail(path, std::string(e.what()) + "; expected " + kAcceptedSpecs);
  }
}

// A non-negative int field of one rank entry; `required` false means absent -> `fallback`.
int field(const json& entry, const char* key, std::size_t index, const std::string& where, bool required,
          int fallback) {
  const std::string at = "ranks[" + std::to_string(index) + "]";
  const auto it = entry.find(key);
  if (it == entry.end()) {
    if (!required) return fallback;
    fail(where, at + " has no \"" + key + "\"; expected a non-negative integer");
  }
  if (!it->is_number_integer())
    fail(where, at + "." + key + " is " + it->dump() + "; expected a non-negative integer");
  const auto v = it->get<std::int64_t>();
  if (v < 0) fail(where, at + "." + key + " is negative (" + std::to_string(v) + "); expected a non-negative integer");
  if (v > std::numeric_limits<int>::max()) fail(where, at + "." + key + " is " + std::to_string(v) + ", too large");
  return static_cast<int>(v);
}

// A table of p entries names rank r >= p, so some rank below p is missing: name one.
[[noreturn]] void fail_out_of_range(const json& ranks, int r, const std::string& where) {
  const std::size_t p = ranks.size();
  std::vector<bool> listed(p, false);
  for (const json& other : ranks)
    if (const auto o = other.find("rank"); o != other.end() && o->is_number_unsigned() && o->get<std::uint64_t>() < p)
      listed[o->get<std::size_t>()] = true;
  std::size_t missing = 0;
  while (missing < p && listed[missing]) ++missing;
  fail(where, "rank " + std::to_string(r) + " is out of range and rank " + std::to_string(missing) +
                  " is missing; a table of " + std::to_string(p) + " entries must list ranks 0.." +
                  std::to_string(p - 1) + " once each");
}

}  // namespace

Topology load_topology(const std::string& spec, int num_ranks) {
  if (num_ranks < 1) fail(spec, "the job has " + std::to_string(num_ranks) + " ranks; expected at least 1");
  if (spec == "builtin:flat") return flat(num_ranks);
  if (spec == "builtin:supernode128") return supernode128(num_ranks);
  if (spec.rfind("builtin:servers:", 0) == 0) return servers(spec, num_ranks);
  if (spec.rfind("builtin:", 0) == 0) fail(spec, std::string("unknown builtin topology; expected ") + kAcceptedSpecs);

  Topology t = parse_topology_json(read_file(spec), spec);
  t.name = spec;  // a table loaded from a file is named by its path (the header's contract)
  if (t.num_ranks() != num_ranks)
    fail(spec, "the table describes " + std::to_string(t.num_ranks()) + " ranks, the job has " +
                   std::to_string(num_ranks));
  return t;
}

Topology parse_topology_json(const std::string& text, const std::string& where) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number no double holds (1E99999)
    fail(where, std::string("malformed JSON: ") + e.what());
  }
  if (!doc.is_object()) fail(where, "expected a JSON object {\"name\": ..., \"ranks\": [...]}");
  // Unknown keys are refused so that a typo ("colum") is not silently read as a default.
  for (const auto& [key, value] : doc.items())
    if (key != "name" && key != "ranks") fail(where, "unknown key \"" + key + "\"; expected \"name\" and \"ranks\"");

  Topology t;
  t.name = where;
  if (const auto it = doc.find("name"); it != doc.end()) {
    if (!it->is_string()) fail(where, "\"name\" is " + it->dump() + "; expected a string");
    t.name = it->get<std::string>();
  }
  const auto ranks = doc.find("ranks");
  if (ranks == doc.end() || !ranks->is_array() || ranks->empty())
    fail(where, "expected \"ranks\": a non-empty array of {\"rank\", \"server\", \"frame\", \"row\", \"column\", "
                "\"lane\"[, \"group\"]}");

  const std::size_t p = ranks->size();
  t.ranks.resize(p);
  std::vector<bool> seen(p, false);
  for (std::size_t i = 0; i < p; ++i) {
    const json& e = (*ranks)[i];
    if (!e.is_object()) fail(where, "ranks[" + std::to_string(i) + "] is not an object");
    for (const auto& [key, value] : e.items())
      if (key != "rank" && key != "server" && key != "frame" && key != "row" && key != "column" && key != "lane" &&
          key != "group")
        fail(where, "ranks[" + std::to_string(i) + "] has unknown key \"" + key +
                        "\"; expected rank, server, frame, row, column, lane, group");
    const int r = field(e, "rank", i, where, true, 0);
    if (static_cast<std::size_t>(r) >= p) fail_out_of_range(*ranks, r, where);
    if (seen[static_cast<std::size_t>(r)])
      fail(where, "rank " + std::to_string(r) + " is duplicated; expected ranks 0.." + std::to_string(p - 1) +
                      " once each");
    seen[static_cast<std::size_t>(r)] = true;
    RankPlace& x = t.ranks[static_cast<std::size_t>(r)];
    x.server = field(e, "server", i, where, true, 0);
    x.frame = field(e, "frame", i, where, true, 0);
    x.row = field(e, "row", i, where, true, 0);
    x.column = field(e, "column", i, where, true, 0);
    x.lane = field(e, "lane", i, where, true, 0);
    x.group = field(e, "group", i, where, false, x.server);  // default: the server
  }
  // p entries, each in [0, p) and none repeated, so every rank is present: nothing is missing.
  return t;
}

std::string to_json(const Topology& topology) {
  // One rank per line: a 128-rank table stays readable and diffable.
  std::string out = "{\"name\": " + json(topology.name).dump() + ",\n \"ranks\": [";
  for (int r = 0; r < topology.num_ranks(); ++r) {
    const RankPlace& x = topology.ranks[static_cast<std::size_t>(r)];
    out += (r ? ",\n  " : "\n  ");
    out += "{\"rank\": " + std::to_string(r) + ", \"server\": " + std::to_string(x.server) +
           ", \"frame\": " + std::to_string(x.frame) + ", \"row\": " + std::to_string(x.row) +
           ", \"column\": " + std::to_string(x.column) + ", \"lane\": " + std::to_string(x.lane) +
           ", \"group\": " + std::to_string(x.group) + "}";
  }
  out += "\n]}\n";
  return out;
}

}  // namespace epx
