#include "epx/bench/routing.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "epx/dtype.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/spi/resources.hpp"
#include "epx/fp8.hpp"
#include "epx/plan.hpp"
#include "epx/io/npy.hpp"
#include "epx/io/replay.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

std::size_t BenchProblem::x_row_bytes() const noexcept {
  const auto H = static_cast<std::size_t>(hidden);
  return fp8 ? H + H / 128 * sizeof(float) : H * 2;
}

namespace {

// memcpy that accepts the null pointers of empty vectors (a rank with S = 0).
void copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

// splitmix64: fast, good enough for synthetic inputs, the same on every platform.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::uint64_t below(std::uint64_t n) noexcept { return next() % n; }
};

std::uint64_t rank_seed(std::uint64_t seed, int r, std::uint64_t stream) {
  Rng g(seed * 0x100000001b3ULL + static_cast<std::uint64_t>(r) * 0x9e3779b97f4a7c15ULL + stream);
  return g.next();
}

// Random bf16 in about ±[2^-7, 2): sign, exponent 120..127, random mantissa.
Tensor random_bf16(std::int64_t S, int H, std::uint64_t seed) {
  Tensor x(DType::kBF16, {S, H});
  auto* p = x.as<std::uint16_t>();
  Rng g(seed);
  const std::int64_t n = S * H;
  for (std::int64_t i = 0; i < n; i += 4) {
    std::uint64_t bits = g.next();
    for (std::int64_t j = i; j < std::min(n, i + 4); ++j, bits >>= 16) {
      const auto b = static_cast<std::uint16_t>(bits);
      p[j] = static_cast<std::uint16_t>((b & 0x8000u) | ((120u + ((b >> 7) & 7u)) << 7) | (b & 0x7fu));
    }
  }
  return x;
}

void to_fp8(const Tensor& bf16, BenchRankInput& in) {
  const std::int64_t S = bf16.shape()[0], H = bf16.shape()[1];
  Tensor f(DType::kF32, {S, H});
  for (std::int64_t i = 0; i < S * H; ++i) f.as<float>()[i] = bf16_to_f32(bf16.as<std::uint16_t>()[i]);
  Fp8Tensor q = cast_to_fp8(f.view());
  in.x = std::move(q.data);
  in.x_scales = std::move(q.scales);
}

void random_x(BenchRankInput& in, int H, bool fp8, std::uint64_t seed) {
  Tensor x = random_bf16(in.tokens, H, seed);
  if (fp8)
    to_fp8(x, in);
  else
    in.x = std::move(x);
}

// Weights: positive, summing to 1 over the valid slots of a token.
void random_weights(BenchRankInput& in, int K, Rng& g) {
  in.topk_weights.assign(in.topk_idx.size(), 0.0f);
  for (std::int64_t t = 0; t < in.tokens; ++t) {
    float sum = 0;
    for (int k = 0; k < K; ++k) {
      const auto i = static_cast<std::size_t>(t * K + k);
      if (in.topk_idx[i] < 0) continue;
      in.topk_weights[i] = static_cast<float>(0.05 + g.uniform());
      sum += in.topk_weights[i];
    }
    for (int k = 0; k < K; ++k)
      if (sum > 0) in.topk_weights[static_cast<std::size_t>(t * K + k)] /= sum;
  }
}

// One token's K experts: uniform distinct (a partial Fisher-Yates shuffle), group-limited
// on uniform scores, or Zipf-like (Efraimidis-Spirakis: top K of u^(1/w), no repeats).
struct TokenRouter {
  const BenchOptions& o;
  std::vector<double> w;  // Zipf weights
  std::vector<int> perm;
  std::vector<std::pair<double, int>> keys;
  std::vector<double> scores;

  explicit TokenRouter(const BenchOptions& opt)
      : o(opt), w(static_cast<std::size_t>(opt.experts)), perm(w.size()), keys(w.size()), scores(w.size()) {
    for (int e = 0; e < o.experts; ++e) w[static_cast<std::size_t>(e)] = std::pow(static_cast<double>(e + 1), -o.skew);
  }

  void route(Rng& g, std::int64_t* row) {
    const int E = o.experts, K = o.topk;
    if (o.groups > 0) {
      for (double& s : scores) s = g.uniform();
      group_limited_topk(scores.data(), E, o.groups, o.topk_groups, K, row);
    } else if (o.skew <= 0) {
      std::iota(perm.begin(), perm.end(), 0);
      for (int k = 0; k < K; ++k) {
        const auto j = static_cast<std::size_t>(k) + g.below(static_cast<std::uint64_t>(E - k));
        std::swap(perm[static_cast<std::size_t>(k)], perm[j]);
        row[k] = perm[static_cast<std::size_t>(k)];
      }
    } else {
      for (int e = 0; e < E; ++e) {
        const double u = std::max(g.uniform(), 1e-300);
        keys[static_cast<std::size_t>(e)] = {std::log(u) / w[static_cast<std::size_t>(e)], e};
      }
      std::partial_sort(keys.begin(), keys.begin() + K, keys.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      for (int k = 0; k < K; ++k) row[k] = keys[static_cast<std::size_t>(k)].second;
    }
  }
};

BenchProblem generate(const BenchOptions& o) {
  BenchProblem p;
  p.ranks = o.ranks;
  p.experts = o.experts;
  p.hidden = o.hidden;
  p.topk = o.topk;
  p.max_tokens = o.tokens;
  p.fp8 = o.fp8;
  char desc[160];
  if (o.skew > 0)
    std::snprintf(desc, sizeof desc, "zipf-like top-%d, expert e weighted 1/(e+1)^%.3g, seed %llu", o.topk, o.skew,
                  static_cast<unsigned long long>(o.seed));
  else if (o.groups > 0)
    std::snprintf(desc, sizeof desc, "group-limited top-%d (%d of %d groups, uniform scores), seed %llu", o.topk, o.topk_groups,
                  o.groups, static_cast<unsigned long long>(o.seed));
  else
    std::snprintf(desc, sizeof desc, "uniform top-%d, seed %llu", o.topk, static_cast<unsigned long long>(o.seed));
  p.source = desc;
  const int K = o.topk;
  TokenRouter router(o);
  p.rank.resize(static_cast<std::size_t>(o.ranks));
  for (int r = 0; r < o.ranks; ++r) {
    BenchRankInput& in = p.rank[static_cast<std::size_t>(r)];
    in.tokens = o.tokens;
    in.topk_idx.resize(static_cast<std::size_t>(o.tokens * K));
    Rng g(rank_seed(o.seed, r, 1));
    for (std::int64_t t = 0; t < o.tokens; ++t) router.route(g, in.topk_idx.data() + t * K);
    random_weights(in, K, g);
    random_x(in, o.hidden, o.fp8, rank_seed(o.seed, r, 2));
  }
  return p;
}

[[noreturn]] void rank_error(int r, const std::string& what, ErrorCode code = ErrorCode::kIo) {
  throw Error(code, "rank " + std::to_string(r) + ": " + what, r);
}

NpyArray read_rank(const fs::path& dir, int r, const char* name) {
  try {
    return read_npy(dir / ("rank" + std::to_string(r)) / name);
  } catch (const Error& e) {
    rank_error(r, e.what(), e.code());
  }
}

void expect(const NpyArray& a, int r, const char* name, const char* descr, std::int64_t d0, std::int64_t d1) {
  if (a.descr != descr || a.shape.size() != 2 || a.shape[0] != d0 || a.shape[1] != d1) {
    std::string shape = "[";
    for (std::size_t i = 0; i < a.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(a.shape[i]);
    rank_error(r, std::string(name) + " must be [" + std::to_string(d0) + ", " + std::to_string(d1) + "] '" + descr +
                      "', got " + shape + "] '" + a.descr + "'",
               ErrorCode::kShapeMismatch);
  }
}

// Rank r's topk_idx (checked against meta.json and the expert count) and topk_weights
// (random when the file is absent).
void load_routing(const fs::path& in, int r, const BenchProblem& p, const BenchOptions& o, BenchRankInput& ri) {
  const int K = p.topk;
  const NpyArray idx = read_rank(in, r, "topk_idx.npy");
  if (idx.shape.size() != 2) rank_error(r, "topk_idx.npy must be 2-D [S, K]", ErrorCode::kShapeMismatch);
  ri.tokens = idx.shape[0];
  expect(idx, r, "topk_idx.npy", "<i8", ri.tokens, K);
  if (ri.tokens > p.max_tokens)
    rank_error(r, "topk_idx.npy has S = " + std::to_string(ri.tokens) + " tokens but num_max_tokens_per_rank is " +
                      std::to_string(p.max_tokens),
               ErrorCode::kCapacityExceeded);
  ri.topk_idx.resize(static_cast<std::size_t>(ri.tokens * K));
  copy_bytes(ri.topk_idx.data(), idx.data.data(), ri.topk_idx.size() * sizeof(std::int64_t));
  if (auto issue = check_topk_idx(ri.topk_idx.data(), RoutingShape{ri.tokens, K, p.experts, p.ranks}))
    rank_error(r, "topk_idx.npy: " + issue->message, ErrorCode::kInvalidArgument);
  if (fs::exists(in / ("rank" + std::to_string(r)) / "topk_weights.npy")) {
    const NpyArray w = read_rank(in, r, "topk_weights.npy");
    expect(w, r, "topk_weights.npy", "<f4", ri.tokens, K);
    ri.topk_weights.resize(ri.topk_idx.size());
    copy_bytes(ri.topk_weights.data(), w.data.data(), ri.topk_weights.size() * sizeof(float));
  } else {
    Rng g(rank_seed(o.seed, r, 3));
    random_weights(ri, K, g);
  }
}

// Rank r's x: x_fp8.npy + x_scales.npy, or x.npy (cast to FP8 with --fp8), or random rows.
void load_x(const fs::path& in, int r, const BenchProblem& p, const BenchOptions& o, BenchRankInput& ri) {
  const int H = p.hidden;
  const fs::path rd = in / ("rank" + std::to_string(r));
  if (p.fp8 && fs::exists(rd / "x_fp8.npy")) {
    const NpyArray x = read_rank(in, r, "x_fp8.npy");
    const NpyArray s = read_rank(in, r, "x_scales.npy");
    expect(x, r, "x_fp8.npy", "|u1", ri.tokens, H);
    expect(s, r, "x_scales.npy", "<f4", ri.tokens, H / 128);
    ri.x = Tensor(DType::kFP8E4M3, {ri.tokens, H});
    copy_bytes(ri.x.data(), x.data.data(), ri.x.nbytes());
    ri.x_scales = Tensor(DType::kF32, {ri.tokens, H / 128});
    copy_bytes(ri.x_scales.data(), s.data.data(), ri.x_scales.nbytes());
  } else if (fs::exists(rd / "x.npy")) {
    const NpyArray x = read_rank(in, r, "x.npy");
    expect(x, r, "x.npy", "<u2", ri.tokens, H);
    Tensor xb(DType::kBF16, {ri.tokens, H});
    copy_bytes(xb.data(), x.data.data(), xb.nbytes());
    if (p.fp8)
      to_fp8(xb, ri);
    else
      ri.x = std::move(xb);
  } else {
    random_x(ri, H, p.fp8, rank_seed(o.seed, r, 2));
  }
}

BenchProblem load(const BenchOptions& o) {
  const fs::path in(o.routing);
  const ReplayMeta meta = read_replay_meta(in);
  BenchProblem p;
  p.ranks = meta.num_ranks;
  p.experts = meta.num_experts;
  p.hidden = meta.hidden;
  p.topk = meta.num_topk;
  p.max_tokens = meta.max_tokens_per_rank;
  p.fp8 = o.fp8 || fs::exists(in / "rank0" / "x_fp8.npy");
  p.source = "read from " + o.routing;
  check_shape(p.ranks, p.experts, p.hidden, p.topk, p.fp8, (in / "meta.json").string());
  if (o.transport != "shmem") check_ranks(p.ranks, o.transport, (in / "meta.json").string());  // shmem: P is the launcher's
  check_workers(o.workers, p.ranks, "epx bench");
  // Every file's header against meta.json, then the memory, before any array is read or made.
  const std::vector<std::int64_t> tokens = check_replay_inputs(in, meta, true);
  const RankFootprint f = rank_footprint(p.ranks, p.hidden, p.topk, *std::max_element(tokens.begin(), tokens.end()),
                                         p.max_tokens, 0, o.output_pool_bytes());
  check_footprint("epx bench: ", {f.window, detail::add_sat(f.total, f.inputs), f.inputs}, p.ranks,
                  o.transport == "shm");
  p.rank.resize(static_cast<std::size_t>(p.ranks));
  for (int r = 0; r < p.ranks; ++r) {
    BenchRankInput& ri = p.rank[static_cast<std::size_t>(r)];
    load_routing(in, r, p, o, ri);
    load_x(in, r, p, o, ri);
  }
  return p;
}

}  // namespace

void group_limited_topk(const double* scores, int experts, int groups, int topk_groups, int topk, std::int64_t* out) {
  const int n = experts / groups;
  // Group scores: the two best of each group, summed.
  std::vector<std::pair<double, int>> group(static_cast<std::size_t>(groups));
  for (int gi = 0; gi < groups; ++gi) {
    double best = -1e300, second = -1e300;
    for (int e = gi * n; e < (gi + 1) * n; ++e) {
      if (scores[e] > best) second = best, best = scores[e];
      else if (scores[e] > second) second = scores[e];
    }
    group[static_cast<std::size_t>(gi)] = {n > 1 ? best + second : best, gi};
  }
  const auto better = [](const std::pair<double, int>& a, const std::pair<double, int>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(group.begin(), group.begin() + topk_groups, group.end(), better);
  std::vector<std::pair<double, int>> cand;
  cand.reserve(static_cast<std::size_t>(topk_groups * n));
  for (int i = 0; i < topk_groups; ++i)
    for (int e = group[static_cast<std::size_t>(i)].second * n; e < (group[static_cast<std::size_t>(i)].second + 1) * n; ++e)
      cand.emplace_back(scores[e], e);
  std::partial_sort(cand.begin(), cand.begin() + topk, cand.end(), better);
  for (int k = 0; k < topk; ++k) out[k] = cand[static_cast<std::size_t>(k)].second;
}

void check_group_limit(int groups, int topk_groups, int experts, int topk, double skew) {
  const auto bad = [](const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); };
  if (groups == 0 && topk_groups == 0) return;
  if (groups <= 0 || experts % groups != 0)
    bad("--groups must divide the " + std::to_string(experts) + " experts (and be > 0 with --topk-groups), got " + std::to_string(groups));
  if (topk_groups < 1 || topk_groups > groups)
    bad("--topk-groups must be in [1, --groups = " + std::to_string(groups) + "], got " + std::to_string(topk_groups));
  if (topk > topk_groups * (experts / groups))
    bad("--topk " + std::to_string(topk) + " exceeds the " + std::to_string(topk_groups * (experts / groups)) +
        " experts of --topk-groups " + std::to_string(topk_groups) + " groups of " + std::to_string(experts / groups));
  if (skew > 0) bad("--groups (uniform scores) cannot be combined with --skew");
}

BenchProblem make_problem(const BenchOptions& o) { return o.routing.empty() ? generate(o) : load(o); }

namespace {

std::size_t up(int n) { return static_cast<std::size_t>(n); }

/// Every counter of `c` sized for its ranks and experts, at zero.
void zero_counters(RouteCount& c) {
  const int P = c.ranks, E = c.experts;
  c.sent_rows.assign(up(P), 0);
  c.sent_local_rows.assign(up(P), 0);
  c.recv_rows.assign(up(P), 0);
  c.recv_local_rows.assign(up(P), 0);
  c.recv_slots.assign(up(P), 0);
  c.recv_local_slots.assign(up(P), 0);
  c.sent_slots.assign(up(P), 0);
  c.pair_slots.assign(up(P) * up(P), 0);
  c.out_rows.assign(up(P), 0);
  c.expert_rows.assign(up(E), 0);
  c.pair_rows.assign(up(P) * up(P), 0);
  const int max_dest = std::min(c.topk, P);
  c.unique_dest_hist.assign(up(P), std::vector<std::int64_t>(up(max_dest) + 1, 0));
}

/// Rank s's token `token_id` counted: its K slots (-1 = none) as slots at their experts' ranks,
/// and as one row per unique destination rank (`seen`: the token that last reached each rank).
void count_token(RouteCount& c, int s, const std::int64_t* slots, int L, std::int64_t token_id,
                 std::vector<std::int64_t>& seen) {
  const int P = c.ranks;
  int unique = 0;
  for (int k = 0; k < c.topk; ++k) {
    const std::int64_t e = slots[k];
    if (e < 0) continue;
    ++c.expert_rows[static_cast<std::size_t>(e)];
    const int d = static_cast<int>(e / L);
    ++c.recv_slots[up(d)];
    ++c.sent_slots[up(s)];
    ++c.pair_slots[up(s) * up(P) + up(d)];
    if (d == s) ++c.recv_local_slots[up(d)];
    if (seen[up(d)] == token_id) continue;
    seen[up(d)] = token_id;
    ++unique;
    ++c.sent_rows[up(s)];
    ++c.recv_rows[up(d)];
    ++c.pair_rows[up(s) * up(P) + up(d)];
    if (d == s) {
      ++c.sent_local_rows[up(s)];
      ++c.recv_local_rows[up(d)];
    }
  }
  ++c.unique_dest_hist[up(s)][up(unique)];
}

/// The dispatch output's rows per rank: the compact rows, or in the expanded layout each local
/// expert's slots padded to `alignment`.
void count_output_rows(RouteCount& c, int L, int alignment) {
  for (int d = 0; d < c.ranks; ++d) {
    if (!c.expanded) {
      c.out_rows[up(d)] = c.recv_rows[up(d)];
      continue;
    }
    for (int j = 0; j < L; ++j) {
      const std::int64_t n = c.expert_rows[up(d * L + j)];
      c.out_rows[up(d)] += (n + alignment - 1) / alignment * alignment;
    }
  }
}

}  // namespace

RouteCount count_routes(int ranks, int experts, int topk, const std::vector<const std::int64_t*>& topk_idx,
                        const std::vector<std::int64_t>& tokens, std::size_t x_row_bytes, std::size_t y_row_bytes,
                        bool expanded, int alignment) {
  const int P = ranks, K = topk, L = experts / ranks;
  RouteCount c;
  c.ranks = P;
  c.experts = experts;
  c.topk = K;
  c.expanded = expanded;
  c.x_row_bytes = x_row_bytes;
  c.y_row_bytes = y_row_bytes;
  c.tokens = tokens;
  zero_counters(c);
  std::vector<std::int64_t> seen(up(P), -1);  // token id that last reached each rank
  std::int64_t token_id = 0;
  for (int s = 0; s < P; ++s)
    for (std::int64_t t = 0; t < tokens[up(s)]; ++t, ++token_id) count_token(c, s, topk_idx[up(s)] + t * K, L, token_id, seen);
  count_output_rows(c, L, alignment);
  return c;
}

RouteCount count_routes(const BenchProblem& p, bool expanded, int alignment) {
  std::vector<const std::int64_t*> idx;
  std::vector<std::int64_t> tokens;
  for (const BenchRankInput& r : p.rank) {
    idx.push_back(r.topk_idx.data());
    tokens.push_back(r.tokens);
  }
  return count_routes(p.ranks, p.experts, p.topk, idx, tokens, p.x_row_bytes(), p.y_row_bytes(), expanded, alignment);
}

}  // namespace epx::tools
