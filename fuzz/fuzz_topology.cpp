// Fuzz target: topology files (parse_topology_json) and --topology specs (load_topology).
// Byte 0 picks the rank count (1..64); the rest is the JSON text, or with byte 0 odd also
// tried as a spec string ("builtin:servers:N", a path).
#include <cstddef>
#include <cstdint>
#include <string>

#include "epx/error.hpp"
#include "epx/topology.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int P = 1 + data[0] % 64;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const epx::Topology t = epx::parse_topology_json(text, "fuzz");
    const epx::Topology back = epx::parse_topology_json(epx::to_json(t), "round trip");
    if (back.ranks.size() != t.ranks.size()) __builtin_trap();
  } catch (const epx::Error&) {
  }
  const auto path = epx::fuzz::work_dir() / "topology.json";
  epx::fuzz::write_file(path, text);
  try {
    (void)epx::load_topology(path.string(), P);
  } catch (const epx::Error&) {
  }
  if (data[0] & 1 && text.size() < 64 && text.find('/') == std::string::npos) {
    try {
      (void)epx::load_topology(text, P);
    } catch (const epx::Error&) {
    }
  }
  return 0;
}
