// Fuzz target: a whole replay input set (meta.json + rank<r>/*.npy) through `epx replay`
// on the threads transport: every header check, the memory check, the engine's input
// validation, dispatch and combine. Small shapes only (meta.json with more than 4 ranks or
// a hidden above 1024 is refused by the fuzz target itself, to keep executions fast).
#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>

#include "commands.hpp"
#include "epx/error.hpp"
#include "fuzz_support.hpp"
#include "epx/io/replay.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = epx::fuzz::make_input_dir(data, size);
  try {
    const epx::tools::ReplayMeta m = epx::tools::read_replay_meta(in);
    if (m.num_ranks > 4 || m.hidden > 1024 || m.num_experts > 64 || m.max_tokens_per_rank > 256) return 0;
    epx::tools::check_replay_inputs(in, m, false);
    static std::FILE* quiet = std::freopen("/dev/null", "w", stdout);  // the replay's summary line
    (void)quiet;
    CLI::App app;
    epx::tools::add_replay_command(app);
    const std::string out = (epx::fuzz::work_dir() / "out").string();
    app.parse(std::vector<std::string>{"2000", "--timeout-ms", "threads", "--transport", out, "--out", in.string(), "--in", "replay"});
  } catch (const epx::Error&) {
  } catch (const CLI::Error&) {
  }
  return 0;
}
