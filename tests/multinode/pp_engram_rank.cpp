// One rank of the multi-"machine" PPBuffer / EngramBuffer checks (tests/multinode/run.sh):
// started by oshrun, it joins the job through epx::shmem_bootstrap(), connects the shmem
// transport and runs the checks of tests/multirank/pp_engram_checks.hpp bit for bit against
// tests/reference: seeded random send/recv programs over every pair and over the ring, and
// Engram fetches (bf16 and FP8, hooks forward and reverse, -1 padding), with an EPBuffer on
// the same ranks. Prints "PASS <case>" on rank 0 and the engram path; exits non-zero (the
// error on stderr, naming the rank) on any mismatch or error.
//
// --fault engram:R | pp:R (oshrun --mca orte_abort_on_non_zero_status 0): rank R SIGKILLs
// itself in the 3rd round while the others (engram) fetch rows from it by gets or (pp) wait
// for its message in a ring; each survivor prints "LOSS rank <r>: <error>" (a peer loss naming
// a rank), they agree (R lost), rebuild the group, and run every case on the P-1 survivors
// ("PASS heal:<case>" on the new rank 0), then "DONE rank <r>".
//
//   epx_multinode_pp_engram_rank [--timeout-ms N] [--fault engram:R|pp:R]
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/elastic.hpp"
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

/// Every case on `t` ("PASS <label><case>" on its rank 0).
void all_cases(Transport& t, const std::string& label) {
  const int P = t.num_ranks();
  run_case(t, label + "pp_random_all_pairs", [&] { pp_case(t, {}, 2, 1); });
  run_case(t, label + "pp_random_ring", [&] { pp_case(t, pp_ring_links(P), 1, 2); });
  run_case(t, label + "engram_bf16", [&] { engram_case(t, DType::kBF16, t.rank() == 0 && label.empty()); });
  run_case(t, label + "engram_fp8", [&] { engram_case(t, DType::kFP8E4M3, false); });
  run_case(t, label + "pp_engram_next_to_ep", [&] {
    const EPCheck check(P);
    Buffer ep(t, config_for(check.p));
    check.run(ep, t.rank());
    pp_case(t, pp_ring_links(P), 2, 3);
    engram_case(t, DType::kBF16, false);
    check.run(ep, t.rank());
  });
}

/// The rounds before the loss: Engram fetches (every rank's rows, by gets across machines)
/// or a PP ring (each rank sends to the next, receives from the previous); `victim` dies at
/// the start of round 3. Returns the survivor's error (a peer loss).
std::string rounds_until_loss(Transport& t, bool engram, int victim) {
  const int P = t.num_ranks(), r = t.rank();
  const EngramConfig c = engram_config(DType::kBF16);
  const EngramSizes z = EngramBuffer::get_storage_size_hint(P, c);
  EngramBuffer b(t, z.num_bytes, z.num_storage_bytes);
  b.set_config(c);
  write_engram_shards(b, c, r);
  PPBuffer pp(t, {.num_max_tensor_bytes = 4096, .num_max_inflight_tensors = 1, .links = pp_ring_links(P)});
  for (int round = 0; round < 100; ++round) {
    if (round == 3 && r == victim) raise(SIGKILL);
    // The others go on once it is surely dead: their gets / waits then meet a dead PE.
    if (round == 3) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    try {
      if (engram) {
        fetch_and_check(b, c, P, r, 20, 11 + static_cast<std::uint64_t>(round), (round & 1) != 0);
      } else {
        const int to = (r + 1) % P, from = (r + P - 1) % P;
        pp.send(bytes_view(ref::pp_message(r, to, static_cast<std::uint64_t>(round), 4000)), to);
        std::vector<std::uint8_t> got(4000);
        pp.recv(bytes_out(got), from);
        if (got != ref::pp_message(from, r, static_cast<std::uint64_t>(round), 4000))
          fail(r, "pp ring: round " + std::to_string(round) + "'s message from rank " + std::to_string(from) + " differs");
      }
      t.barrier("round done");
    } catch (const Error& e) {
      if (!is_peer_loss(e)) throw;
      return "round " + std::to_string(round) + ": " + e.what();
    }
  }
  fail(r, "the loss of rank " + std::to_string(victim) + " went unnoticed");
  return {};
}

/// --fault engram:R | pp:R (see the top).
void heal(Transport& t, const std::string& fault) {
  const bool engram = fault.rfind("engram:", 0) == 0;
  if (!engram && fault.rfind("pp:", 0) != 0) throw std::invalid_argument("unknown fault " + fault);
  const int victim = std::stoi(fault.substr(fault.find(':') + 1)), r = t.rank();
  const std::string error = rounds_until_loss(t, engram, victim);
  try {
    std::printf("LOSS rank %d: %s\n", r, error.c_str());
    std::fflush(stdout);
    const Membership m = agree_survivors(t);
    if (m.lost != std::vector<int>{victim} || m.new_rank != (r < victim ? r : r - 1))
      fail(r, "agree_survivors: lost " + std::to_string(m.lost.size()) + " rank(s), new rank " + std::to_string(m.new_rank));
    std::unique_ptr<Transport> group = rebuild_group(t, m);
    std::printf("HEAL rank %d -> rank %d of %d: lost rank %d\n", r, group->rank(), group->num_ranks(), victim);
    std::fflush(stdout);
    all_cases(*group, "heal:");
    std::printf("DONE rank %d\n", r);
    std::fflush(stdout);
  } catch (const std::exception& e) {
    // exit(), not a vanishing process: after a loss epx's exit handler ends the job.
    std::fprintf(stderr, "epx_multinode_pp_engram_rank: %s\n", e.what());
    std::fflush(stderr);
    std::exit(1);
  }
}

int main_impl(int argc, char** argv) {
  const RankOptions o(argc, argv, {"--timeout-ms", "--fault"}, {});
  auto boot = shmem_bootstrap();
  auto t = connect_shmem(*boot, o.timeout());
  const std::string fault = o.value("--fault", "");
  if (!fault.empty()) return heal(*t, fault), 0;
  all_cases(*t, "");
  return 0;
}

}  // namespace
}  // namespace epx::testing

int main(int argc, char** argv) {
  return epx::testing::rank_main("epx_multinode_pp_engram_rank", argc, argv, epx::testing::main_impl);
}
