// The data of `epx bench --op pp|engram`, one definition for the bench engine (tools/bench)
// and for the baselines that run the same problem without epx (mpi_p2p_baseline.cpp; the
// gloo baseline gloo_p2p_baseline.py follows it word for word). Header-only, no epx header.
//
// Words are 64-bit little-endian; a byte string of n bytes is the first n bytes of its words.
//   PP message of `nbytes` from rank s:  word j = mix(kMessageKey + s * 2^40 + j)
//   Engram layer l's whole table (P * N rows of `row_bytes`, a multiple of 8):
//                                        word w = mix(mix(seed * 131 + l) + w)
//   Engram indices of rank r, layer l:   idx[i] = mix(mix(seed * 7919 + r * 977 + l + 1) + i) % (P * N)
//   check hash of a byte string:         sum over words j of mix(word_j ^ mix(j)), mod 2^64
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace epx_p2p_data {

inline constexpr std::uint64_t kMessageKey = 0x5050ull << 48;

/// splitmix64's finaliser.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Writes `n` bytes of the words w(first), w(first + 1), ... with w(j) = mix(key + j).
inline void fill_words(std::uint64_t key, std::uint64_t first, std::size_t n, void* out) {
  auto* o = static_cast<unsigned char*>(out);
  std::size_t i = 0;
  for (std::uint64_t j = first; i + 8 <= n; ++j, i += 8) {
    const std::uint64_t w = mix(key + j);
    std::memcpy(o + i, &w, 8);
  }
  if (i < n) {
    const std::uint64_t w = mix(key + first + i / 8);
    std::memcpy(o + i, &w, n - i);
  }
}

inline void fill_message(int src, std::size_t nbytes, void* out) {
  fill_words(kMessageKey + (static_cast<std::uint64_t>(src) << 40), 0, nbytes, out);
}

/// Rows [first_row, first_row + rows) of layer l's whole table.
inline void fill_table_rows(std::uint64_t seed, int l, std::int64_t first_row, std::int64_t rows, std::size_t row_bytes,
                            void* out) {
  fill_words(mix(seed * 131 + static_cast<std::uint64_t>(l)), static_cast<std::uint64_t>(first_row) * (row_bytes / 8),
             static_cast<std::size_t>(rows) * row_bytes, out);
}

inline void fill_indices(std::uint64_t seed, int rank, int l, std::int64_t count, std::int64_t table_rows,
                         std::int32_t* out) {
  const std::uint64_t key = mix(seed * 7919 + static_cast<std::uint64_t>(rank) * 977 + static_cast<std::uint64_t>(l) + 1);
  for (std::int64_t i = 0; i < count; ++i)
    out[i] = static_cast<std::int32_t>(mix(key + static_cast<std::uint64_t>(i)) % static_cast<std::uint64_t>(table_rows));
}

inline std::uint64_t check_hash(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0;
  for (std::size_t i = 0, j = 0; i < n; i += 8, ++j) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, n - i < 8 ? n - i : 8);
    h += mix(w ^ mix(j));
  }
  return h;
}

}  // namespace epx_p2p_data
