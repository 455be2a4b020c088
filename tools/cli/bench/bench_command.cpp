// `epx bench`: dispatch and combine timed over P ranks on one routing, against this
// machine's memcpy (and optionally an MPI baseline), with epx's per-worker counters; the
// other buffers' calls with --op (the table of ops: bench/bench_ops.hpp).
#include <cstdio>
#include <memory>

#include "bench/bench_cli.hpp"
#include "bench/bench_ops.hpp"
#include "bench/p2p_ops.hpp"
#include "commands.hpp"
#include "epx/bench/elastic.hpp"

namespace epx::tools {

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Time dispatch and combine over P ranks (default: the DeepSeek-V3 shape H=7168 K=8 E=256 on 8 processes) and say "
      "where the time goes: per-rank latency, payload bytes and bandwidth against this machine's memcpy, puts, phases "
      "per rank and worker, the route histogram; --json, --trace, --baseline mpi. --op times another call the same way.");
  add_bench_options(sub, *o);
  add_p2p_options(sub, *o);
  std::string ops = "what to time: ";
  for (const BenchOp& op : bench_ops()) ops += std::string("\n  ") + op.name + ": " + op.help;
  sub->add_option("--op", o->op, ops)->capture_default_str()->check([](const std::string& v) {
    for (const BenchOp& op : bench_ops())
      if (v == op.name) return std::string();
    return "unknown op '" + v + "', expected one of " + bench_op_names();
  });
  auto elastic = std::make_shared<ElasticBenchOptions>();
  sub->add_flag("--elastic", elastic->enabled,
                "an elastic launch with a fault schedule (--kill, --join): each event's time to detect, agree, rebuild and "
                "admit, and the throughput before and after (docs/reliability.md)");
  sub->add_option("--kill", elastic->kill, "with --elastic: RANK@ITER, launched rank RANK dies (SIGKILL) in iteration ITER")
      ->take_all();
  sub->add_option("--join", elastic->join, "with --elastic: @ITER, a new rank is started and admitted at iteration ITER")
      ->take_all();
  sub->callback([o, sub, elastic] {
    if (elastic->enabled || !elastic->kill.empty() || !elastic->join.empty()) {
      const int status = run_elastic_bench(*o, *elastic, stdout);
      if (status != 0) throw CLI::RuntimeError(status);
      return;
    }
    if (!o->routing.empty())
      for (const char* shape : {"--ranks", "--tokens", "--hidden", "--topk", "--experts"})
        if (sub->count(shape) > 0)
          std::fprintf(stderr, "epx bench: note: %s is ignored, the shape comes from %s/meta.json\n", shape, o->routing.c_str());
    const int status = find_bench_op(o->op).run(*o, stdout);
    if (status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace epx::tools
