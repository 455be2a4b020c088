#include "layout.hpp"

#include "epx/error.hpp"
#include "epx/spi/resources.hpp"

namespace epx::engram {

namespace {

using detail::add_sat;
using detail::mul_sat;

/// Appends regions 64-byte aligned, saturating (a size too big for memory stays too big).
struct Cursor {
  std::uint64_t at = 0;
  std::size_t take(std::uint64_t bytes) {
    at = add_sat(at, 63) & ~std::uint64_t{63};
    const std::uint64_t start = at;
    at = add_sat(at, bytes);
    return static_cast<std::size_t>(start);
  }
  std::size_t end() { return static_cast<std::size_t>(add_sat(at, 63) & ~std::uint64_t{63}); }
};

std::int64_t sf_packs_of(const EngramConfig& c) {
  if (c.num_sf_packs >= 0) return c.num_sf_packs;
  return c.dtype == DType::kFP8E4M3 ? c.hidden / 128 : 0;
}

}  // namespace

std::string config_problem(const EngramConfig& c) {
  const std::size_t L = c.num_entries_per_layer.size();
  if (L == 0 || L > static_cast<std::size_t>(kMaxEngramLayers))
    return "engram: " + std::to_string(L) + " layers (num_entries_per_layer), expected 1.." +
           std::to_string(kMaxEngramLayers);
  for (std::size_t l = 0; l < L; ++l)
    if (c.num_entries_per_layer[l] < 1)
      return "engram: num_entries_per_layer[" + std::to_string(l) + "] = " + std::to_string(c.num_entries_per_layer[l]) +
             ", expected >= 1";
  if (c.hidden < 1) return "engram: hidden = " + std::to_string(c.hidden) + ", expected >= 1";
  if (c.num_max_tokens < 1) return "engram: num_max_tokens = " + std::to_string(c.num_max_tokens) + ", expected >= 1";
  if (c.num_entries_per_token < 1)
    return "engram: num_entries_per_token = " + std::to_string(c.num_entries_per_token) + ", expected >= 1";
  if (c.dtype != DType::kBF16 && c.dtype != DType::kFP8E4M3)
    return std::string("engram: dtype ") + to_string(c.dtype) + ", expected bf16 or fp8_e4m3";
  const std::int64_t S = sf_packs_of(c);
  if (c.dtype == DType::kBF16 && S != 0)
    return "engram: num_sf_packs = " + std::to_string(S) + " with bf16 tables, expected 0 (scales are for FP8)";
  if (c.dtype == DType::kFP8E4M3) {
    if (c.hidden % 128 != 0) return "engram: FP8 tables need hidden % 128 == 0, hidden = " + std::to_string(c.hidden);
    if (S != c.hidden / 128)
      return "engram: num_sf_packs = " + std::to_string(S) + ", expected hidden / 128 = " +
             std::to_string(c.hidden / 128) + " float32 scales per FP8 row";
  }
  return "";
}

Layout::Layout(int num_ranks, const EngramConfig& c)
    : P_(num_ranks), N_(c.num_entries_per_layer), T_(c.num_max_tokens), E_(c.num_entries_per_token), H_(c.hidden),
      S_(sf_packs_of(c)), dtype_(c.dtype) {
  if (const std::string p = config_problem(c); !p.empty()) throw Error(ErrorCode::kInvalidArgument, p);
  const auto L = static_cast<std::uint64_t>(N_.size());
  row_bytes_ = static_cast<std::size_t>(mul_sat(static_cast<std::uint64_t>(H_), dtype_size(dtype_)));
  sf_row_bytes_ = static_cast<std::size_t>(S_) * 4;
  const std::uint64_t rows_per_layer = mul_sat(static_cast<std::uint64_t>(T_), static_cast<std::uint64_t>(E_));
  max_rows_ = static_cast<std::size_t>(mul_sat(rows_per_layer, L));
  Cursor f;
  for (std::uint64_t l = 0; l < L; ++l) out_.push_back(f.take(mul_sat(rows_per_layer, row_bytes_)));
  for (std::uint64_t l = 0; l < L; ++l) out_sf_.push_back(f.take(mul_sat(rows_per_layer, sf_row_bytes_)));
  request_block_ = static_cast<std::size_t>(
      (add_sat(request_meta_bytes(static_cast<int>(L)), mul_sat(max_rows_, 4)) + 63) & ~std::uint64_t{63});
  requests_ = f.take(mul_sat(request_block_, static_cast<std::uint64_t>(P_)));
  replies_ = f.take(mul_sat(max_rows_, row_bytes_));
  reply_sf_ = f.take(mul_sat(max_rows_, sf_row_bytes_));
  fetch_bytes_ = f.end();
  Cursor s;
  for (std::uint64_t l = 0; l < L; ++l) {
    store_.push_back(s.take(mul_sat(static_cast<std::uint64_t>(N_[l]), row_bytes_)));
    store_sf_.push_back(s.take(mul_sat(static_cast<std::uint64_t>(N_[l]), sf_row_bytes_)));
  }
  storage_bytes_ = s.end();
}

}  // namespace epx::engram
