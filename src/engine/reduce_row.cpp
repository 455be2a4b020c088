// Two kernels for the same sums: one SIMD kernel written once with Google Highway (compiled
// for every x86 target and chosen at run time; on Arm for the build's baseline, NEON), and
// plain scalar code. Both add the terms of a column in the same order with separate multiply
// and add (no fused multiply-add: the build uses -ffp-contract=off), so they agree bit for
// bit; tests/unit/reduce_row_test.cpp checks that against the scalar definition on NaNs,
// infinities, signed zeros and ties, on x86 and (CI, qemu) on aarch64.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reduce_row.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

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
using DI = hn::RebindToSigned<DF>;
using D16 = hn::Rebind<std::uint16_t, DF>;
using VF = hn::Vec<DF>;

// Lanes of bf16 -> float (exact: the bits move to the high half).
HWY_INLINE VF widen(const std::uint16_t* p) {
  return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(DU(), hn::LoadU(D16(), p))));
}

// float -> bf16 bits in the low half of each 32-bit lane, as f32_to_bf16: round to nearest
// even, NaN quieted with its sign.
HWY_INLINE hn::Vec<DU> bf16_bits(VF v) {
  const DU du;
  const auto u = hn::BitCast(du, v);
  const auto hi = hn::ShiftRight<16>(u);
  const auto nan = hn::Gt(hn::BitCast(DI(), hn::And(u, hn::Set(du, 0x7fffffffu))), hn::Set(DI(), 0x7f800000));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hi, hn::Set(du, 1u)))));
  return hn::IfThenElse(hn::RebindMask(du, nan), hn::Or(hi, hn::Set(du, 0x40u)), rounded);
}

HWY_INLINE void narrow(std::uint16_t* p, VF v) {
  hn::StoreU(hn::DemoteTo(D16(), hn::BitCast(DI(), bf16_bits(v))), D16(), p);  // values < 2^16: exact
}

// f32(bf16(v)): a group's partial, rounded as the expert rank would round it.
HWY_INLINE VF round_trip(VF v) { return hn::BitCast(DF(), hn::ShiftLeft<16>(bf16_bits(v))); }

// Four vectors of columns at a time, all terms, the accumulators in registers.
struct Block {
  VF a0, a1, a2, a3;
};

HWY_INLINE Block load_block(const std::uint16_t* r, std::size_t N) {
  return {widen(r), widen(r + N), widen(r + 2 * N), widen(r + 3 * N)};
}

HWY_INLINE void add_row(Block& a, const std::uint16_t* r, std::size_t N) {
  const Block v = load_block(r, N);
  a = {hn::Add(a.a0, v.a0), hn::Add(a.a1, v.a1), hn::Add(a.a2, v.a2), hn::Add(a.a3, v.a3)};
}

HWY_INLINE void add_weighted(Block& a, const std::uint16_t* r, float weight, std::size_t N) {
  const VF w = hn::Set(DF(), weight);
  const Block v = load_block(r, N);
  a = {hn::Add(a.a0, hn::Mul(v.a0, w)), hn::Add(a.a1, hn::Mul(v.a1, w)), hn::Add(a.a2, hn::Mul(v.a2, w)),
       hn::Add(a.a3, hn::Mul(v.a3, w))};
}

// The groups of a grouped sum at columns [c, c + 4N), added into `a`.
HWY_INLINE void add_groups(Block& a, const RowTerms& t, std::size_t c, std::size_t N) {
  const DF df;
  for (int g = 0, b = t.lead; g < t.groups; b = t.group_end[g++]) {
    const int e = t.group_end[g];
    if (e - b == 1 && !t.weights) {
      add_row(a, t.rows[b] + c, N);
      continue;
    }
    Block p{hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
    for (int j = b; j < e; ++j) t.weights ? add_weighted(p, t.rows[j] + c, t.weights[j], N) : add_row(p, t.rows[j] + c, N);
    a = {hn::Add(a.a0, round_trip(p.a0)), hn::Add(a.a1, round_trip(p.a1)), hn::Add(a.a2, round_trip(p.a2)),
         hn::Add(a.a3, round_trip(p.a3))};
  }
}

void ReduceRow(std::uint16_t* out, const RowTerms& t, std::size_t n) {
  const DF df;
  const std::size_t N = hn::Lanes(df), block = 4 * N;
  const int plain = t.group_end ? t.lead : t.count;
  const float* w = t.group_end ? nullptr : t.weights;
  std::size_t c = 0;
  for (; c + block <= n; c += block) {
    Block a = t.first ? load_block(t.first + c, N) : Block{hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
    for (int j = 0; j < plain; ++j) w ? add_weighted(a, t.rows[j] + c, w[j], N) : add_row(a, t.rows[j] + c, N);
    if (t.group_end) add_groups(a, t, c, N);
    narrow(out + c, a.a0);
    narrow(out + c + N, a.a1);
    narrow(out + c + 2 * N, a.a2);
    narrow(out + c + 3 * N, a.a3);
  }
  for (; c < n; ++c) out[c] = f32_to_bf16(column_sum(t, c));  // the tail, column by column in the same order
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
