// One rank of the multi-"machine" PPBuffer / EngramBuffer checks (tests/multinode/run.sh):
// started by oshrun, it joins the job through epx::shmem_bootstrap(), connects the shmem
// transport and runs the checks of tests/multirank/pp_engram_checks.hpp bit for bit against
// tests/reference: seeded random send/recv programs over every pair and over the ring, and
// Engram fetches (bf16 and FP8, hooks forward and reverse, -1 padding), with an EPBuffer on
// the same ranks. Prints "PASS <case>" on rank 0 and the engram path; exits non-zero (the
// error on stderr, naming the rank) on any mismatch or error.
//
//   epx_multinode_pp_engram_rank [--timeout-ms N]
#include <chrono>
#include <cstdio>
#include <string>

#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/shmem.hpp"
#include "../multirank/pp_engram_checks.hpp"
#include "rank_program.hpp"

namespace epx::testing {
namespace {

template <class F>
void run_case(Transport& t, const std::string& name, F&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  body();
  t.barrier("case done");
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  if (t.rank() == 0) std::printf("PASS %s (P=%d, %lld ms)\n", name.c_str(), t.num_ranks(), static_cast<long long>(ms));
  std::fflush(stdout);
}

void pp_case(Transport& t, const std::vector<std::pair<int, int>>& links, int inflight, std::uint64_t seed) {
  const ref::PPProgram prog = ref::pp_random_program(t.num_ranks(), inflight, 20000, 200, seed, both_ways(links));
  PPBuffer pp(t, {.num_max_tensor_bytes = 20000, .num_max_inflight_tensors = inflight, .links = links});
  run_program(pp, prog, t.rank());
  pp.destroy();
}

void engram_case(Transport& t, DType dt, bool print_path) {
  const int P = t.num_ranks();
  const EngramConfig c = engram_config(dt);
  const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
  EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
  b.set_config(c);
  write_engram_shards(b, c, t.rank());
  if (print_path && t.rank() == 0) std::printf("engram path: %s\n", b.path());
  fetch_and_check(b, c, P, t.rank(), 17, 1, false);
  fetch_and_check(b, c, P, t.rank(), 20, 2, true);
  b.destroy();
}

int main_impl(int argc, char** argv) {
  const RankOptions o(argc, argv, {"--timeout-ms"}, {});
  auto boot = shmem_bootstrap();
  auto t = connect_shmem(*boot, o.timeout());
  const int P = t->num_ranks();
  run_case(*t, "pp_random_all_pairs", [&] { pp_case(*t, {}, 2, 1); });
  run_case(*t, "pp_random_ring", [&] { pp_case(*t, pp_ring_links(P), 1, 2); });
  run_case(*t, "engram_bf16", [&] { engram_case(*t, DType::kBF16, true); });
  run_case(*t, "engram_fp8", [&] { engram_case(*t, DType::kFP8E4M3, false); });
  run_case(*t, "pp_engram_next_to_ep", [&] {
    const EPCheck check(P);
    Buffer ep(*t, config_for(check.p));
    check.run(ep, t->rank());
    pp_case(*t, pp_ring_links(P), 2, 3);
    engram_case(*t, DType::kBF16, false);
    check.run(ep, t->rank());
  });
  return 0;
}

}  // namespace
}  // namespace epx::testing

int main(int argc, char** argv) {
  return epx::testing::rank_main("epx_multinode_pp_engram_rank", argc, argv, epx::testing::main_impl);
}
