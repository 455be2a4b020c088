// A gtest fixture for in-process `epx bench` runs: a private temp directory (removed
// afterwards) for --json / --trace files, a sink for the text report, and the smallest
// options worth running.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>

#include "epx/bench/options.hpp"

namespace epx::testing {

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::temp_directory_path() /
           ("epx_bench_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
    sink_ = std::fopen("/dev/null", "w");
  }
  void TearDown() override {
    if (sink_) std::fclose(sink_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  /// 2 threads ranks, 16 tokens of H = 256, top-2 of 4 experts, 2 timed iterations after
  /// 1 warmup, 1 counters-overhead iteration on each side, no progress lines.
  static tools::BenchOptions tiny() {
    tools::BenchOptions o;
    o.ranks = 2, o.hidden = 256, o.topk = 2, o.experts = 4, o.tokens = 16;
    o.iters = 2, o.warmup = 1, o.overhead_iters = 1;
    o.transport = "threads";
    o.progress = false;
    return o;
  }
  std::filesystem::path dir_;
  std::FILE* sink_ = nullptr;
};

}  // namespace epx::testing
