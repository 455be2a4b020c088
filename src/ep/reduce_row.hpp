// The float32 sums of docs/spec.md §4, one output row at a time: the combine's reduce at the source
// and the expanded partials at the expert both go through reduce_row().
#pragma once

#include <cstddef>
#include <cstdint>

namespace epx::detail {

/// The terms of one row's sum, added in this order (docs/spec.md §4 fixes it; so the result is
/// bitwise the same whichever kernel runs): acc = f32(first[c]) (or +0.0f when `first` is
/// null), then acc += f32(rows[j][c]) · weights[j] (no multiply when `weights` is null) for
/// j = 0 .. count-1, then out[c] = bf16(acc). Rows are bf16 bits; they may live in any memory
/// the caller can read (the window, a peer's mapped window, y).
///
/// Grouped (`group_end` not null; the expanded layout summed at the source, docs/spec.md §4): rows
/// [0, lead) are added as above, unweighted; then rows [lead, count) form groups, group g
/// ending before row group_end[g] (g = 0 .. groups-1, group_end[groups-1] == count), and
/// each group adds f32(p) for its partial p = bf16(0.0f + Σ f32(rows[j][c]) · weights[j]),
/// in row order (no multiply when `weights` is null) — except that a group of one row
/// without weights adds f32(rows[j][c]) itself (the partial passes unchanged).
struct RowTerms {
  const std::uint16_t* first = nullptr;
  const std::uint16_t* const* rows = nullptr;
  const float* weights = nullptr;
  int count = 0;
  const std::int32_t* group_end = nullptr;
  int groups = 0;
  int lead = 0;
  /// Write `out` with non-temporal (streaming) stores where the CPU has them and `out` is
  /// vector-aligned: for output rows nobody reads soon (the combine's result), which then
  /// skip the read-for-ownership of their cache lines. The stores are fenced before
  /// reduce_row returns. Same bits either way.
  bool stream = false;
};

/// How far ahead of the columns it adds reduce_row() asks for each row's cache lines
/// (software prefetch; 1 KiB of bf16 per row). The rows of a pull combine are separate
/// streams in peers' windows, mostly in DRAM; measured with 8 shm ranks on 2 cores at 128
/// tokens the reduce's CPU fell ~30 % and the combine ran 1.25x faster (BENCHMARKS.md,
/// "What we tried": dispatch and combine on shared memory).
/// A prefetch only moves lines: the sums are the same bits.
inline constexpr std::size_t kPrefetchColumns = 512;

/// out[0 .. n) = bf16 of the sum above, column by column. Keeps the float32 accumulators in
/// registers across all the terms (one pass over every row), with the widest SIMD the CPU
/// has (Google Highway: AVX-512 / AVX2 / SSE4 on x86, NEON on Arm, chosen at run time on x86).
void reduce_row(std::uint16_t* out, const RowTerms& terms, std::size_t n);

/// The same sums with plain scalar code, term by term; exposed so the tests can hold both
/// kernels to the same reference.
void reduce_row_portable(std::uint16_t* out, const RowTerms& terms, std::size_t n);

/// Which SIMD target reduce_row() runs on this CPU (e.g. "AVX2", "NEON"), for reports.
const char* reduce_row_target() noexcept;

}  // namespace epx::detail
