// epx_multinode_bucket: one rank of an oshrun job (tests/multinode/run.sh) running the
// bucket collectives' cases (tests/multirank/bucket_cases.hpp) over the shmem transport,
// bit for bit against tests/reference, with the job's node layout as the buffer's topology
// (the world group's all_reduce then runs two-level: machine after machine). Prints one
// "PASS <what>" line per group of cases on rank 0, and the algorithm each op ran.
//
//   epx_multinode_bucket [--timeout-ms N] [--chunk-bytes B]
#include <chrono>
#include <cstdio>
#include <map>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/shmem.hpp"
#include "multirank/bucket_cases.hpp"
#include "rank_program.hpp"

namespace epx::testing {
namespace {

int main_impl(int argc, char** argv) {
  const RankOptions o(argc, argv, {"--timeout-ms", "--chunk-bytes"}, {});
  const std::size_t chunk = std::stoul(o.value("--chunk-bytes", "0"));
  auto boot = shmem_bootstrap();
  const NodeMap nodes = discover_nodes(*boot);
  auto t = connect_shmem(*boot, o.timeout());
  const auto groups = bucket::groups_of(t->num_ranks());
  const std::string topo = nodes.servers_topology();
  const int r = t->rank();
  std::map<std::string, std::string> ran;  // op + group 0 -> algorithm
  {
    BucketBuffer b(*t, groups, std::size_t{4} << 20, {.topology = topo, .chunk_bytes = chunk, .algorithm = BucketAlgorithm::kNone});
    const auto t0 = std::chrono::steady_clock::now();
    int n = 0;
    for (const bucket::Case& c0 : bucket::cases_of(static_cast<int>(groups.size()), 11, false)) {
      const bucket::Case c = bucket::fit(c0, static_cast<int>(groups[static_cast<std::size_t>(c0.group)].size()));
      bucket::run_case(b, c);
      if (c.group == 0 && b.group_rank(0) >= 0) ran[std::string(bucket::name(c.op))] += std::string(ran.count(bucket::name(c.op)) ? "," : "") + to_string(b.last_algorithm());
      ++n;
    }
    t->barrier("bucket cases done");
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) {
      std::printf("PASS bucket cases (%d calls on %zu groups, P=%d, %d nodes, topology '%s', %lld ms)\n", n, groups.size(),
                  t->num_ranks(), nodes.num_nodes, topo.c_str(), static_cast<long long>(ms));
      for (const auto& [op, algos] : ran) std::printf("ALGORITHMS %s world: %s\n", op.c_str(), algos.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace epx::testing

int main(int argc, char** argv) {
  return epx::testing::rank_main("epx_multinode_bucket", argc, argv, epx::testing::main_impl);
}
