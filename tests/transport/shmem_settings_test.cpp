// What epx sets for Open MPI 4.1's OpenSHMEM before starting it (shmem/shmem_settings.hpp):
// the rules of epx::ShmemOptions, on a fake environment (no runtime needed).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "shmem/shmem_settings.hpp"

namespace {

using epx::detail::decide_shmem_settings;
using epx::detail::parse_heap_size;

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

struct Env {
  std::map<std::string, std::string> vars;
  const char* operator()(const char* name) const {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  }
};

std::string value_set(const epx::detail::ShmemSettings& s, const std::string& name) {
  for (const auto& [n, v] : s.set)
    if (n == name) return v;
  return "(not set)";
}

TEST(ShmemSettings, ParsesHeapSizesAsOpenMpiDoes) {
  EXPECT_EQ(parse_heap_size("256M"), std::size_t{256} << 20);
  EXPECT_EQ(parse_heap_size("4g"), std::size_t{4} << 30);
  EXPECT_EQ(parse_heap_size("1T"), std::size_t{1} << 40);
  EXPECT_EQ(parse_heap_size("8k"), 8192u);
  EXPECT_EQ(parse_heap_size("1048576"), 1048576u);
  for (const char* bad : {"", "0", "G", "4GB", "-1G", "1.5G", "4 G", "12345678901234567"}) EXPECT_EQ(parse_heap_size(bad), 0u) << bad;
}

TEST(ShmemSettings, DefaultHeapIsTheNodesMemoryPerPeAndOscIsUcx) {
  Env env;
  env.vars["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  const auto s = decide_shmem_settings(0, env, 16 * kGiB + 12345);
  EXPECT_EQ(s.heap_bytes, std::size_t{4} << 30);
  EXPECT_EQ(value_set(s, "SMA_SYMMETRIC_SIZE"), "4096M");
  EXPECT_EQ(value_set(s, "OMPI_MCA_osc"), "ucx");
  EXPECT_NE(s.heap_from.find("epx default"), std::string::npos) << s.heap_from;
  // Never below Open MPI's own default; unknown memory keeps that default.
  EXPECT_EQ(decide_shmem_settings(0, env, kGiB / 2).heap_bytes, std::size_t{256} << 20);
  EXPECT_EQ(decide_shmem_settings(0, Env{}, UINT64_MAX).heap_bytes, std::size_t{256} << 20);
}

TEST(ShmemSettings, TheLaunchersSettingsStay) {
  Env env;
  env.vars["SMA_SYMMETRIC_SIZE"] = "2G";
  env.vars["OMPI_MCA_osc"] = "pt2pt";
  const auto s = decide_shmem_settings(0, env, 64 * kGiB);
  EXPECT_TRUE(s.set.empty());
  EXPECT_EQ(s.heap_bytes, std::size_t{2} << 30);
  Env heap;
  heap.vars["SHMEM_SYMMETRIC_HEAP_SIZE"] = "3G";
  EXPECT_EQ(decide_shmem_settings(0, heap, 64 * kGiB).heap_bytes, std::size_t{3} << 30);
  EXPECT_EQ(value_set(decide_shmem_settings(0, heap, 64 * kGiB), "SMA_SYMMETRIC_SIZE"), "(not set)");
}

TEST(ShmemSettings, TheOpenShmemSpecNameIsPassedOn) {
  // Open MPI 4.1 ignores SHMEM_SYMMETRIC_SIZE (what the OpenSHMEM 1.4 spec and users write).
  Env env;
  env.vars["SHMEM_SYMMETRIC_SIZE"] = "6G";
  const auto s = decide_shmem_settings(0, env, 64 * kGiB);
  EXPECT_EQ(value_set(s, "SMA_SYMMETRIC_SIZE"), "6G");
  EXPECT_EQ(s.heap_bytes, std::size_t{6} << 30);
}

TEST(ShmemSettings, TheCallersHeapWinsUnderBothNames) {
  Env env;
  env.vars["SMA_SYMMETRIC_SIZE"] = "1G";
  const auto s = decide_shmem_settings(std::size_t{5} << 30, env, 64 * kGiB);
  EXPECT_EQ(s.heap_bytes, std::size_t{5} << 30);
  EXPECT_EQ(value_set(s, "SMA_SYMMETRIC_SIZE"), std::to_string(std::size_t{5} << 30));
  EXPECT_EQ(value_set(s, "SHMEM_SYMMETRIC_HEAP_SIZE"), std::to_string(std::size_t{5} << 30));
}

}  // namespace
