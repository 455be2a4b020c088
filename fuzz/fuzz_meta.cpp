// Fuzz target: meta.json of a replay input set (read_replay_meta).
#include <cstddef>
#include <cstdint>

#include "epx/error.hpp"
#include "fuzz_support.hpp"
#include "epx/io/replay.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto dir = epx::fuzz::work_dir() / "meta";
  std::filesystem::create_directories(dir);
  epx::fuzz::write_file(dir / "meta.json", {reinterpret_cast<const char*>(data), size});
  try {
    const epx::tools::ReplayMeta m = epx::tools::read_replay_meta(dir);
    if (m.num_ranks < 1 || m.hidden < 1 || m.num_topk < 1 || m.num_experts < 1 || m.max_tokens_per_rank < 0) __builtin_trap();
  } catch (const epx::Error&) {
  }
  return 0;
}
