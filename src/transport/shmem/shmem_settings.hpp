// What epx sets up for Open MPI 4.1's OpenSHMEM before it starts it (shmem_bootstrap), when
// the launcher has not: the symmetric heap and `osc ucx`. Pure functions of the environment
// and the machine's memory, so they are tested without a runtime (tests/unit/shmem_settings_test.cpp);
// shmem_transport.cpp applies them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace epx::detail {

/// Open MPI 4.1's reading of a heap size (oshmem/info/info.c): a positive decimal number,
/// optionally followed by one of k K m M g G t T, at most 16 characters. 0 if not that.
std::size_t parse_heap_size(const std::string& text);

struct ShmemSettings {
  std::vector<std::pair<std::string, std::string>> set;  // environment to set before shmem_init, in order
  std::size_t heap_bytes = 0;  // the heap the runtime will have (0: the launcher's value does not parse)
  std::string heap_from;       // where that comes from, for messages and reports
};

/// `heap_option`: ShmemOptions::heap_bytes (0 = not given); `env`: a getenv (nullptr =
/// unset); `memory`: this node's physical memory (UINT64_MAX: unknown). The rules are
/// ShmemOptions' (epx/shmem.hpp).
ShmemSettings decide_shmem_settings(std::size_t heap_option, const std::function<const char*(const char*)>& env,
                                    std::uint64_t memory);

}  // namespace epx::detail
