// `epx bench`: measure (epx/bench/run.hpp), then print the report, write --json / --trace.
#include "bench/run_bench.hpp"

#include "bench/output.hpp"
#include "bench/report_print.hpp"

namespace epx::tools {

int run_bench_shmem(const BenchOptions& o, std::FILE* out, BenchReport* report) {
  ShmemBenchMeasurement m = measure_bench_shmem(o);
  if (!m.root) return 0;
  BenchReport& rep = m.report;
  const int status = bench_status(rep);
  std::fprintf(out, "transport shmem (ranks from the launcher): %d nodes; %s\n", m.num_nodes, m.node_layout.c_str());
  std::fprintf(out, "shmem runtime: %s\n", m.runtime.c_str());
  print_bench_report(out, rep);
  if (!o.json.empty()) {
    write_bench_json(o.json, rep);
    std::fprintf(out, "\nwrote %s\n", o.json.c_str());
  }
  std::fflush(out);
  if (report) *report = std::move(rep);
  return status;
}

int run_bench(const BenchOptions& o, std::FILE* out, BenchReport* report) {
  if (o.transport == "shmem") return run_bench_shmem(o, out, report);  // ranks from oshrun (below)
  BenchMeasurement run = measure_bench(o);
  BenchReport& rep = run.report;
  print_bench_report(out, rep);
  if (!o.json.empty()) {
    write_bench_json(o.json, rep);
    std::fprintf(out, "\nwrote %s\n", o.json.c_str());
  }
  if (!o.trace.empty()) {
    write_bench_trace(o.trace, run.records);
    std::fprintf(out, "wrote %s (open in https://ui.perfetto.dev or chrome://tracing)\n", o.trace.c_str());
  }
  std::fflush(out);
  const int status = bench_status(rep);
  if (report) *report = std::move(rep);
  return status;
}

}  // namespace epx::tools
