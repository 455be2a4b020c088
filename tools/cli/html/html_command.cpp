// `epx html BENCH.json --out PAGE.html`: the page of a run saved with `epx bench --json`
// (e.g. one measured elsewhere, or with --transport shmem on another machine).
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "epx/error.hpp"
#include "html/bench_page.hpp"

namespace epx::tools {

namespace {

nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kIo, "epx html: cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, "epx html: " + path + " is not JSON: " + e.what());
  }
}

}  // namespace

void add_html_command(CLI::App& app) {
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "html", "draw a run saved with `epx bench --json` as one self-contained HTML page (what `epx bench --html` writes, "
              "without the text report)");
  sub->add_option("json", *in, "the JSON of `epx bench --json`")->required()->type_name("FILE");
  sub->add_option("--out,-o", *out, "the page to write")->required()->type_name("FILE");
  sub->callback([in, out] {
    write_bench_html(*out, read_json(*in), *in);
    std::printf("wrote %s (open it in a browser)\n", out->c_str());
  });
}

}  // namespace epx::tools
