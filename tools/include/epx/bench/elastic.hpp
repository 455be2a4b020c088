// `epx bench --elastic`: dispatch + combine pairs over an elastic launch with a fault
// schedule (ranks killed, ranks joining), and what each event cost: the time to detect a
// loss, to agree on the survivors, to rebuild the group (and its Buffer), to admit joiners;
// and the throughput of every stretch between events (docs/reliability.md).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "epx/bench/options.hpp"

namespace epx::tools {

struct ElasticBenchOptions {
  bool enabled = false;            ///< --elastic
  std::vector<std::string> kill;   ///< --kill RANK@ITER: launched rank RANK SIGKILLs itself in iteration ITER's dispatch
  std::vector<std::string> join;   ///< --join @ITER: a new rank is started and admitted at iteration ITER
};

/// A parsed fault schedule event.
struct ElasticEventSpec {
  enum Kind { kKill, kJoin } kind = kKill;
  int rank = -1;  ///< kKill: the launched rank
  int iter = 0;
};

/// Parses and checks the schedule against the run (ranks, iterations); throws kInvalidArgument
/// naming the option otherwise. Events come back sorted by iteration.
std::vector<ElasticEventSpec> parse_elastic_schedule(const ElasticBenchOptions& e, const BenchOptions& o);

/// Runs the bench (shape, iterations, timeout from `o`: --ranks --tokens --hidden --topk
/// --experts --iters --timeout-ms; the experts per rank stay E/P as ranks come and go) and
/// prints the schedule's events and the throughput per stretch. Returns the exit status.
int run_elastic_bench(const BenchOptions& o, const ElasticBenchOptions& e, std::FILE* out);

}  // namespace epx::tools
