// The inputs and checks of `epx bench --op all_gather|reduce_scatter|all_reduce`, shared by
// epx's side (tools/bench/collective.cpp), epx_mpi_collective (baselines/mpi_collective.cpp) and
// the gloo baseline (python/epx/bench_collective.py, through the _epx module): the same
// numbers on every side without shipping them. Header-only, no dependencies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace epx_collective {

inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Element `e` of tensor `t` on rank `r` (float32): a multiple of 2^-20 in [-4, 4).
inline float value(std::uint64_t seed, int r, int t, std::uint64_t e) {
  const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(r) << 40 ^ static_cast<std::uint64_t>(t) << 32 ^ e));
  return static_cast<float>(static_cast<std::int32_t>(h >> 41) - (1 << 22)) * (1.0f / (1 << 20));
}

/// `count` float32 values of tensor t on rank r from element `first`.
inline void fill(float* x, std::size_t count, std::uint64_t seed, int r, int t, std::uint64_t first = 0) {
  for (std::size_t e = 0; e < count; ++e) x[e] = value(seed, r, t, first + e);
}

/// `bytes` bytes of tensor t on rank r (all_gather's srcs of any dtype): the float32 values'
/// bytes, so a float32 all_gather moves the same numbers as the reductions.
inline void fill_bytes(void* x, std::size_t bytes, std::uint64_t seed, int r, int t) {
  std::vector<float> v((bytes + 3) / 4);
  fill(v.data(), v.size(), seed, r, t);
  std::memcpy(x, v.data(), bytes);
}

/// FNV-1a 64 continued from `h` over `n` bytes.
inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/// Tensor bytes of a call of `bytes` split into `tensors` (each a multiple of ranks * 64 bytes,
/// so shards are whole float32 elements and cache lines): what every side times.
inline std::size_t tensor_bytes(std::size_t bytes, int tensors, int ranks) {
  const std::size_t unit = static_cast<std::size_t>(ranks) * 64;
  const std::size_t each = bytes / static_cast<std::size_t>(tensors);
  return each < unit ? unit : each / unit * unit;
}

/// Indices of the `k` float32 elements of an output of `count` elements that are checked
/// against the other side (evenly spaced, first and last included).
inline std::vector<std::size_t> sample_indices(std::size_t count, std::size_t k = 257) {
  std::vector<std::size_t> idx;
  if (count == 0) return idx;
  if (count <= k) k = count;
  for (std::size_t i = 0; i < k; ++i) idx.push_back(k == 1 ? 0 : i * (count - 1) / (k - 1));
  return idx;
}

}  // namespace epx_collective
