// The float32 sums of SPEC §4, one output row at a time: the combine's reduce at the source
// and the expanded partials at the expert both go through reduce_row().
#pragma once

#include <cstddef>
#include <cstdint>

namespace epx::detail {

/// The terms of one row's sum, added in this order (SPEC §4 fixes it; so the result is
/// bitwise the same whichever kernel runs): acc = f32(first[c]) (or +0.0f when `first` is
/// null), then acc += f32(rows[j][c]) · weights[j] (no multiply when `weights` is null) for
/// j = 0 .. count-1, then out[c] = bf16(acc). Rows are bf16 bits; they may live in any memory
/// the caller can read (the window, a peer's mapped window, y).
struct RowTerms {
  const std::uint16_t* first = nullptr;
  const std::uint16_t* const* rows = nullptr;
  const float* weights = nullptr;
  int count = 0;
};

/// out[0 .. n) = bf16 of the sum above, column by column. Keeps the float32 accumulators in
/// registers across all the terms (one pass over every row), using AVX2 where the CPU has it.
void reduce_row(std::uint16_t* out, const RowTerms& terms, std::size_t n);

/// The same sums with portable code only (what reduce_row() runs on CPUs without AVX2);
/// exposed so the tests can hold both kernels to the same reference.
void reduce_row_portable(std::uint16_t* out, const RowTerms& terms, std::size_t n);

}  // namespace epx::detail
