// The HTML report (tools/cli/html/) and the progress line (epx/bench/progress.hpp): the page
// carries exactly the data the tool's JSON has, no value can end its script element, it loads
// nothing, and `epx html` refuses what is not one bench run. Drawing is checked in a browser
// (tests/html/check_pages.py).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "bench/run_bench.hpp"
#include "bench_test_support.hpp"
#include "epx/bench/progress.hpp"
#include "epx/bench/routing.hpp"
#include "epx/error.hpp"
#include "epx/sim/hardware.hpp"
#include "html/bench_page.hpp"
#include "html/html_page.hpp"
#include "html/sim_page.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;
using namespace epx::tools;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The JSON between <script id="epx-data" ...> and the first </script> after it.
json page_data(const std::string& page) {
  const std::string open = "<script id=\"epx-data\" type=\"application/json\">";
  const std::size_t a = page.find(open);
  EXPECT_NE(a, std::string::npos);
  const std::size_t b = page.find("</script>", a);
  return json::parse(page.substr(a + open.size(), b - a - open.size()));
}

class HtmlReport : public epx::testing::BenchTest {};

}  // namespace

TEST(HtmlPage, NoValueCanEndTheScriptAndTheDataComesBackWhole) {
  ordered_json data;
  data["tool"] = "epx bench";
  data["hostile"] = "</script><script>alert(1)</script> <!-- & \"quoted\"";
  data["nested"] = {{"a", {1, 2.5, -3}}, {"</SCRIPT>", "x<y>z"}};
  const std::string page = html_page(PageKind::kBench, "a <b> title & more", data, "text <with> </pre> & tags");
  // Only the page's own two script elements close: the data's one and the drawing script's.
  EXPECT_EQ(count_of(page, "</script>"), 2u);
  EXPECT_EQ(count_of(page, "</pre>"), 1u);
  EXPECT_EQ(page_data(page), json::parse(data.dump()));
  EXPECT_NE(page.find("<title>a &lt;b&gt; title &amp; more</title>"), std::string::npos);
  EXPECT_NE(page.find("text &lt;with&gt; &lt;/pre&gt; &amp; tags"), std::string::npos);
  EXPECT_NE(page.find("data-kind=\"bench\""), std::string::npos);
  EXPECT_NE(html_page(PageKind::kSim, "t", data, "").find("data-kind=\"sim\""), std::string::npos);
  EXPECT_EQ(html_page(PageKind::kSim, "t", data, "").find("id=\"text-report\""), std::string::npos);  // no text, no section
}

TEST(HtmlPage, LoadsNothingButItself) {
  const std::string page = html_page(PageKind::kBench, "t", ordered_json::object(), "");
  EXPECT_NE(page.find("Content-Security-Policy\" content=\"default-src 'none';"), std::string::npos);
  for (const char* load : {"<script src", "<link", "@import", "url(", "<img", "<iframe", "fetch(", "XMLHttpRequest", "https://"})
    EXPECT_EQ(page.find(load), std::string::npos) << load;
  // The drawing script and the style sheet are in the page, not referenced.
  EXPECT_NE(page.find("figure.chart"), std::string::npos);
  EXPECT_NE(page.find("function heatmap("), std::string::npos);
}

TEST_F(HtmlReport, BenchPageCarriesTheJsonOfTheSameRunAndTheTextReport) {
  BenchOptions o = tiny();
  o.json = (dir_ / "bench.json").string();
  o.html = (dir_ / "bench.html").string();
  ASSERT_EQ(run_bench(o, sink_), 0);
  const std::string page = read_file(o.html);
  const json j = json::parse(read_file(o.json));
  EXPECT_EQ(page_data(page), j);
  EXPECT_NE(page.find("<pre>epx bench: P=2 ranks"), std::string::npos);
  EXPECT_NE(page.find("SUMMARY"), std::string::npos);
  EXPECT_NE(page.find("<title>epx bench: 2 ranks, 16 tokens/rank, H=256 K=2 E=4</title>"), std::string::npos);

  // route.rows_matrix (the heatmaps' data): the routing's rows per (source, destination), counted here.
  const BenchProblem p = make_problem(o);
  for (int s = 0; s < 2; ++s)
    for (int d = 0; d < 2; ++d) {
      std::int64_t rows = 0;
      for (int t = 0; t < 16; ++t) {
        bool there = false;
        for (int k = 0; k < 2; ++k) there |= p.rank[s].topk_idx[t * 2 + k] / 2 == d;
        rows += there;
      }
      EXPECT_EQ(j["route"]["rows_matrix"][s][d].get<std::int64_t>(), rows) << s << " -> " << d;
    }

  // `epx html` of the saved JSON: the same data, no text report.
  const fs::path again = dir_ / "again.html";
  write_bench_html(again, ordered_json::parse(read_file(o.json)), o.json);
  EXPECT_EQ(page_data(read_file(again)), j);
  EXPECT_EQ(read_file(again).find("id=\"text-report\""), std::string::npos);
}

TEST_F(HtmlReport, HtmlOfWhatIsNotOneBenchRunIsRefused) {
  auto code_of = [&](const ordered_json& j) {
    try {
      write_bench_html(dir_ / "x.html", j, "in.json");
    } catch (const epx::Error& e) {
      EXPECT_NE(std::string(e.what()).find("in.json"), std::string::npos) << e.what();
      return e.code();
    }
    ADD_FAILURE() << "accepted: " << j.dump();
    return epx::ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of(ordered_json::array()), epx::ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({{"tool", "epx sim"}}), epx::ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({{"tool", "epx bench"}, {"sweep", ordered_json::array()}}), epx::ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of({{"tool", "epx bench"}, {"dispatch", ordered_json::object()}}), epx::ErrorCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir_ / "x.html"));
  BenchOptions o = tiny();
  o.sweep = {"queues=1,2"};
  o.html = (dir_ / "sweep.html").string();
  EXPECT_THROW(validate_options(o), epx::Error);
}

TEST(SimPage, ProfilesCarryTheirPublishedPointsAndTheJsonPoints) {
  const epx::sim::HardwareModel hw = epx::sim::load_hardware("ascend950-supernode");
  SimPoint a, b;
  a.ep = 8, a.dispatch_gbps = 300, a.combine_gbps = 250;
  b.ep = 16, b.dispatch_gbps = 290, b.combine_gbps = 240;
  SimOptions o;
  const ordered_json j = sim_page_json(o, {SimPageProfile{&hw, {a, b}, published_points(hw)}});
  ASSERT_EQ(j["profiles"].size(), 1u);
  const ordered_json& p = j["profiles"][0];
  EXPECT_EQ(p["hardware"], hw.name);
  EXPECT_EQ(p["points"], ordered_json::parse(sim_json({a, b})));
  EXPECT_EQ(p["payload_limit_gbps"]["low"].get<double>(), hw.payload_limit_low.gbps);
  ASSERT_EQ(hw.published.size(), 1u);  // DeepEP-Ascend's figures, in the README's GB/s
  ASSERT_EQ(hw.published[0].metric, "epx");
  const auto& pub = hw.published[0].points;
  ASSERT_EQ(p["published"].size(), pub.size());
  for (std::size_t i = 0; i < pub.size(); ++i) {
    EXPECT_EQ(p["published"][i]["ep"], pub[i].ep);
    EXPECT_EQ(p["published"][i]["combine_gbps"]["high"].get<double>(), pub[i].combine_hi);
  }
  EXPECT_NE(p["published_note"].get<std::string>().find("the shape of this run"), std::string::npos);
  o.tokens = 512;
  EXPECT_NE(sim_page_json(o, {SimPageProfile{&hw, {a}, published_points(hw)}})["profiles"][0]["published_note"].get<std::string>().find(
                "differs"),
            std::string::npos);
  epx::sim::HardwareModel other = hw;
  other.published.clear();
  EXPECT_TRUE(published_points(other).empty());
  // DeepEP's figures are its bottleneck bandwidth, not the page's GB/s: not drawn here.
  EXPECT_TRUE(published_points(epx::sim::load_hardware("h800-deepep")).empty());
}

TEST(Progress, EstimateAndText) {
  EXPECT_DOUBLE_EQ(progress_eta_seconds(10, 1, 4), 30);
  EXPECT_DOUBLE_EQ(progress_eta_seconds(10, 4, 4), 0);
  EXPECT_LT(progress_eta_seconds(10, 0, 4), 0);  // nothing done: no estimate
  EXPECT_LT(progress_eta_seconds(10, 2, 0), 0);  // no total: no estimate
  EXPECT_EQ(progress_duration_text(42.4), "42 s");
  EXPECT_EQ(progress_duration_text(185), "3 min 05 s");
  EXPECT_EQ(progress_duration_text(3720), "1 h 02 min");
  EXPECT_EQ(progress_text("[epx sim]", "EP16 (2/3)", 10, 8, 24), "[epx sim]: EP16 (2/3)  [33%, 10 s so far, ~20 s left]");
  EXPECT_EQ(progress_text("epx bench", "iter 1/2", 3, 0, 10), "epx bench: iter 1/2  [0%, 3 s so far]");
  EXPECT_EQ(progress_text("x", "y", 61, 1, 0), "x: y  [1 min 01 s so far]");
}

namespace {

// Runs `body` with stderr on `fd`, then restores it.
template <class F>
void with_stderr(int fd, F body) {
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  body();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
}

}  // namespace

TEST_F(HtmlReport, ProgressIsDrawnOnATerminalOnlyAndNeverWhenOff) {
  // A pseudo-terminal stands for the user's terminal.
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  const int tty = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(tty, 0);
  auto drawn = [&](bool enabled, int fd) {
    with_stderr(fd, [&] {
      ProgressLine line("epx test", 4, enabled);
      line.update(1, "step 2/4");
      line.note("a note");
      line.finish();
    });
  };
  auto read_master = [&] {
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = read(master, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    return out;
  };
  drawn(true, tty);
  const std::string shown = read_master();
  EXPECT_NE(shown.find("epx test: step 2/4  [25%"), std::string::npos) << shown;
  EXPECT_NE(shown.find("epx test: a note"), std::string::npos) << shown;
  EXPECT_NE(shown.find("\r\033[K"), std::string::npos);
  drawn(false, tty);  // --no-progress
  EXPECT_EQ(read_master(), "");
  close(tty);
  close(master);

  // A file (a log, CI): nothing.
  const int file = open((dir_ / "stderr.log").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(file, 0);
  drawn(true, file);
  EXPECT_EQ(lseek(file, 0, SEEK_END), 0);
  close(file);
}
