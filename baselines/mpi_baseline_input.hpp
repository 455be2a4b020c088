// The MPI baseline's input: its options and an `epx replay` input directory (docs/spec.md
// §7: meta.json and rank<r>/{x,topk_idx,topk_weights}.npy), read with a .npy reader of its
// own, so that the baseline still needs no epx header. Local to one rank; no MPI here.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace epx_mpi_baseline::detail {

inline constexpr const char* kProg = "epx_mpi_baseline";

// An input or option error.  `global` errors are seen identically by every rank (options,
// meta.json): only rank 0 reports them.
struct InputError : std::runtime_error {
  InputError(const std::string& msg, bool global_error)
      : std::runtime_error(msg), global(global_error) {}
  bool global;
};

struct Options {
  std::string routing;
  std::string json_out;
  std::string layout = "compact";
  int iters = 20;
  int warmup = 5;
  int alignment = 1;
  bool replay_expert = false;
  bool quiet = false;  // no summary line on stdout (the JSON only)
  std::vector<int> node_of_rank;  // --node-of-rank: combine in the node-first order; empty = flat
};

// argv as the program's usage says; InputError (global) on anything else.
Options parse_options(int argc, char** argv);

// meta.json's sizes; L = E / P experts per rank.
struct Meta {
  int P = 0, E = 0, H = 0, K = 0, L = 0;
};

// DIR/meta.json, checked against the job's size `world`.
Meta read_meta(const std::string& dir, int world);

// One rank's tokens.
struct RankInput {
  int S = 0;
  std::vector<std::uint16_t> x;      // [S, H] bf16 bits
  std::vector<std::int64_t> idx;     // [S, K]
  std::vector<float> w;              // [S, K]
};

// DIR/rank<rank>/*.npy, with shapes, dtypes and expert ids checked (InputError naming the
// file, token and slot).
RankInput read_rank(const std::string& dir, int rank, const Meta& m);

}  // namespace epx_mpi_baseline::detail
