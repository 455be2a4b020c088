// Bootstrap helpers shared by every launcher: the callable-backed bootstrap and node discovery.
#include "epx/bootstrap.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
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

std::string NodeMap::servers_topology() const {
  const int per = uniform_ranks_per_node();
  if (per == 0) return "";
  for (std::size_t r = 0; r < node_of_rank.size(); ++r)
    if (node_of_rank[r] != static_cast<int>(r) / per) return "";
  return "builtin:servers:" + std::to_string(per);
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

std::vector<std::string> allgather_strings(Bootstrap& bootstrap, const std::string& mine) {
  const auto P = static_cast<std::size_t>(bootstrap.size());
  const std::uint64_t len = mine.size();
  std::vector<std::uint64_t> lens(P);
  bootstrap.allgather(&len, lens.data(), sizeof len);
  const std::size_t longest = *std::max_element(lens.begin(), lens.end());
  std::string padded = mine;
  padded.resize(longest);
  std::string all(longest * P, '\0');
  if (longest > 0) bootstrap.allgather(padded.data(), all.data(), longest);
  std::vector<std::string> out(P);
  for (std::size_t r = 0; r < P; ++r) out[r] = all.substr(r * longest, lens[r]);
  return out;
}

void agree_on_step(Bootstrap& bootstrap, const std::function<void()>& step) {
  // "" = done; else <code>\n<origin rank>\n<message>.
  std::string mine;
  try {
    step();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerFailed) throw;
    mine = std::to_string(static_cast<int>(e.code())) + "\n" +
           std::to_string(e.origin_rank() >= 0 ? e.origin_rank() : bootstrap.rank()) + "\n" + e.what();
  } catch (const std::exception& e) {
    mine = std::to_string(static_cast<int>(ErrorCode::kInternal)) + "\n" + std::to_string(bootstrap.rank()) + "\n" +
           "rank " + std::to_string(bootstrap.rank()) + ": " + e.what();
  }
  for (const std::string& s : allgather_strings(bootstrap, mine)) {
    if (s.empty()) continue;
    const auto a = s.find('\n'), b = s.find('\n', a + 1);
    throw Error(static_cast<ErrorCode>(std::stoi(s.substr(0, a))), s.substr(b + 1), std::stoi(s.substr(a + 1, b - a - 1)));
  }
}

NodeMap discover_nodes(Bootstrap& bootstrap) {
  const auto ids = allgather_strings(bootstrap, local_node_identity());
  NodeMap map;
  map.node_of_rank.resize(ids.size());
  std::map<std::string, int> index;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    auto [it, fresh] = index.emplace(ids[r], map.num_nodes);
    if (fresh) ++map.num_nodes;
    map.node_of_rank[r] = it->second;
  }
  return map;
}

}  // namespace epx
