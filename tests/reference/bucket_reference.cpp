#include "bucket_reference.hpp"

#include <stdexcept>

#include "reference.hpp"

namespace epx::ref {

std::vector<std::uint8_t> bucket_all_gather(const std::vector<std::vector<std::uint8_t>>& srcs) {
  std::vector<std::uint8_t> out;
  for (const auto& s : srcs) {
    if (s.size() != srcs.front().size()) throw std::invalid_argument("bucket_all_gather: srcs of different sizes");
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

namespace {

float value(const std::vector<float>& x, std::size_t e, bool bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(x[e])) : x[e]; }

float sum_at(const std::vector<std::vector<float>>& xs, std::size_t e, float scale, bool bf16) {
  float acc = value(xs[0], e, bf16);
  for (std::size_t j = 1; j < xs.size(); ++j) {
    volatile float next = acc + value(xs[j], e, bf16);  // one rounding per addition
    acc = next;
  }
  if (scale != 1.0f) {
    volatile float scaled = acc * scale;
    acc = scaled;
  }
  return acc;
}

}  // namespace

std::vector<float> bucket_reduce_scatter(const std::vector<std::vector<float>>& xs, int member, float scale, bool bf16) {
  const std::size_t n = xs.size(), numel = xs.front().size();
  if (numel % n != 0) throw std::invalid_argument("bucket_reduce_scatter: numel % n != 0");
  const std::size_t shard = numel / n, lo = static_cast<std::size_t>(member) * shard;
  std::vector<float> out(shard);
  for (std::size_t e = 0; e < shard; ++e) out[e] = sum_at(xs, lo + e, scale, bf16);
  return out;
}

std::vector<float> bucket_all_reduce(const std::vector<std::vector<float>>& xs, float scale) {
  std::vector<float> out(xs.front().size());
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = sum_at(xs, e, scale, false);
  return out;
}

}  // namespace epx::ref
