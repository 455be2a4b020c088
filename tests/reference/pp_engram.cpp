#include "reference/pp_engram.hpp"

#include <map>
#include <random>
#include <stdexcept>

namespace epx::ref {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::uint8_t pp_message_byte(int src, int dst, std::uint64_t seq, std::uint64_t i) {
  const std::uint64_t h = mix(mix(mix(static_cast<std::uint64_t>(src) * 1315423911u + static_cast<std::uint64_t>(dst)) + seq) + i / 8);
  return static_cast<std::uint8_t>(h >> (8 * (i % 8)));
}

std::vector<std::uint8_t> pp_message(int src, int dst, std::uint64_t seq, std::uint64_t nbytes) {
  std::vector<std::uint8_t> m(nbytes);
  for (std::uint64_t i = 0; i < nbytes; ++i) m[i] = pp_message_byte(src, dst, seq, i);
  return m;
}

PPProgram pp_random_program(int num_ranks, int inflight, std::uint64_t max_bytes, int num_events, std::uint64_t seed,
                            const std::vector<std::pair<int, int>>& links) {
  std::vector<std::pair<int, int>> pairs = links;
  if (pairs.empty())
    for (int s = 0; s < num_ranks; ++s)
      for (int d = 0; d < num_ranks; ++d) pairs.emplace_back(s, d);
  std::mt19937_64 rng(seed);
  PPProgram prog;
  prog.ranks.resize(static_cast<std::size_t>(num_ranks));
  std::map<std::pair<int, int>, std::vector<std::uint64_t>> queue;  // sizes of sent, not received
  std::map<std::pair<int, int>, std::uint64_t> sent, received;
  auto size_of = [&](std::uint64_t n) -> std::uint64_t {
    if (n % 7 == 0) return max_bytes;
    if (n % 7 == 3) return 0;
    return rng() % (max_bytes + 1);
  };
  auto do_recv = [&](std::pair<int, int> p) {
    auto& q = queue[p];
    PPEvent e{false, p.first, received[p]++, q.front(), rng() % 3 == 0};
    q.erase(q.begin());
    prog.ranks[static_cast<std::size_t>(p.second)].push_back(e);
    prog.order.push_back(p.second);
  };
  for (int i = 0; i < num_events; ++i) {
    const auto p = pairs[rng() % pairs.size()];
    auto& q = queue[p];
    const bool send = q.empty() || (static_cast<int>(q.size()) < inflight && rng() % 2 == 0);
    if (!send) {
      do_recv(p);
      continue;
    }
    const std::uint64_t n = sent[p]++;
    PPEvent e{true, p.second, n, size_of(prog.messages++), false};
    q.push_back(e.nbytes);
    prog.ranks[static_cast<std::size_t>(p.first)].push_back(e);
    prog.order.push_back(p.first);
  }
  for (auto& [p, q] : queue)
    while (!q.empty()) do_recv(p);
  return prog;
}

std::vector<std::uint8_t> engram_shard(std::uint64_t seed, int l, int r, std::int64_t N, std::size_t row_bytes) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(N) * row_bytes);
  std::uint64_t s = mix(seed * 977 + static_cast<std::uint64_t>(l) * 131 + static_cast<std::uint64_t>(r));
  for (std::size_t i = 0; i < v.size(); i += 8) {
    s = mix(s);
    for (std::size_t k = 0; k < 8 && i + k < v.size(); ++k) v[i + k] = static_cast<std::uint8_t>(s >> (8 * k));
  }
  return v;
}

std::vector<float> engram_shard_scales(std::uint64_t seed, int l, int r, std::int64_t N, std::size_t sf_floats) {
  std::vector<float> v(static_cast<std::size_t>(N) * sf_floats);
  std::uint64_t s = mix(seed * 31 + 7 + static_cast<std::uint64_t>(l) * 1009 + static_cast<std::uint64_t>(r) * 17);
  for (auto& f : v) {
    s = mix(s);
    f = static_cast<float>(1 + s % 100000) / 4096.0f;
  }
  return v;
}

std::vector<std::uint8_t> engram_gather(const std::vector<std::uint8_t>& table, std::size_t row_bytes,
                                        const std::vector<std::int32_t>& indices) {
  std::vector<std::uint8_t> out(indices.size() * row_bytes, 0);
  const std::size_t rows = table.size() / row_bytes;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::int32_t g = indices[i];
    if (g == -1) continue;
    if (g < 0 || static_cast<std::size_t>(g) >= rows) throw std::invalid_argument("engram_gather: index out of range");
    for (std::size_t b = 0; b < row_bytes; ++b) out[i * row_bytes + b] = table[static_cast<std::size_t>(g) * row_bytes + b];
  }
  return out;
}

std::vector<float> engram_gather_scales(const std::vector<float>& scales, std::size_t sf_floats,
                                        const std::vector<std::int32_t>& indices) {
  std::vector<float> out(indices.size() * sf_floats, 0.0f);
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] == -1) continue;
    for (std::size_t k = 0; k < sf_floats; ++k)
      out[i * sf_floats + k] = scales.at(static_cast<std::size_t>(indices[i]) * sf_floats + k);
  }
  return out;
}

std::vector<std::int32_t> engram_random_indices(std::uint64_t seed, std::int64_t count, std::int64_t rows,
                                                int padding_percent) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> v(static_cast<std::size_t>(count));
  for (auto& x : v)
    x = static_cast<int>(rng() % 100) < padding_percent ? -1 : static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(rows));
  return v;
}

}  // namespace epx::ref
