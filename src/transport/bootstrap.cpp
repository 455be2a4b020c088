// Bootstrap helpers shared by every launcher: the callable-backed bootstrap and node discovery.
#include "epx/bootstrap.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <map>

#include "epx/error.hpp"

namespace epx {

FunctionBootstrap::FunctionBootstrap(int rank, int size, AllgatherFn allgather, std::string name)
    : rank_(rank), size_(size), allgather_(std::move(allgather)), name_(std::move(name)) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(ErrorCode::kInvalidArgument, "bootstrap: rank " + std::to_string(rank) + " of size " +
                                                 std::to_string(size) + " (expected 0 <= rank < size, size >= 1)");
  if (!allgather_) throw Error(ErrorCode::kInvalidArgument, "bootstrap: no allgather function");
}

void FunctionBootstrap::allgather(const void* in, void* out, std::size_t bytes) { allgather_(in, out, bytes); }

void FunctionBootstrap::barrier() {
  const char one = 1;
  std::vector<char> all(static_cast<std::size_t>(size_));
  allgather_(&one, all.data(), 1);
}

std::vector<int> NodeMap::ranks_of(int node) const {
  std::vector<int> out;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r)
    if (node_of_rank[r] == node) out.push_back(static_cast<int>(r));
  return out;
}

int NodeMap::uniform_ranks_per_node() const noexcept {
  if (num_nodes <= 0) return 0;
  std::vector<int> count(static_cast<std::size_t>(num_nodes), 0);
  for (int n : node_of_rank) ++count[static_cast<std::size_t>(n)];
  return std::all_of(count.begin(), count.end(), [&](int c) { return c == count[0]; }) ? count[0] : 0;
}

std::string local_node_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st {};
  const std::string shm_dev =
      ::stat("/dev/shm", &st) == 0 ? std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) : "no-shm";
  std::array<char, 256> host{};
  ::gethostname(host.data(), host.size() - 1);
  return boot_id + "/" + shm_dev + "/" + host.data();
}

NodeMap discover_nodes(Bootstrap& bootstrap) {
  constexpr std::size_t kBytes = 256;
  std::array<char, kBytes> mine{};
  const std::string id = local_node_identity();
  std::memcpy(mine.data(), id.data(), std::min(id.size(), kBytes - 1));
  const int p = bootstrap.size();
  std::vector<char> all(kBytes * static_cast<std::size_t>(p));
  bootstrap.allgather(mine.data(), all.data(), kBytes);
  NodeMap map;
  map.node_of_rank.resize(static_cast<std::size_t>(p));
  std::map<std::string, int> index;
  for (int r = 0; r < p; ++r) {
    const char* s = all.data() + kBytes * static_cast<std::size_t>(r);
    const std::string key(s, strnlen(s, kBytes));
    auto [it, fresh] = index.emplace(key, map.num_nodes);
    if (fresh) ++map.num_nodes;
    map.node_of_rank[static_cast<std::size_t>(r)] = it->second;
  }
  return map;
}

}  // namespace epx
