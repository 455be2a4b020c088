// Two kernels for the same sums: one SIMD kernel written once with Google Highway (compiled
// for every x86 target and chosen at run time; on Arm for the build's baseline, NEON), and
// plain scalar code. Both add the terms of a column in the same order with separate multiply
// and add (no fused multiply-add: the build uses -ffp-contract=off), so they agree bit for
// bit; tests/unit/reduce_row_test.cpp checks that against the scalar definition on NaNs,
// infinities, signed zeros and ties, on x86 and (CI, qemu) on aarch64.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reduce_row.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#include <cstring>

#include "epx/dtype.hpp"
#include "reduce_row.hpp"

#ifndef EPX_REDUCE_ROW_SCALAR_ONCE
#define EPX_REDUCE_ROW_SCALAR_ONCE
namespace epx::detail {
namespace {

// Column c of the sum, term by term: the definition the SIMD kernel follows lane by lane.
inline float column_sum(const RowTerms& t, std::size_t c) {
  float acc = t.first ? bf16_to_f32(t.first[c]) : 0.0f;
  const int plain = t.group_end ? t.lead : t.count;
  const float* w = t.group_end ? nullptr : t.weights;
  for (int j = 0; j < plain; ++j) acc += w ? bf16_to_f32(t.rows[j][c]) * w[j] : bf16_to_f32(t.rows[j][c]);
  for (int g = 0, b = t.lead; t.group_end && g < t.groups; b = t.group_end[g++]) {
    const int e = t.group_end[g];
    if (e - b == 1 && !t.weights) {  // one unweighted row: the partial is the row itself
      acc += bf16_to_f32(t.rows[b][c]);
      continue;
    }
    float p = 0.0f;
    for (int j = b; j < e; ++j) p += t.weights ? bf16_to_f32(t.rows[j][c]) * t.weights[j] : bf16_to_f32(t.rows[j][c]);
    acc += bf16_to_f32(f32_to_bf16(p));
  }
  return acc;
}

}  // namespace
}  // namespace epx::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace epx::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;

// Two bf16 columns per 32-bit lane (little-endian: column 2i in the low half, 2i + 1 in the
// high half), so one load gives two float vectors — the even columns (low half moved up) and
// the odd ones (high half kept) — without widening shuffles, and the sums go back the same
// way. Every lane is added in the same order as the scalar definition; only which lane holds
// which column differs.
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "reduce_row packs two bf16 columns per 32-bit lane: little-endian only"
#endif

HWY_INLINE VU high_mask() { return hn::Set(DU(), 0xffff0000u); }

// 2N bf16 columns as N 32-bit lanes, and back.
#if HWY_TARGET == HWY_SCALAR
HWY_INLINE VU load_pairs(const std::uint16_t* p) {
  std::uint32_t u;
  std::memcpy(&u, p, sizeof u);
  return hn::Set(DU(), u);
}
HWY_INLINE void store_pairs(std::uint16_t* p, VU v) {
  const std::uint32_t u = hn::GetLane(v);
  std::memcpy(p, &u, sizeof u);
}
#else
using D16 = hn::Repartition<std::uint16_t, DF>;  // the same vector as 2N bf16 columns
HWY_INLINE VU load_pairs(const std::uint16_t* p) { return hn::BitCast(DU(), hn::LoadU(D16(), p)); }
HWY_INLINE void store_pairs(std::uint16_t* p, VU v) { hn::StoreU(hn::BitCast(D16(), v), D16(), p); }
#endif

// Non-temporal: `p` vector-aligned; the row's stores are fenced before reduce_row returns.
HWY_INLINE void stream_pairs(std::uint16_t* p, VU v) {
#if HWY_TARGET == HWY_SCALAR
  store_pairs(p, v);
#else
  hn::Stream(hn::BitCast(D16(), v), D16(), p);
#endif
}

// Columns [c, c + 2N) as float: even columns, odd columns (exact: the bits move to the high half).
struct Pair {
  VF even, odd;
};

HWY_INLINE Pair widen(const std::uint16_t* p) {
  const VU v = load_pairs(p);
  return {hn::BitCast(DF(), hn::ShiftLeft<16>(v)), hn::BitCast(DF(), hn::And(v, high_mask()))};
}

// f32 bits rounded to bf16 in the high half (the low half is garbage but for the carry), as
// f32_to_bf16: round to nearest even; NaN quieted with its sign.
HWY_INLINE VU rounded_bits(VF v) {
  const DU du;
  const VU u = hn::BitCast(du, v);
  const VU lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const VU r = hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), lsb);
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(u, hn::Set(du, 0x00400000u)), r);
}

// f32(bf16(v)): a group's partial, rounded as the expert rank would round it. A NaN partial
// stays the NaN it is (the sum is a NaN then, whose payload docs/spec.md §4 leaves open).
HWY_INLINE VF round_trip(VF v) {
  const DU du;
  const VU u = hn::BitCast(du, v);
  const VU r = hn::And(hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))), high_mask());
  return hn::IfThenElse(hn::IsNaN(v), v, hn::BitCast(DF(), r));
}

HWY_INLINE void narrow(std::uint16_t* p, VF even, VF odd, bool stream) {
  const VU v = hn::Or(hn::And(rounded_bits(odd), high_mask()), hn::ShiftRight<16>(rounded_bits(even)));
  stream ? stream_pairs(p, v) : store_pairs(p, v);
}

// Two vectors of column pairs (4N columns) at a time, all terms, the accumulators in registers.
struct Block {
  VF e0, o0, e1, o1;
};

HWY_INLINE Block zero_block() {
  const VF z = hn::Zero(DF());
  return {z, z, z, z};
}

HWY_INLINE Block load_block(const std::uint16_t* r, std::size_t N) {
  const Pair a = widen(r), b = widen(r + 2 * N);
  return {a.even, a.odd, b.even, b.odd};
}

HWY_INLINE void add(Block& a, const Block& v) {
  a = {hn::Add(a.e0, v.e0), hn::Add(a.o0, v.o0), hn::Add(a.e1, v.e1), hn::Add(a.o1, v.o1)};
}

HWY_INLINE void add_row(Block& a, const std::uint16_t* r, std::size_t N) { add(a, load_block(r, N)); }

HWY_INLINE void add_weighted(Block& a, const std::uint16_t* r, float weight, std::size_t N) {
  const VF w = hn::Set(DF(), weight);
  const Block v = load_block(r, N);
  add(a, {hn::Mul(v.e0, w), hn::Mul(v.o0, w), hn::Mul(v.e1, w), hn::Mul(v.o1, w)});
}

// The groups of a grouped sum at columns [c, c + 4N), added into `a`.
HWY_INLINE void add_groups(Block& a, const RowTerms& t, std::size_t c, std::size_t N) {
  for (int g = 0, b = t.lead; g < t.groups; b = t.group_end[g++]) {
    const int e = t.group_end[g];
    if (e - b == 1 && !t.weights) {
      add_row(a, t.rows[b] + c, N);
      continue;
    }
    Block p = zero_block();
    for (int j = b; j < e; ++j) t.weights ? add_weighted(p, t.rows[j] + c, t.weights[j], N) : add_row(p, t.rows[j] + c, N);
    add(a, {round_trip(p.e0), round_trip(p.o0), round_trip(p.e1), round_trip(p.o1)});
  }
}

// Asks for the cache lines of every row kPrefetchColumns on from columns [c, c + block) (a
// line once, however narrow the block): the rows are separate streams, often in DRAM (a peer's
// window written with streaming stores), and the hardware prefetchers alone keep too few of
// their lines in flight (BENCHMARKS.md, "What we tried": dispatch and combine on shared memory).
HWY_INLINE void prefetch_rows(const RowTerms& t, std::size_t c, std::size_t block, std::size_t n) {
  constexpr std::size_t kLine = 64 / sizeof(std::uint16_t);  // columns per cache line
  if (c + kPrefetchColumns >= n) return;
  for (int j = 0; j < t.count; ++j)
    for (std::size_t k = (kLine - c % kLine) % kLine; k < block; k += kLine)
      hwy::Prefetch(t.rows[j] + c + kPrefetchColumns + k);
}

void ReduceRow(std::uint16_t* out, const RowTerms& t, std::size_t n) {
  const std::size_t N = hn::Lanes(DF()), block = 4 * N;
  const int plain = t.group_end ? t.lead : t.count;
  const float* w = t.group_end ? nullptr : t.weights;
  // Streaming stores where asked and `out` is vector-aligned (then every block's is too).
  const bool stream = t.stream && reinterpret_cast<std::uintptr_t>(out) % (N * sizeof(float)) == 0;
  std::size_t c = 0;
  for (; c + block <= n; c += block) {
    prefetch_rows(t, c, block, n);
    Block a = t.first ? load_block(t.first + c, N) : zero_block();
    for (int j = 0; j < plain; ++j) w ? add_weighted(a, t.rows[j] + c, w[j], N) : add_row(a, t.rows[j] + c, N);
    if (t.group_end) add_groups(a, t, c, N);
    narrow(out + c, a.e0, a.o0, stream);
    narrow(out + c + 2 * N, a.e1, a.o1, stream);
  }
  for (; c < n; ++c) out[c] = f32_to_bf16(column_sum(t, c));  // the tail, column by column in the same order
  if (stream) hwy::FlushStream();  // weakly ordered: fenced before the caller publishes the row
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace epx::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace epx::detail {

HWY_EXPORT(ReduceRow);
HWY_EXPORT(TargetName);

void reduce_row(std::uint16_t* out, const RowTerms& terms, std::size_t n) { HWY_DYNAMIC_DISPATCH(ReduceRow)(out, terms, n); }

const char* reduce_row_target() noexcept { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

void reduce_row_portable(std::uint16_t* out, const RowTerms& terms, std::size_t n) {
  for (std::size_t c = 0; c < n; ++c) out[c] = f32_to_bf16(column_sum(terms, c));
}

}  // namespace epx::detail
#endif
