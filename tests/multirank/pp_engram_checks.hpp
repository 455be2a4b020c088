// Checks shared by the PPBuffer / EngramBuffer tests of tests/multirank and the multi-machine
// rank program (tests/multinode/pp_engram_rank.cpp): a rank runs its part of a reference
// program or fetch and throws (fail) naming rank, message or layer on any difference.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "epx/engram.hpp"
#include "epx/pp.hpp"
#include "multirank_support.hpp"
#include "reference/pp_engram.hpp"

namespace epx::testing {

inline TensorView bytes_view(const std::vector<std::uint8_t>& v) {
  return TensorView(v.data(), DType::kFP8E4M3, {static_cast<std::int64_t>(v.size())});
}
inline MutableView bytes_out(std::vector<std::uint8_t>& v) {
  return MutableView{v.data(), DType::kFP8E4M3, {static_cast<std::int64_t>(v.size())}};
}

inline void expect_message(int r, const ref::PPEvent& e, const void* got, std::size_t nbytes) {
  if (nbytes != e.nbytes)
    fail(r, "message " + std::to_string(e.seq) + " from rank " + std::to_string(e.peer) + " has " +
                std::to_string(nbytes) + " bytes, want " + std::to_string(e.nbytes));
  expect_bits(r, "message " + std::to_string(e.seq) + " from rank " + std::to_string(e.peer), got,
              ref::pp_message(e.peer, r, e.seq, e.nbytes));
}

/// The plan of run_program's planned receives: two tensors of `max_bytes` + 4 KiB.
inline BufferAllocator pp_receive_plan(std::uint64_t max_bytes) {
  BufferAllocator plan;
  plan.allocate("a", {static_cast<std::int64_t>(max_bytes + 4096)}, DType::kFP8E4M3);
  plan.allocate("b", {static_cast<std::int64_t>(max_bytes + 4096)}, DType::kFP8E4M3);
  return plan;
}

/// A receive into pp_receive_plan's tensor "a" or "b" (by the message's number) at an offset
/// of 0..4095 bytes (any alignment), every byte checked and the bytes around it unchanged.
inline void recv_planned(PPBuffer& pp, const ref::PPEvent& e, int r) {
  const MutableView whole = pp.tensor(e.seq % 2 == 0 ? "a" : "b");
  const std::size_t off = static_cast<std::size_t>((e.seq * 2654435761u + static_cast<std::uint64_t>(e.peer) * 97) % 4096);
  auto* base = static_cast<std::uint8_t*>(whole.data);
  std::memset(base, 0xee, whole.nbytes());
  pp.recv(MutableView{base + off, DType::kFP8E4M3, {static_cast<std::int64_t>(e.nbytes)}}, e.peer);
  expect_message(r, e, base + off, e.nbytes);
  for (std::size_t i = 0; i < whole.nbytes(); ++i)
    if ((i < off || i >= off + e.nbytes) && base[i] != 0xee)
      fail(r, "message " + std::to_string(e.seq) + " from rank " + std::to_string(e.peer) + " wrote byte " +
                  std::to_string(i) + " of the planned tensor outside its " + std::to_string(e.nbytes) + " bytes at " +
                  std::to_string(off));
}

/// Runs rank r's events of `prog` on `pp`, checking every received byte; `planned`: receives
/// into tensors go into pp_receive_plan's tensors (pp built with that plan).
inline void run_program(PPBuffer& pp, const ref::PPProgram& prog, int r, bool planned = false) {
  for (const ref::PPEvent& e : prog.ranks[static_cast<std::size_t>(r)]) {
    if (e.send) {
      pp.send(bytes_view(ref::pp_message(r, e.peer, e.seq, e.nbytes)), e.peer);
    } else if (e.as_view) {
      PPView v = pp.recv_view(e.peer);
      if (v.seq != e.seq) fail(r, "view of message " + std::to_string(v.seq) + ", want " + std::to_string(e.seq));
      expect_message(r, e, v.data, v.nbytes);
      pp.release(v);
    } else if (planned) {
      recv_planned(pp, e, r);
    } else {
      std::vector<std::uint8_t> got(e.nbytes, 0xee);
      pp.recv(bytes_out(got), e.peer);
      expect_message(r, e, got.data(), got.size());
    }
  }
}

inline std::vector<std::pair<int, int>> both_ways(const std::vector<std::pair<int, int>>& links) {
  std::vector<std::pair<int, int>> d;
  for (auto [a, b] : links) {
    d.emplace_back(a, b);
    if (a != b) d.emplace_back(b, a);
  }
  return d;
}

inline constexpr std::uint64_t kEngramSeed = 11;

inline EngramConfig engram_config(DType dt, std::vector<std::int64_t> N = {37, 64, 5}) {
  EngramConfig c;
  c.num_entries_per_layer = std::move(N);
  c.hidden = dt == DType::kBF16 ? 72 : 256;
  c.num_max_tokens = 20;
  c.num_entries_per_token = 3;
  c.dtype = dt;
  return c;
}

inline std::size_t engram_row_bytes(const EngramConfig& c) { return static_cast<std::size_t>(c.hidden) * dtype_size(c.dtype); }
inline std::size_t engram_sf_floats(const EngramConfig& c) { return c.dtype == DType::kFP8E4M3 ? static_cast<std::size_t>(c.hidden / 128) : 0; }

/// The buffer with every rank's shards written (rank r's shard of layer l: the reference's).
struct EngramTables {
  std::vector<std::vector<std::uint8_t>> rows;  // per layer, this rank's
  std::vector<std::vector<float>> scales;
};

inline EngramTables write_engram_shards(EngramBuffer& b, const EngramConfig& c, int r) {
  EngramTables t;
  std::vector<TensorView> tables, sfs;
  for (int l = 0; l < static_cast<int>(c.num_entries_per_layer.size()); ++l) {
    const std::int64_t N = c.num_entries_per_layer[static_cast<std::size_t>(l)];
    t.rows.push_back(ref::engram_shard(kEngramSeed, l, r, N, engram_row_bytes(c)));
    t.scales.push_back(ref::engram_shard_scales(kEngramSeed, l, r, N, engram_sf_floats(c)));
  }
  for (std::size_t l = 0; l < t.rows.size(); ++l) {
    const std::int64_t N = c.num_entries_per_layer[l];
    tables.emplace_back(t.rows[l].data(), c.dtype, Shape{N, c.hidden});
    if (engram_sf_floats(c)) sfs.emplace_back(t.scales[l].data(), DType::kF32, Shape{N, c.hidden / 128});
  }
  b.write(tables, sfs);
  return t;
}

/// Layer l's whole table as every rank holds it after an all-gather.
inline std::vector<std::uint8_t> engram_whole_table(const EngramConfig& c, int P, int l) {
  std::vector<std::uint8_t> all;
  for (int p = 0; p < P; ++p) {
    const auto s = ref::engram_shard(kEngramSeed, l, p, c.num_entries_per_layer[static_cast<std::size_t>(l)], engram_row_bytes(c));
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}
inline std::vector<float> engram_whole_scales(const EngramConfig& c, int P, int l) {
  std::vector<float> all;
  for (int p = 0; p < P; ++p) {
    const auto s = ref::engram_shard_scales(kEngramSeed, l, p, c.num_entries_per_layer[static_cast<std::size_t>(l)], engram_sf_floats(c));
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}

inline std::vector<std::int32_t> engram_indices(const EngramConfig& c, int P, int r, std::int64_t T, std::uint64_t seed) {
  std::vector<std::int32_t> idx;
  for (std::size_t l = 0; l < c.num_entries_per_layer.size(); ++l) {
    const auto v = ref::engram_random_indices(seed * 100 + static_cast<std::uint64_t>(r) * 7 + l, T * c.num_entries_per_token,
                                              P * c.num_entries_per_layer[l], 10);
    idx.insert(idx.end(), v.begin(), v.end());
  }
  return idx;
}

/// One fetch of T tokens, hooks in `order`, every layer checked against the reference.
inline void fetch_and_check(EngramBuffer& b, const EngramConfig& c, int P, int r, std::int64_t T, std::uint64_t seed, bool reverse) {
  const int L = static_cast<int>(c.num_entries_per_layer.size());
  const std::int64_t E = c.num_entries_per_token;
  const auto idx = engram_indices(c, P, r, T, seed);
  EngramFetch f = b.fetch(TensorView(idx.data(), DType::kI32, {L, T, E}));
  for (int k = 0; k < L; ++k) {
    const int l = reverse ? L - 1 - k : k;
    const std::vector<std::int32_t> li(idx.begin() + l * T * E, idx.begin() + (l + 1) * T * E);
    const EngramLayer out = f.layer(l);
    const std::string what = "layer " + std::to_string(l) + (reverse ? " (reverse order)" : "");
    if (!(out.data.shape == Shape{T, E * c.hidden}) || out.data.dtype != c.dtype)
      fail(r, what + ": data is " + out.data.shape.str());
    expect_bits(r, what + " data", out.data.data, ref::engram_gather(engram_whole_table(c, P, l), engram_row_bytes(c), li));
    if (engram_sf_floats(c)) {
      if (!(out.scales.shape == Shape{T, E * c.hidden / 128})) fail(r, what + ": scales are " + out.scales.shape.str());
      expect_bits(r, what + " scales", out.scales.data, ref::engram_gather_scales(engram_whole_scales(c, P, l), engram_sf_floats(c), li));
    }
  }
  const EngramFetchStats s = f.stats();
  const std::int64_t moved = s.rows_local + s.rows_mapped + s.rows_get + s.rows_served;
  if (s.rows != L * T * E || moved + s.rows_padding != s.rows || (T > 0 && (s.rows_padding == 0 || s.rows_local == 0)))
    fail(r, "stats do not add up: rows " + std::to_string(s.rows) + ", padding " + std::to_string(s.rows_padding) +
                ", local " + std::to_string(s.rows_local));
  if (s.bytes != static_cast<std::uint64_t>(moved) * (engram_row_bytes(c) + 4 * engram_sf_floats(c))) fail(r, "stats.bytes is wrong");
  if (std::string(s.path) != b.path()) fail(r, "stats.path is not the buffer's");
}

/// A small reference problem for `P` ranks and its dispatch outputs, for an EPBuffer that
/// runs next to the PP / Engram buffers.
struct EPCheck {
  ref::Problem p;
  ref::DispatchOptions o;
  std::vector<ref::DispatchOut> want;
  explicit EPCheck(int P) {
    ref::FixtureOptions f;
    f.num_ranks = P, f.num_experts = 2 * P, f.num_topk = 2, f.hidden = 128, f.tokens = 6, f.seed = 5;
    p = ref::make_problem(f);
    want = ref::dispatch_all(p, o);
  }
  /// One dispatch on `ep` (made with config_for(p)), checked bit for bit.
  void run(Buffer& ep, int r) const {
    expect_dispatch(r, p, o, want[static_cast<std::size_t>(r)], ep.dispatch(dispatch_args(views_of(p, r), o)));
  }
};

}  // namespace epx::testing
