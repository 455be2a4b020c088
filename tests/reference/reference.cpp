// tests/reference/reference.cpp — see reference.hpp. Plain loops over all ranks at once.
//
// Floating point: every float32 operation is written as its own statement, in the order
// docs/spec.md gives, so no compiler may fuse a multiply and an add (ISO C++ mode, as this
// project builds, has FP contraction off in GCC; clang only contracts within one
// expression).
#include "reference/reference.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>

namespace epx::ref {
namespace {

constexpr int kBlock = 128;  // docs/spec.md §1: one FP8 scale per 128 consecutive columns

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("epx::ref: " + what); }

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

int local_experts(const Problem& p) { return p.num_experts / p.num_ranks; }

/// Rank that holds global expert e (e >= 0).
int rank_of_expert(const Problem& p, std::int64_t e) { return static_cast<int>(e / local_experts(p)); }

std::int64_t topk(const Problem& p, int s, std::int64_t t, int k) {
  return p.ranks[idx(s)].topk_idx[idx(t * p.num_topk + k)];
}

/// True if token t of rank s has at least one slot whose expert lives on rank d.
bool token_goes_to(const Problem& p, int s, std::int64_t t, int d) {
  for (int k = 0; k < p.num_topk; ++k) {
    const std::int64_t e = topk(p, s, t, k);
    if (e >= 0 && rank_of_expert(p, e) == d) return true;
  }
  return false;
}

void check_rank(const Problem& p, int rank) {
  if (rank < 0 || rank >= p.num_ranks)
    bad("rank " + std::to_string(rank) + " outside [0, " + std::to_string(p.num_ranks) + ")");
}

void check_options(const DispatchOptions& o) {
  if (o.alignment < 1) bad("alignment " + std::to_string(o.alignment) + " < 1");
  if (o.worst < 0) bad("worst " + std::to_string(o.worst) + " < 0");
}

/// Slots (s,t,k) over all ranks whose expert is e, for every global expert e ([E]).
/// n_j on rank d is slots_per_expert[d*L + j].
std::vector<std::int64_t> slots_per_expert(const Problem& p) {
  std::vector<std::int64_t> n(idx(p.num_experts), 0);
  for (int s = 0; s < p.num_ranks; ++s)
    for (std::int64_t t = 0; t < p.ranks[idx(s)].num_tokens; ++t)
      for (int k = 0; k < p.num_topk; ++k) {
        const std::int64_t e = topk(p, s, t, k);
        if (e >= 0) n[idx(e)] += 1;
      }
  return n;
}

/// Copies the x row of token (s,t) into row `row` of the dispatch output.
void copy_x_row(const Problem& p, int s, std::int64_t t, DispatchOut& out, std::int64_t row) {
  const RankInput& in = p.ranks[idx(s)];
  const std::int64_t H = p.hidden;
  if (p.fp8) {
    const std::int64_t B = H / kBlock;
    for (std::int64_t h = 0; h < H; ++h) out.recv_x_fp8[idx(row * H + h)] = in.x_fp8[idx(t * H + h)];
    for (std::int64_t b = 0; b < B; ++b) out.recv_x_scales[idx(row * B + b)] = in.x_scales[idx(t * B + b)];
  } else {
    for (std::int64_t h = 0; h < H; ++h) out.recv_x[idx(row * H + h)] = in.x[idx(t * H + h)];
  }
}

/// Allocates the x arrays of `out` for `rows` rows, all zero bits (padding).
void alloc_x(const Problem& p, DispatchOut& out, std::int64_t rows) {
  const std::int64_t H = p.hidden;
  if (p.fp8) {
    out.recv_x_fp8.assign(idx(rows * H), 0);
    out.recv_x_scales.assign(idx(rows * (H / kBlock)), 0.0f);
  } else {
    out.recv_x.assign(idx(rows * H), 0);
  }
}

std::string describe_slot(int s, std::int64_t t, int k) {
  return "rank " + std::to_string(s) + ", token " + std::to_string(t) + ", slot " + std::to_string(k);
}

}  // namespace

// ---------------------------------------------------------------------------------------

void validate(const Problem& p) {
  if (p.num_ranks < 1) bad("num_ranks " + std::to_string(p.num_ranks) + " < 1");
  if (p.num_experts < 1) bad("num_experts " + std::to_string(p.num_experts) + " < 1");
  if (p.num_experts % p.num_ranks != 0)
    bad("num_experts " + std::to_string(p.num_experts) + " is not a multiple of num_ranks " +
        std::to_string(p.num_ranks));
  if (p.hidden < 1) bad("hidden " + std::to_string(p.hidden) + " < 1");
  if (p.num_topk < 1) bad("num_topk " + std::to_string(p.num_topk) + " < 1");
  if (p.fp8 && p.hidden % kBlock != 0) bad("fp8 with hidden " + std::to_string(p.hidden) + " % 128 != 0");
  if (p.ranks.size() != idx(p.num_ranks))
    bad("ranks.size() " + std::to_string(p.ranks.size()) + " != num_ranks " + std::to_string(p.num_ranks));
  const std::int64_t H = p.hidden, K = p.num_topk;
  for (int s = 0; s < p.num_ranks; ++s) {
    const RankInput& in = p.ranks[idx(s)];
    const std::int64_t S = in.num_tokens;
    const std::string where = "rank " + std::to_string(s) + ": ";
    if (S < 0) bad(where + "num_tokens " + std::to_string(S) + " < 0");
    if (in.topk_idx.size() != idx(S * K)) bad(where + "topk_idx size " + std::to_string(in.topk_idx.size()));
    if (in.topk_weights.size() != idx(S * K))
      bad(where + "topk_weights size " + std::to_string(in.topk_weights.size()));
    if (p.fp8) {
      if (in.x_fp8.size() != idx(S * H)) bad(where + "x_fp8 size " + std::to_string(in.x_fp8.size()));
      if (in.x_scales.size() != idx(S * (H / kBlock)))
        bad(where + "x_scales size " + std::to_string(in.x_scales.size()));
    } else {
      if (in.x.size() != idx(S * H)) bad(where + "x size " + std::to_string(in.x.size()));
    }
    for (std::int64_t t = 0; t < S; ++t) {
      for (int k = 0; k < p.num_topk; ++k) {
        const std::int64_t e = topk(p, s, t, k);
        if (e < -1 || e >= p.num_experts)
          bad(describe_slot(s, t, k) + ": topk_idx " + std::to_string(e) + " outside [-1, " +
              std::to_string(p.num_experts) + ")");
        if (e < 0) continue;
        for (int k2 = 0; k2 < k; ++k2)
          if (topk(p, s, t, k2) == e)
            bad(describe_slot(s, t, k) + ": expert " + std::to_string(e) + " already used in slot " +
                std::to_string(k2));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// docs/spec.md §2

Layout layout(const Problem& p, int rank) {
  validate(p);
  check_rank(p, rank);
  const RankInput& in = p.ranks[idx(rank)];
  const int P = p.num_ranks;
  Layout out;
  out.num_tokens_per_rank.assign(idx(P), 0);
  out.num_tokens_per_expert.assign(idx(p.num_experts), 0);
  out.is_token_in_rank.assign(idx(in.num_tokens * P), 0);
  for (std::int64_t t = 0; t < in.num_tokens; ++t) {
    for (int k = 0; k < p.num_topk; ++k) {
      const std::int64_t e = topk(p, rank, t, k);
      if (e >= 0) out.num_tokens_per_expert[idx(e)] += 1;
    }
    for (int d = 0; d < P; ++d) {
      if (token_goes_to(p, rank, t, d)) {
        out.is_token_in_rank[idx(t * P + d)] = 1;
        out.num_tokens_per_rank[idx(d)] += 1;
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// docs/spec.md §3

std::int64_t align_up(std::int64_t n, std::int64_t a) { return (n + a - 1) / a * a; }

std::int64_t rows_needed(const Problem& p, int rank, const DispatchOptions& o) {
  validate(p);
  check_rank(p, rank);
  check_options(o);
  std::int64_t n = 0;
  if (o.expanded) {
    const std::vector<std::int64_t> slots = slots_per_expert(p);
    const int L = local_experts(p);
    for (int j = 0; j < L; ++j) n += align_up(slots[idx(rank * L + j)], o.alignment);
  } else {
    for (int s = 0; s < p.num_ranks; ++s)
      for (std::int64_t t = 0; t < p.ranks[idx(s)].num_tokens; ++t)
        if (token_goes_to(p, s, t, rank)) ++n;
  }
  return n;
}

DispatchOut dispatch(const Problem& p, int rank, const DispatchOptions& o) {
  validate(p);
  check_rank(p, rank);
  check_options(o);
  const int d = rank;
  const int L = local_experts(p);
  const int K = p.num_topk;

  // docs/spec.md §3.3: every rank's call fails if any rank needs more than W rows.
  if (o.worst > 0) {
    for (int r = 0; r < p.num_ranks; ++r) {
      const std::int64_t need = rows_needed(p, r, o);
      if (need > o.worst) {
        std::ostringstream msg;
        msg << "epx::ref: rank " << r << " needs " << need << " rows but num_worst_tokens is " << o.worst;
        throw std::runtime_error(msg.str());
      }
    }
  }

  DispatchOut out;
  const std::int64_t needed = rows_needed(p, d, o);
  out.rows = o.worst > 0 ? o.worst : needed;
  alloc_x(p, out, out.rows);
  out.num_recv_tokens_per_expert.assign(idx(L), 0);
  out.num_recv_tokens_per_expert_aligned.assign(idx(L), 0);

  if (!o.expanded) {
    // docs/spec.md §3.1: one row per (s,t) with a slot on d, (s,t) ascending.
    out.recv_topk_idx.assign(idx(out.rows * K), -1);
    out.recv_topk_weights.assign(idx(out.rows * K), 0.0f);
    out.recv_src.assign(idx(out.rows * 2), -1);
    std::int64_t row = 0;
    for (int s = 0; s < p.num_ranks; ++s) {
      for (std::int64_t t = 0; t < p.ranks[idx(s)].num_tokens; ++t) {
        if (!token_goes_to(p, s, t, d)) continue;
        copy_x_row(p, s, t, out, row);
        for (int k = 0; k < K; ++k) {
          const std::int64_t e = topk(p, s, t, k);
          if (e >= 0 && rank_of_expert(p, e) == d) {
            const std::int64_t j = e - static_cast<std::int64_t>(d) * L;
            out.recv_topk_idx[idx(row * K + k)] = j;
            out.recv_topk_weights[idx(row * K + k)] = p.ranks[idx(s)].topk_weights[idx(t * K + k)];
            out.num_recv_tokens_per_expert[idx(j)] += 1;
          }
        }
        out.recv_src[idx(row * 2 + 0)] = s;
        out.recv_src[idx(row * 2 + 1)] = t;
        ++row;
      }
    }
    for (int j = 0; j < L; ++j)
      out.num_recv_tokens_per_expert_aligned[idx(j)] = align_up(out.num_recv_tokens_per_expert[idx(j)], o.alignment);
    return out;
  }

  // docs/spec.md §3.2: one row per slot (s,t,k) on d, grouped by local expert j, each group padded
  // to a multiple of the alignment; inside a group (s,t) ascending (deterministic mode).
  out.recv_weights.assign(idx(out.rows), 0.0f);
  out.recv_src.assign(idx(out.rows * 3), -1);
  out.expert_offsets.assign(idx(L + 1), 0);
  std::int64_t offset = 0;
  for (int j = 0; j < L; ++j) {
    out.expert_offsets[idx(j)] = offset;
    const std::int64_t e = static_cast<std::int64_t>(d) * L + j;
    std::int64_t n = 0;
    for (int s = 0; s < p.num_ranks; ++s) {
      for (std::int64_t t = 0; t < p.ranks[idx(s)].num_tokens; ++t) {
        for (int k = 0; k < K; ++k) {
          if (topk(p, s, t, k) != e) continue;
          const std::int64_t row = offset + n;
          copy_x_row(p, s, t, out, row);
          out.recv_weights[idx(row)] = p.ranks[idx(s)].topk_weights[idx(t * K + k)];
          out.recv_src[idx(row * 3 + 0)] = s;
          out.recv_src[idx(row * 3 + 1)] = t;
          out.recv_src[idx(row * 3 + 2)] = k;
          ++n;
        }
      }
    }
    out.num_recv_tokens_per_expert[idx(j)] = n;
    out.num_recv_tokens_per_expert_aligned[idx(j)] = align_up(n, o.alignment);
    offset += align_up(n, o.alignment);
  }
  out.expert_offsets[idx(L)] = offset;
  return out;
}

std::vector<DispatchOut> dispatch_all(const Problem& p, const DispatchOptions& o) {
  std::vector<DispatchOut> outs;
  for (int d = 0; d < p.num_ranks; ++d) outs.push_back(dispatch(p, d, o));
  return outs;
}

// ---------------------------------------------------------------------------------------
// docs/spec.md §7 expert function

float expert_factor(std::int64_t n) {
  if (n < 0 || n > (std::int64_t{1} << 30)) bad("expert_factor: n " + std::to_string(n) + " out of range");
  std::int64_t power = 1;  // 256^(n mod 4)
  for (std::int64_t i = 0; i < n % 4; ++i) power *= 256;
  const std::int64_t c = (n + 1) * power;  // exact: < 2^31 * 2^24
  return static_cast<float>(c);            // one rounding, to nearest even
}

std::vector<std::uint16_t> expert_fn(const Problem& p, const DispatchOut& d, const DispatchOptions& o) {
  validate(p);
  const std::int64_t H = p.hidden;
  const int K = p.num_topk;
  const int L = local_experts(p);
  const std::int64_t src_width = o.expanded ? 3 : 2;
  if (d.recv_src.size() != idx(d.rows * src_width)) bad("expert_fn: recv_src size does not match rows");
  std::vector<std::uint16_t> y(idx(d.rows * H), 0);
  for (std::int64_t row = 0; row < d.rows; ++row) {
    if (d.recv_src[idx(row * src_width)] == -1) continue;  // padding row → zero row
    std::int64_t n = 0;
    if (o.expanded) {
      int j = -1;
      for (int jj = 0; jj < L; ++jj)
        if (d.expert_offsets[idx(jj)] <= row && row < d.expert_offsets[idx(jj + 1)]) j = jj;
      if (j < 0) bad("expert_fn: row " + std::to_string(row) + " belongs to no expert");
      n = j;
    } else {
      for (int k = 0; k < K; ++k) {
        const std::int64_t j = d.recv_topk_idx[idx(row * K + k)];
        if (j >= 0) n += j;
      }
    }
    const float c = expert_factor(n);
    for (std::int64_t h = 0; h < H; ++h) {
      float v;
      if (p.fp8) {
        const float q = e4m3_to_f32(d.recv_x_fp8[idx(row * H + h)]);
        const float scale = d.recv_x_scales[idx(row * (H / kBlock) + h / kBlock)];
        v = q * scale;
      } else {
        v = bf16_to_f32(d.recv_x[idx(row * H + h)]);
      }
      const float prod = v * c;
      y[idx(row * H + h)] = f32_to_bf16(prod);
    }
  }
  return y;
}

// ---------------------------------------------------------------------------------------
// docs/spec.md §4 combine

std::vector<std::uint16_t> combine(const Problem& p, const DispatchOptions& o,
                                   const std::vector<std::vector<std::uint16_t>>& y,
                                   const std::vector<std::vector<std::uint16_t>>* bias0,
                                   const std::vector<std::vector<std::uint16_t>>* bias1, bool weighted,
                                   int rank) {
  return combine(p, o, dispatch_all(p, o), y, bias0, bias1, weighted, rank);
}

std::vector<std::uint16_t> combine(const Problem& p, const DispatchOptions& o, const std::vector<DispatchOut>& outs,
                                   const std::vector<std::vector<std::uint16_t>>& y,
                                   const std::vector<std::vector<std::uint16_t>>* bias0,
                                   const std::vector<std::vector<std::uint16_t>>* bias1, bool weighted,
                                   int rank, const std::vector<int>* node_of_rank) {
  validate(p);
  if (node_of_rank != nullptr && node_of_rank->size() != idx(p.num_ranks)) bad("combine: node_of_rank needs one entry per rank");
  check_rank(p, rank);
  check_options(o);
  const int P = p.num_ranks;
  const int K = p.num_topk;
  const std::int64_t H = p.hidden;
  const int s = rank;
  const std::int64_t S = p.ranks[idx(s)].num_tokens;
  if (weighted && !o.expanded) bad("weighted combine asked for the compact layout");
  if (outs.size() != idx(P)) bad("combine: need one dispatch output per rank");
  if (y.size() != idx(P)) bad("combine: y needs one entry per rank");
  for (int d = 0; d < P; ++d)
    if (y[idx(d)].size() != idx(outs[idx(d)].rows * H))
      bad("combine: y of rank " + std::to_string(d) + " has " + std::to_string(y[idx(d)].size()) +
          " values, expected rows " + std::to_string(outs[idx(d)].rows) + " * H " + std::to_string(H));
  for (const auto* bias : {bias0, bias1}) {
    if (bias == nullptr) continue;
    if (bias->size() != idx(P)) bad("combine: bias needs one entry per rank");
    if ((*bias)[idx(s)].size() != idx(S * H))
      bad("combine: bias of rank " + std::to_string(s) + " has " + std::to_string((*bias)[idx(s)].size()) +
          " values, expected " + std::to_string(S * H));
  }

  // Where each of rank s's tokens / slots landed on each destination d.
  std::vector<std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t>> compact_row(idx(P));
  std::vector<std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::int64_t>> expanded_row(idx(P));
  for (int d = 0; d < P; ++d) {
    const DispatchOut& out = outs[idx(d)];
    for (std::int64_t row = 0; row < out.rows; ++row) {
      if (o.expanded) {
        const std::int64_t rs = out.recv_src[idx(row * 3)], rt = out.recv_src[idx(row * 3 + 1)],
                           rk = out.recv_src[idx(row * 3 + 2)];
        if (rs == s) expanded_row[idx(d)][{rs, rt, rk}] = row;
      } else {
        const std::int64_t rs = out.recv_src[idx(row * 2)], rt = out.recv_src[idx(row * 2 + 1)];
        if (rs == s) compact_row[idx(d)][{rs, rt}] = row;
      }
    }
  }
  auto find_row = [&](int d, std::int64_t t, int k) -> std::int64_t {
    if (o.expanded) {
      const auto it = expanded_row[idx(d)].find({s, t, k});
      if (it == expanded_row[idx(d)].end()) bad("combine: slot missing from the dispatch output");
      return it->second;
    }
    const auto it = compact_row[idx(d)].find({s, t});
    if (it == compact_row[idx(d)].end()) bad("combine: token missing from the dispatch output");
    return it->second;
  };

  std::vector<std::uint16_t> result(idx(S * H), 0);
  for (std::int64_t t = 0; t < S; ++t) {
    // The addends after the biases, in the order of docs/spec.md §4. Expanded: one group per destination with
    // the token's slots there in ascending k, groups ordered by their largest k. Compact: one
    // "group" per destination d ascending (its single row).
    struct Group {
      int dest;
      std::vector<int> slots;           // ascending k (expanded); {0} for compact
      std::vector<std::int64_t> rows;   // row of each slot in y[dest]
    };
    std::vector<Group> groups;
    if (o.expanded) {
      for (int d = 0; d < P; ++d) {
        Group g{d, {}, {}};
        for (int k = 0; k < K; ++k) {
          const std::int64_t e = topk(p, s, t, k);
          if (e >= 0 && rank_of_expert(p, e) == d) g.slots.push_back(k);
        }
        if (!g.slots.empty()) groups.push_back(g);
      }
      // Order by largest k (distinct per group since slots are disjoint). Plain insertion sort.
      for (std::size_t i = 1; i < groups.size(); ++i)
        for (std::size_t j = i; j > 0 && groups[j - 1].slots.back() > groups[j].slots.back(); --j)
          std::swap(groups[j - 1], groups[j]);
    } else {
      for (int d = 0; d < P; ++d)
        if (token_goes_to(p, s, t, d)) groups.push_back(Group{d, {0}, {}});
    }
    for (Group& g : groups)
      for (int k : g.slots) g.rows.push_back(find_row(g.dest, t, k));

    // The partial of group g in column h: expanded p_G (or y[row] unchanged), compact y_d[row].
    auto partial_of = [&](const Group& g, std::int64_t h) -> std::uint16_t {
      const std::vector<std::uint16_t>& yd = y[idx(g.dest)];
      if (!o.expanded || (!weighted && g.slots.size() == 1)) return yd[idx(g.rows[0] * H + h)];  // unchanged
      float sum = 0.0f;
      for (std::int64_t row : g.rows) {
        float a = bf16_to_f32(yd[idx(row * H + h)]);
        if (weighted) {
          const float w = outs[idx(g.dest)].recv_weights[idx(row)];
          a = a * w;
        }
        sum = sum + a;
      }
      return f32_to_bf16(sum);
    };
    // Node first: the nodes holding a group, ascending, and per node its groups by ascending dest.
    std::vector<std::vector<const Group*>> by_node;
    if (node_of_rank != nullptr) {
      std::map<int, std::map<int, const Group*>> nodes;
      for (const Group& g : groups) nodes[(*node_of_rank)[idx(g.dest)]][g.dest] = &g;
      for (const auto& [node, members] : nodes) {
        by_node.emplace_back();
        for (const auto& [dest, g] : members) by_node.back().push_back(g);
      }
    }

    for (std::int64_t h = 0; h < H; ++h) {
      float acc = bias0 != nullptr ? bf16_to_f32((*bias0)[idx(s)][idx(t * H + h)]) : 0.0f;
      const float b1 = bias1 != nullptr ? bf16_to_f32((*bias1)[idx(s)][idx(t * H + h)]) : 0.0f;
      acc = acc + b1;
      if (node_of_rank == nullptr) {
        for (const Group& g : groups) {
          const float pf = bf16_to_f32(partial_of(g, h));
          acc = acc + pf;
        }
      } else {
        for (const std::vector<const Group*>& node : by_node) {
          std::uint16_t q;
          if (node.size() == 1) {
            q = partial_of(*node[0], h);  // a node with a single term passes it unchanged
          } else {
            float sum = 0.0f;
            for (const Group* g : node) {
              const float pf = bf16_to_f32(partial_of(*g, h));
              sum = sum + pf;
            }
            q = f32_to_bf16(sum);
          }
          const float qf = bf16_to_f32(q);
          acc = acc + qf;
        }
      }
      result[idx(t * H + h)] = f32_to_bf16(acc);
    }
  }
  return result;
}

// ---------------------------------------------------------------------------------------
// Conversions

namespace {

/// f32 value of a bf16 code, decoded from its sign / exponent / mantissa fields.
float decode_bf16(std::uint16_t b) {
  const bool negative = (b >> 15) != 0;
  const int exponent = (b >> 7) & 0xff;
  const int mantissa = b & 0x7f;
  if (exponent == 0xff) {
    if (mantissa == 0) return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    return bits_float(static_cast<std::uint32_t>(b) << 16);  // NaN: keep every payload bit
  }
  // Subnormal: mantissa * 2^(1 - 127 - 7); normal: (128 + mantissa) * 2^(exponent - 127 - 7).
  const double magnitude = exponent == 0 ? std::ldexp(static_cast<double>(mantissa), -133)
                                         : std::ldexp(static_cast<double>(128 + mantissa), exponent - 134);
  const float f = static_cast<float>(magnitude);  // exact
  return negative ? -f : f;                        // -0.0 for 0x8000
}

/// f32 value of an E4M3 code (NaN, sign kept, for 0x7f / 0xff).
float decode_e4m3(std::uint8_t q) {
  const bool negative = (q >> 7) != 0;
  const int exponent = (q >> 3) & 0xf;
  const int mantissa = q & 0x7;
  if (exponent == 0xf && mantissa == 0x7) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return negative ? -nan : nan;
  }
  // Subnormal: mantissa * 2^(1 - 7 - 3); normal: (8 + mantissa) * 2^(exponent - 7 - 3).
  const double magnitude = exponent == 0 ? std::ldexp(static_cast<double>(mantissa), -9)
                                         : std::ldexp(static_cast<double>(8 + mantissa), exponent - 10);
  const float f = static_cast<float>(magnitude);
  return negative ? -f : f;
}

}  // namespace

// The decoders are looked up in tables of decode_*() over every code (built once), only
// to keep the reference fast enough for large multi-rank tests.
float bf16_to_f32(std::uint16_t b) {
  static const std::vector<float> table = [] {
    std::vector<float> v(65536);
    for (std::uint32_t c = 0; c < 65536; ++c) v[c] = decode_bf16(static_cast<std::uint16_t>(c));
    return v;
  }();
  return table[b];
}

std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  if (std::isinf(f)) return static_cast<std::uint16_t>(u >> 16);
  // The two bf16 magnitudes around |f|: lo = |f| truncated, hi = the next one up (0x7f80 =
  // inf above the largest finite, whose "value" for rounding purposes is 2^128).
  const std::uint16_t lo_code = static_cast<std::uint16_t>((u & 0x7fffffffu) >> 16);
  const std::uint16_t hi_code = static_cast<std::uint16_t>(lo_code + 1);
  const double a = std::fabs(static_cast<double>(f));
  const double lo = bf16_to_f32(lo_code);
  const double hi = hi_code == 0x7f80 ? std::ldexp(1.0, 128) : static_cast<double>(bf16_to_f32(hi_code));
  // Compare |f| with the midpoint exactly: 2a vs lo + hi (both exact in double).
  std::uint16_t code;
  if (2.0 * a < lo + hi) {
    code = lo_code;
  } else if (2.0 * a > lo + hi) {
    code = hi_code;
  } else {
    code = (lo_code % 2 == 0) ? lo_code : hi_code;  // tie → even mantissa
  }
  return static_cast<std::uint16_t>(sign | code);
}

float e4m3_to_f32(std::uint8_t q) {
  static const std::vector<float> table = [] {
    std::vector<float> v(256);
    for (std::uint32_t c = 0; c < 256; ++c) v[c] = decode_e4m3(static_cast<std::uint8_t>(c));
    return v;
  }();
  return table[q];
}

std::uint8_t f32_to_e4m3(float f) {
  // The 127 non-negative finite codes 0x00..0x7e, whose values ascend with the code.
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (int code = 0; code <= 0x7e; ++code) v.push_back(e4m3_to_f32(static_cast<std::uint8_t>(code)));
    return v;
  }();
  const std::uint8_t sign = (float_bits(f) >> 31) != 0 ? 0x80 : 0x00;
  if (std::isnan(f)) return static_cast<std::uint8_t>(0x7f | sign);
  const double a = std::fabs(static_cast<double>(f));
  // c = the largest code whose value is <= |f| (binary search over the sorted table).
  int c = 0, above = 0x7f;  // values[c] <= a; values[above] > a (0x7f: past the table)
  while (above - c > 1) {
    const int mid = (c + above) / 2;
    if (values[idx(mid)] <= a) c = mid; else above = mid;
  }
  if (c == 0x7e) return static_cast<std::uint8_t>(0x7e | sign);  // saturate at 448 (inf too)
  const double lo = values[idx(c)];
  const double hi = values[idx(c + 1)];
  int code;
  if (2.0 * a < lo + hi) {
    code = c;
  } else if (2.0 * a > lo + hi) {
    code = c + 1;
  } else {
    code = (c % 2 == 0) ? c : c + 1;  // tie → even mantissa
  }
  return static_cast<std::uint8_t>(code | sign);
}

void cast_to_fp8(const std::vector<float>& x, std::int64_t rows, int hidden, bool ue8m0,
                 std::vector<std::uint8_t>& q, std::vector<float>& scales) {
  if (rows < 0) bad("cast_to_fp8: rows < 0");
  if (hidden < 1 || hidden % kBlock != 0) bad("cast_to_fp8: hidden " + std::to_string(hidden) + " % 128 != 0");
  if (x.size() != idx(rows * hidden)) bad("cast_to_fp8: x size does not match rows * hidden");
  const std::int64_t H = hidden, B = hidden / kBlock;
  q.assign(idx(rows * H), 0);
  scales.assign(idx(rows * B), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t b = 0; b < B; ++b) {
      float amax = 0.0f;
      for (std::int64_t i = 0; i < kBlock; ++i) {
        const float v = std::fabs(x[idx(r * H + b * kBlock + i)]);
        if (v > amax) amax = v;
      }
      if (amax < 1e-4f) amax = 1e-4f;
      float scale;
      if (ue8m0) {
        // 2^ceil(log2(amax / 448)), exactly: amax/448 = m * 2^e with m in [0.5, 1).
        const float ratio = amax / 448.0f;
        int e = 0;
        const float m = std::frexp(ratio, &e);
        const int ceil_log2 = (m == 0.5f) ? e - 1 : e;
        scale = std::ldexp(1.0f, ceil_log2);
        for (std::int64_t i = 0; i < kBlock; ++i) {
          const std::int64_t at = r * H + b * kBlock + i;
          const float v = x[idx(at)] / scale;
          q[idx(at)] = f32_to_e4m3(v);
        }
      } else {
        const float inv = 448.0f / amax;
        scale = amax / 448.0f;
        for (std::int64_t i = 0; i < kBlock; ++i) {
          const std::int64_t at = r * H + b * kBlock + i;
          const float v = x[idx(at)] * inv;
          q[idx(at)] = f32_to_e4m3(v);
        }
      }
      scales[idx(r * B + b)] = scale;
    }
  }
}

std::vector<float> dequant_fp8(const std::vector<std::uint8_t>& q, const std::vector<float>& scales,
                               std::int64_t rows, int hidden) {
  if (rows < 0) bad("dequant_fp8: rows < 0");
  if (hidden < 1 || hidden % kBlock != 0) bad("dequant_fp8: hidden " + std::to_string(hidden) + " % 128 != 0");
  const std::int64_t H = hidden, B = hidden / kBlock;
  if (q.size() != idx(rows * H) || scales.size() != idx(rows * B)) bad("dequant_fp8: sizes do not match");
  std::vector<float> out(idx(rows * H));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t h = 0; h < H; ++h) {
      const float v = e4m3_to_f32(q[idx(r * H + h)]);
      out[idx(r * H + h)] = v * scales[idx(r * B + h / kBlock)];
    }
  return out;
}

}  // namespace epx::ref
