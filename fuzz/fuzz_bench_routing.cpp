// Fuzz target: the bench routing directory (epx bench --routing DIR): make_problem reads and
// checks it, count_routes counts what it moves. No ranks are launched.
#include <cstddef>
#include <cstdint>

#include "epx/bench/options.hpp"
#include "epx/bench/routing.hpp"
#include "epx/error.hpp"
#include "fuzz_support.hpp"
#include "epx/io/replay.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto in = epx::fuzz::make_input_dir(data, size);
  try {
    epx::tools::BenchOptions o;
    o.routing = in.string();
    o.transport = "threads";
    const epx::tools::ReplayMeta m = epx::tools::read_replay_meta(in);
    if (m.num_ranks > 4 || m.hidden > 1024 || m.max_tokens_per_rank > 256) return 0;
    epx::tools::validate_options(o);
    const epx::tools::BenchProblem p = epx::tools::make_problem(o);
    (void)epx::tools::count_routes(p, false, 1);
  } catch (const epx::Error&) {
  }
  return 0;
}
