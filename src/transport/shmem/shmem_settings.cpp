#include "shmem/shmem_settings.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "epx/spi/resources.hpp"

namespace epx::detail {

namespace {

// The names Open MPI 4.1's liboshmem reads (it compares the two and refuses a conflict), and
// the OpenSHMEM 1.4 name, which it ignores.
constexpr const char* kSma = "SMA_SYMMETRIC_SIZE";
constexpr const char* kHeap = "SHMEM_SYMMETRIC_HEAP_SIZE";
constexpr const char* kSpec = "SHMEM_SYMMETRIC_SIZE";
constexpr std::size_t kOpenMpiDefault = std::size_t{256} << 20;
constexpr std::size_t kMiB = std::size_t{1} << 20;

std::string mib(std::size_t bytes) { return std::to_string(bytes / kMiB) + "M"; }

}  // namespace

std::size_t parse_heap_size(const std::string& text) {
  if (text.empty() || text.size() > 16 || !std::isdigit(static_cast<unsigned char>(text[0]))) return 0;
  std::size_t i = 0;
  unsigned long long n = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    if (n > (~0ULL - 9) / 10) return 0;
    n = n * 10 + static_cast<unsigned>(text[i] - '0');
  }
  unsigned shift = 0;
  if (i + 1 == text.size()) {
    switch (std::tolower(static_cast<unsigned char>(text[i]))) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      case 't': shift = 40; break;
      default: return 0;
    }
  } else if (i != text.size()) {
    return 0;
  }
  if (n == 0 || n > (~0ULL >> shift)) return 0;
  return static_cast<std::size_t>(n << shift);
}

ShmemSettings decide_shmem_settings(std::size_t heap_option, const std::function<const char*(const char*)>& env,
                                    std::uint64_t memory) {
  ShmemSettings s;
  const char* sma = env(kSma);
  const char* heap = env(kHeap);
  const char* spec = env(kSpec);
  if (heap_option > 0) {  // the caller's value wins over the launcher's (both names, so they never conflict)
    s.heap_bytes = heap_option;
    s.heap_from = "ShmemOptions::heap_bytes = " + format_bytes(heap_option);
    s.set.emplace_back(kSma, std::to_string(heap_option));
    s.set.emplace_back(kHeap, std::to_string(heap_option));
  } else if (sma != nullptr || heap != nullptr) {
    const char* name = sma != nullptr ? kSma : kHeap;
    const std::string value = sma != nullptr ? sma : heap;
    s.heap_bytes = parse_heap_size(value);
    s.heap_from = std::string(name) + "=" + value + " (the launcher)";
  } else if (spec != nullptr && parse_heap_size(spec) > 0) {
    s.heap_bytes = parse_heap_size(spec);
    s.heap_from = std::string(kSpec) + "=" + spec + " (the launcher; passed on as " + kSma + ", the name Open MPI 4.1 reads)";
    s.set.emplace_back(kSma, spec);
  } else {
    const char* local = env("OMPI_COMM_WORLD_LOCAL_SIZE");
    const long pes = local != nullptr ? std::max(1L, std::atol(local)) : 1L;
    const std::uint64_t share = memory == UINT64_MAX ? kOpenMpiDefault : memory / static_cast<std::uint64_t>(pes);
    s.heap_bytes = std::max<std::size_t>(kOpenMpiDefault, static_cast<std::size_t>(share) / kMiB * kMiB);
    s.heap_from = "epx default: " + format_bytes(s.heap_bytes) + " = the node's memory / " + std::to_string(pes) +
                  " PE(s) on it (" + kSma + "=" + mib(s.heap_bytes) + ")";
    s.set.emplace_back(kSma, mib(s.heap_bytes));
  }
  // Without osc ucx, Open MPI 4.1's liboshmem crashes every PE in shmem_finalize.
  if (env("OMPI_MCA_osc") == nullptr) s.set.emplace_back("OMPI_MCA_osc", "ucx");
  return s;
}

}  // namespace epx::detail
