// `epx bench`: measure (epx/bench/run.hpp), then print the report, write --json / --html / --trace.
#include "bench/run_bench.hpp"

#include "bench/output.hpp"
#include "bench/report_print.hpp"
#include "html/bench_page.hpp"

namespace epx::tools {

namespace {

// The text report on `out`, then the files of --json and --html (the page carries the text too).
void report_and_write(const BenchOptions& o, std::FILE* out, const BenchReport& rep) {
  const std::string text = bench_report_text(rep);
  std::fputs(text.c_str(), out);
  if (!o.json.empty()) {
    write_bench_json(o.json, rep);
    std::fprintf(out, "\nwrote %s\n", o.json.c_str());
  }
  if (!o.html.empty()) {
    write_bench_html(o.html, rep, text);
    std::fprintf(out, "%swrote %s (open it in a browser)\n", o.json.empty() ? "\n" : "", o.html.c_str());
  }
}

}  // namespace

int run_bench_shmem(const BenchOptions& o, std::FILE* out, BenchReport* report) {
  ShmemBenchMeasurement m = measure_bench_shmem(o);
  if (!m.root) return 0;
  BenchReport& rep = m.report;
  const int status = bench_status(rep);
  std::fprintf(out, "transport shmem (ranks from the launcher): %d nodes; %s\n", m.num_nodes, m.node_layout.c_str());
  std::fprintf(out, "shmem runtime: %s\n", m.runtime.c_str());
  report_and_write(o, out, rep);
  std::fflush(out);
  if (report) *report = std::move(rep);
  return status;
}

int run_bench(const BenchOptions& o, std::FILE* out, BenchReport* report) {
  if (o.transport == "shmem") return run_bench_shmem(o, out, report);  // ranks from oshrun (below)
  BenchMeasurement run = measure_bench(o);
  BenchReport& rep = run.report;
  report_and_write(o, out, rep);
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
