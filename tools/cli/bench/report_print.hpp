// `epx bench`'s text report: what the command prints of a BenchReport.
#pragma once

#include <cstdio>
#include <string>

#include "epx/bench/report.hpp"

namespace epx::tools {

void print_bench_report(std::FILE* out, const BenchReport& r);

/// print_bench_report's text as a string (what `epx bench` prints and its --html page shows).
std::string bench_report_text(const BenchReport& r);

/// A latency in us as the report prints it: one decimal below 10 ms, none above.
std::string format_us(double us);

}  // namespace epx::tools
