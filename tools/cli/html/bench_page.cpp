#include "html/bench_page.hpp"

#include "bench/output.hpp"
#include "epx/error.hpp"
#include "html/html_page.hpp"

namespace epx::tools {

std::string bench_page_title(const nlohmann::ordered_json& b) {
  auto n = [&](const char* key) {
    if (!b.contains(key)) return std::string("?");
    if (b[key].is_array()) return std::to_string(b[key].size());  // "ranks": each rank's {rank, pid, node} (diagnose)
    return b[key].is_number() ? b[key].dump() : std::string("?");
  };
  return "epx bench: " + n("ranks") + " ranks, " + n("tokens") + " tokens/rank, H=" + n("hidden") + " K=" + n("topk") +
         " E=" + n("experts");
}

void write_bench_html(const std::filesystem::path& path, const BenchReport& r, const std::string& text) {
  const nlohmann::ordered_json j = bench_json(r);
  write_html_page(path, PageKind::kBench, bench_page_title(j), j, text);
}

void write_bench_html(const std::filesystem::path& path, const nlohmann::ordered_json& bench, const std::string& source) {
  auto bad = [&](const std::string& why) { throw Error(ErrorCode::kInvalidArgument, "epx html: " + source + ": " + why); };
  if (!bench.is_object() || bench.value("tool", std::string()) != "epx bench") bad("not the JSON of `epx bench --json` (no \"tool\": \"epx bench\")");
  if (bench.contains("sweep")) bad("the JSON of a --sweep: its table is the report (the page draws one run)");
  for (const char* key : {"dispatch", "combine", "route"})
    if (!bench.contains(key) || !bench[key].is_object()) bad(std::string("no \"") + key + "\" object");
  write_html_page(path, PageKind::kBench, bench_page_title(bench), bench, "");
}

}  // namespace epx::tools
