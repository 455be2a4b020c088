// epx_mpi_baseline: what a user writes WITHOUT epx.
//
// The Megatron-style all-to-all token dispatcher over plain MPI, as a baseline to time
// epx against.  It reads an `epx replay` input directory (docs/spec.md §7) and, on
// every iteration:
//
//   dispatch  (1) count the rows for each destination rank (a token goes once to each
//                 unique destination rank of its valid experts), MPI_Alltoall the counts;
//             (2) permute the rows into a send buffer grouped by destination rank
//                 (token ascending inside a destination), with the token's topk_idx and
//                 topk_weights rows as metadata;
//             (3) MPI_Alltoallv the rows and the metadata;
//             (4) restore the requested layout: compact = what alltoallv delivered
//                 (source rank, then token) plus the local recv_topk_idx / weights;
//                 expanded = one row per (token, local slot), grouped by local expert in
//                 (source, token) order, each expert padded to a multiple of A (zero rows).
//   combine   the reverse, with docs/spec.md §4's fixed float32 order: the expert rank
//             reduces each received token's slots to one partial (expanded: f32 sum from
//             0.0f in ascending k, rounded to bf16; a single slot passes unchanged),
//             MPI_Alltoallv back, and the source adds the partials in f32 from 0.0f
//             (compact: ascending destination rank; expanded: ascending largest k of each
//             destination's group) and rounds to bf16 — or, with --node-of-rank, in docs/spec.md
//             section 4's node-first order (each node's partials summed and rounded first,
//             ascending rank; then the nodes' sums in ascending node order), the order of
//             epx's hierarchical node-first combine.  The expert is the identity: y is
//             the dispatch output itself.
//
// It depends only on MPI, the C++ standard library and nlohmann-json: no epx header.
// This file is the library's entry (epx_mpi_baseline::run, baselines/mpi_baseline.hpp: `epx
// bench --transport shmem --baseline mpi` calls it inside the oshrun job), over
// mpi_baseline_input.* (options and input) and mpi_baseline_dispatcher.* (the dispatcher);
// mpi_baseline_main.cpp is the program:
//
//   mpirun -np P epx_mpi_baseline --routing DIR --iters N --warmup M --json OUT.json
//          [--layout compact|expanded] [--alignment A] [--verify-expert identity|replay]
//          [--node-of-rank N0,N1,...]
//
// After the timed loop every rank hashes (FNV-1a 64) its dispatch output in the requested
// layout and its combine output.  The combine that is hashed uses y = the dispatch output
// (identity expert, as timed), or with --verify-expert replay the fixed expert function of
// `epx replay` (docs/spec.md §7), so the hash equals that of replay's combined_x.npy and
// a wrong float32 addition order shows on order-probe inputs.

#include "mpi_baseline.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mpi_baseline_dispatcher.hpp"
#include "mpi_baseline_input.hpp"

namespace epx_mpi_baseline {
namespace {

using namespace detail;
using J = nlohmann::ordered_json;

std::uint64_t fnv1a64(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Every rank passes its own error (empty = none); if any rank has one, the ranks at fault
// report it (a global error only by rank 0) and the job is aborted with exit code 2.
void agree_or_abort(int rank, const std::string& err, bool global_error) {
  int mine = err.empty() ? 0 : 1;
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any == 0) return;
  if (mine != 0 && (!global_error || rank == 0)) {
    std::fprintf(stderr, "%s: error on rank %d: %s\n", kProg, rank, err.c_str());
    std::fflush(stderr);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // One rank aborts the job (several ranks aborting at once make Open MPI's help
  // aggregation log spurious ORTE_ERROR_LOG lines); the others wait to be killed.
  if (rank != 0) MPI_Barrier(MPI_COMM_WORLD);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

// Runs `step` on every rank; an InputError (or any exception) on any rank aborts the job
// through agree_or_abort.
template <class Step>
void agreed(int rank, bool global_error, Step&& step) {
  std::string err;
  try {
    step();
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_or_abort(rank, err, global_error);
}

J stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  auto pct = [&](double q) {  // nearest rank
    auto r = static_cast<std::size_t>(std::ceil(q * static_cast<double>(n)));
    return v[std::min(n - 1, r == 0 ? 0 : r - 1)];
  };
  J j;
  j["avg"] = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(n);
  j["p50"] = pct(0.50);
  j["p95"] = pct(0.95);
  j["max"] = v.back();
  return j;
}

// The timed loop: per iteration this rank's dispatch and combine times (us), warm-up
// iterations dropped; barriers between the phases, none timed.
void time_iterations(Dispatcher& disp, const Options& opt, std::vector<double>& d_us, std::vector<double>& c_us) {
  d_us.reserve(static_cast<std::size_t>(opt.iters));
  c_us.reserve(static_cast<std::size_t>(opt.iters));
  for (int it = 0; it < opt.warmup + opt.iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    disp.dispatch();
    const double t1 = MPI_Wtime();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t2 = MPI_Wtime();
    disp.combine(disp.recv_rows_data());  // identity expert: y = the dispatch output
    const double t3 = MPI_Wtime();
    if (it >= opt.warmup) {
      d_us.push_back((t1 - t0) * 1e6);
      c_us.push_back((t3 - t2) * 1e6);
    }
  }
}

// What rank 0 gathers: per-iteration maxima over ranks, each rank's averages and facts.
constexpr int kFacts = 7;  // tokens, recv rows, recv tokens, payload, remote payload, hashes
struct Gathered {
  std::vector<double> d_max, c_max, avgs;  // avgs: [world][2] (dispatch, combine)
  std::vector<unsigned long long> facts;   // [world][kFacts]
};

Gathered gather(const std::vector<double>& d_us, const std::vector<double>& c_us, const unsigned long long (&facts)[kFacts],
                int world) {
  Gathered g;
  const auto N = static_cast<int>(d_us.size());
  g.d_max.resize(d_us.size());
  g.c_max.resize(c_us.size());
  MPI_Reduce(d_us.data(), g.d_max.data(), N, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(c_us.data(), g.c_max.data(), N, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  double avgs[2] = {std::accumulate(d_us.begin(), d_us.end(), 0.0) / N,
                    std::accumulate(c_us.begin(), c_us.end(), 0.0) / N};
  g.avgs.resize(static_cast<std::size_t>(world) * 2);
  MPI_Gather(avgs, 2, MPI_DOUBLE, g.avgs.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  g.facts.resize(static_cast<std::size_t>(world) * kFacts);
  MPI_Gather(facts, kFacts, MPI_UNSIGNED_LONG_LONG, g.facts.data(), kFacts, MPI_UNSIGNED_LONG_LONG, 0,
             MPI_COMM_WORLD);
  return g;
}

J report(const Gathered& g, const Options& opt, const Meta& meta, int world) {
  auto col = [&](int c, bool hash) {
    J a = J::array();
    for (int r = 0; r < world; ++r) {
      const auto v = g.facts[static_cast<std::size_t>(r) * kFacts + c];
      if (hash) a.push_back(hex64(v));
      else a.push_back(v);
    }
    return a;
  };
  auto phase = [&](const std::vector<double>& mx, int c) {
    J p;
    p["max_rank_us"] = stats(mx);
    J a = J::array();
    for (int r = 0; r < world; ++r) a.push_back(g.avgs[static_cast<std::size_t>(r) * 2 + c]);
    p["rank_us"] = a;
    return p;
  };
  J j;
  j["tool"] = kProg;
  j["ranks"] = world;
  j["tokens_per_rank"] = col(0, false);
  j["hidden"] = meta.H;
  j["topk"] = meta.K;
  j["experts"] = meta.E;
  j["layout"] = opt.layout;
  j["alignment"] = opt.alignment;
  j["iters"] = opt.iters;
  j["warmup"] = opt.warmup;
  j["verify_expert"] = opt.replay_expert ? "replay" : "identity";
  j["dispatch"] = phase(g.d_max, 0);
  j["combine"] = phase(g.c_max, 1);
  j["recv_rows"] = col(1, false);
  j["recv_tokens"] = col(2, false);
  j["dispatch_hash"] = col(5, true);
  j["combine_hash"] = col(6, true);
  j["payload_bytes_per_rank"] = col(3, false);
  j["remote_payload_bytes_per_rank"] = col(4, false);
  return j;
}

// Rank 0: the JSON to opt.json_out and the summary line; false if the file could not be written.
bool write_report(const J& j, const Options& opt, const Meta& meta, int world) {
  std::ofstream f(opt.json_out);
  f << j.dump(2) << "\n";
  f.close();
  if (!f) {
    std::fprintf(stderr, "%s: error on rank 0: cannot write %s\n", kProg, opt.json_out.c_str());
    return false;
  }
  if (opt.quiet) return true;
  auto us = [&](const char* phase, const char* stat) { return j[phase]["max_rank_us"][stat].get<double>(); };
  std::printf("%s: P=%d E=%d H=%d K=%d layout=%s iters=%d  dispatch avg %.1f us p50 %.1f "
              "p95 %.1f | combine avg %.1f us p50 %.1f p95 %.1f  -> %s\n",
              kProg, world, meta.E, meta.H, meta.K, opt.layout.c_str(), opt.iters, us("dispatch", "avg"),
              us("dispatch", "p50"), us("dispatch", "p95"), us("combine", "avg"), us("combine", "p50"),
              us("combine", "p95"), opt.json_out.c_str());
  return true;
}

}  // namespace

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Options opt;
  Meta meta;
  agreed(rank, true, [&] {
    opt = parse_options(argc, argv);
    meta = read_meta(opt.routing, world);
    if (!opt.node_of_rank.empty() && static_cast<int>(opt.node_of_rank.size()) != meta.P)
      throw InputError("--node-of-rank names " + std::to_string(opt.node_of_rank.size()) + " ranks, the job has " +
                           std::to_string(meta.P),
                       true);
  });
  RankInput in;
  agreed(rank, false, [&] { in = read_rank(opt.routing, rank, meta); });

  Dispatcher disp(meta, rank, in, opt.layout == "expanded", opt.alignment, opt.node_of_rank);
  std::vector<double> d_us, c_us;
  time_iterations(disp, opt, d_us, c_us);

  // Verification of the last iteration's outputs.
  const std::uint64_t dh = fnv1a64(disp.recv_rows_data(), static_cast<std::size_t>(disp.recv_rows()) * meta.H * 2);
  if (opt.replay_expert) {
    const std::vector<std::uint16_t> y = disp.replay_expert_y();
    disp.combine(y.empty() ? nullptr : y.data());
  }
  const std::uint64_t ch = fnv1a64(disp.out().data(), disp.out().size() * 2);

  const auto row_bytes = static_cast<unsigned long long>(meta.H) * 2;
  const unsigned long long facts[kFacts] = {
      static_cast<unsigned long long>(in.S), static_cast<unsigned long long>(disp.recv_rows()),
      static_cast<unsigned long long>(disp.recv_tokens()), static_cast<unsigned long long>(disp.sent_rows()) * row_bytes,
      static_cast<unsigned long long>(disp.sent_rows_remote()) * row_bytes, dh, ch};
  const Gathered g = gather(d_us, c_us, facts, world);
  int write_failed = 0;
  if (rank == 0) write_failed = write_report(report(g, opt, meta, world), opt, meta, world) ? 0 : 1;
  MPI_Bcast(&write_failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return write_failed ? 1 : 0;
}

}  // namespace epx_mpi_baseline
