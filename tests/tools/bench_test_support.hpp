// A gtest fixture for in-process `epx bench` runs: a private temp directory (removed
// afterwards) for --json / --trace files, and a sink for the text report.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>

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
  std::filesystem::path dir_;
  std::FILE* sink_ = nullptr;
};

}  // namespace epx::testing
