// transfer.cpp — which row of which expert travels in which round as which token
// (plan_lb_transfer, the one owner of that table), and the collectives that run it over a
// Buffer's compact dispatch: prefetch_weights, reduce_grads. See epx/lb.hpp.
#include <algorithm>
#include <cstring>
#include <string>

#include "epx/error.hpp"
#include "epx/lb.hpp"

namespace epx {

namespace {

using std::size_t;
size_t at(std::int64_t i) { return static_cast<size_t>(i); }

[[noreturn]] void invalid(const std::string& m, int rank = -1) {
  throw Error(ErrorCode::kInvalidArgument, m, rank);
}

// Checks the placement's shape and values; "" when fine, else the reason.
std::string placement_error(const LbPlacement& pl, int ranks) {
  if (pl.home_experts < 1) return "home_experts = " + std::to_string(pl.home_experts) + " must be >= 1";
  if (pl.slots < 0) return "slots = " + std::to_string(pl.slots) + " must be >= 0";
  const size_t want = at(ranks) * at(pl.slots);
  if (pl.mapping.size() != want)
    return "mapping has " + std::to_string(pl.mapping.size()) + " values, expected P * B = " + std::to_string(ranks) +
           " * " + std::to_string(pl.slots) + " = " + std::to_string(want);
  const std::int64_t E = std::int64_t{ranks} * pl.home_experts;
  for (size_t g = 0; g < pl.mapping.size(); ++g)
    if (pl.mapping[g] < -1 || pl.mapping[g] >= E)
      return "mapping[" + std::to_string(g / at(std::max(1, pl.slots))) + "][" + std::to_string(g % at(std::max(1, pl.slots))) +
             "] = " + std::to_string(pl.mapping[g]) + " is outside [-1, P * L = " + std::to_string(E) + ")";
  return "";
}

std::uint32_t fnv(std::uint32_t h, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= static_cast<std::uint32_t>((v >> (8 * i)) & 0xffu);
    h *= 16777619u;
  }
  return h;
}

}  // namespace

std::int64_t LbTransfer::wire_bytes() const {
  std::int64_t n = 0;
  for (const LbToken& t : tokens) n += t.num_dests;
  return n * static_cast<std::int64_t>(row_bytes);
}

namespace {

// Source rank s's tokens of the table, appended to tr.tokens / tr.dests: toward replicas,
// each home expert's rows to the ranks holding it in a slot (ascending, max_dests per token);
// back, each filled slot's rows to the expert's home rank.
void append_source_tokens(LbTransfer& tr, const LbPlacement& placement, int s, int max_dests) {
  const int L = placement.home_experts, B = placement.slots, ranks = tr.ranks;
  if (tr.direction == LbDirection::kToReplicas) {
    for (int i = 0; i < L; ++i) {
      const std::int64_t e = std::int64_t{s} * L + i;
      std::vector<int> to;  // ranks holding e in a slot, ascending
      for (int d = 0; d < ranks; ++d)
        for (int b = 0; b < B; ++b)
          if (placement.mapping[at(d) * at(B) + at(b)] == e) {
            to.push_back(d);
            break;
          }
      const int groups_first = static_cast<int>(tr.dests.size());
      tr.dests.insert(tr.dests.end(), to.begin(), to.end());
      for (std::int64_t c = 0; c < tr.rows_per_expert; ++c)
        for (size_t g = 0; g < to.size(); g += at(max_dests))
          tr.tokens.push_back({e, c, groups_first + static_cast<int>(g),
                               static_cast<int>(std::min(to.size() - g, at(max_dests)))});
    }
    return;
  }
  for (int b = 0; b < B; ++b) {
    const std::int64_t e = placement.mapping[at(s) * at(B) + at(b)];
    if (e < 0 || tr.rows_per_expert == 0) continue;
    const int first_dest = static_cast<int>(tr.dests.size());
    tr.dests.push_back(static_cast<int>(e / L));
    for (std::int64_t c = 0; c < tr.rows_per_expert; ++c) tr.tokens.push_back({std::int64_t{s} * B + b, c, first_dest, 1});
  }
}

// What every rank must agree on, as a float32-exact 24-bit hash.
std::uint32_t transfer_fingerprint(const LbTransfer& tr, const LbPlacement& placement, int max_dests) {
  std::uint32_t h = 2166136261u;
  for (std::uint64_t v : {std::uint64_t(tr.direction), std::uint64_t(tr.ranks), std::uint64_t(placement.home_experts),
                          std::uint64_t(placement.slots), std::uint64_t(tr.expert_bytes), std::uint64_t(tr.row_bytes),
                          std::uint64_t(max_dests), std::uint64_t(tr.tokens_per_round)})
    h = fnv(h, v);
  for (std::int64_t m : placement.mapping) h = fnv(h, static_cast<std::uint64_t>(m));
  return h & 0xffffffu;
}

}  // namespace

LbTransfer plan_lb_transfer(LbDirection direction, const LbPlacement& placement, int ranks, std::size_t expert_bytes,
                            std::size_t row_bytes, int max_dests, std::int64_t tokens_per_round) {
  if (ranks < 1) invalid("plan_lb_transfer: ranks = " + std::to_string(ranks) + " must be >= 1");
  if (const std::string e = placement_error(placement, ranks); !e.empty()) invalid("plan_lb_transfer: " + e);
  if (row_bytes == 0 || max_dests < 1 || tokens_per_round < 1)
    invalid("plan_lb_transfer: row_bytes, max_dests and tokens_per_round must be >= 1");
  LbTransfer tr;
  tr.direction = direction;
  tr.ranks = ranks;
  tr.row_bytes = row_bytes;
  tr.expert_bytes = expert_bytes;
  tr.rows_per_expert = static_cast<std::int64_t>((expert_bytes + row_bytes - 1) / row_bytes);
  tr.tokens_per_round = tokens_per_round;
  std::vector<std::int64_t> per_source(at(ranks), 0);
  for (int s = 0; s < ranks; ++s) {
    const size_t first = tr.tokens.size();
    append_source_tokens(tr, placement, s, max_dests);
    per_source[at(s)] = static_cast<std::int64_t>(tr.tokens.size() - first);
    tr.rounds = std::max(tr.rounds, static_cast<int>((per_source[at(s)] + tokens_per_round - 1) / tokens_per_round));
  }
  tr.offsets.assign(at(ranks) * at(tr.rounds) + 1, 0);
  std::int64_t base = 0;
  for (int s = 0; s < ranks; ++s) {
    for (int r = 0; r < tr.rounds; ++r)
      tr.offsets[at(s) * at(tr.rounds) + at(r)] = base + std::min(per_source[at(s)], r * tokens_per_round);
    base += per_source[at(s)];
  }
  tr.offsets.back() = base;
  tr.fingerprint = transfer_fingerprint(tr, placement, max_dests);  // exact as a float32
  return tr;
}

namespace {

// Bytes [offset, offset + len) of tensor `index` of `kinds`, the kinds concatenated in order:
// copied out to `buf` (kToBuf) or in from it.
enum class Copy { kToBuf, kFromBuf };
void copy_span(Copy how, const std::vector<ExpertTensors>& kinds, std::int64_t index, size_t offset, std::byte* buf,
               size_t len) {
  size_t kind_begin = 0;
  for (const ExpertTensors& k : kinds) {
    const size_t kind_end = kind_begin + k.bytes_per_expert;
    const size_t lo = std::max(offset, kind_begin), hi = std::min(offset + len, kind_end);
    if (lo < hi) {
      std::byte* t = static_cast<std::byte*>(k.data) + at(index) * k.bytes_per_expert + (lo - kind_begin);
      if (how == Copy::kToBuf)
        std::memcpy(buf + (lo - offset), t, hi - lo);
      else
        std::memcpy(t, buf + (lo - offset), hi - lo);
    }
    kind_begin = kind_end;
  }
}

size_t total_bytes(const std::vector<ExpertTensors>& kinds) {
  size_t n = 0;
  for (const ExpertTensors& k : kinds) n += k.bytes_per_expert;
  return n;
}

// The arguments of prefetch / reduce on this rank: "" when fine, else the reason.
std::string args_error(const char* what, const std::vector<ExpertTensors>& slots, const std::vector<ExpertTensors>& home,
                       const LbPlacement& pl, int ranks, bool float32) {
  if (std::string e = placement_error(pl, ranks); !e.empty()) return e;
  const char* sname = float32 ? "redundant_grads" : "redundant_weights";
  const char* hname = float32 ? "expert_grads" : "expert_weights";
  if (slots.size() != home.size())
    return std::string(sname) + " has " + std::to_string(slots.size()) + " kinds, " + hname + " " +
           std::to_string(home.size()) + "; " + what + " needs the same kinds in both";
  for (size_t k = 0; k < home.size(); ++k) {
    const std::string kn = "kind " + std::to_string(k);
    if (slots[k].bytes_per_expert != home[k].bytes_per_expert)
      return kn + ": " + sname + " has " + std::to_string(slots[k].bytes_per_expert) + " bytes per expert, " + hname + " " +
             std::to_string(home[k].bytes_per_expert);
    if (float32 && home[k].bytes_per_expert % 4 != 0)
      return kn + ": " + std::to_string(home[k].bytes_per_expert) + " bytes per expert is not a whole number of float32";
    if (home[k].bytes_per_expert > 0 && home[k].data == nullptr) return kn + ": " + hname + " data is null";
    if (home[k].bytes_per_expert > 0 && pl.slots > 0 && slots[k].data == nullptr) return kn + ": " + sname + " data is null";
  }
  return "";
}

// Round r of a transfer as this rank sees it: which rows it received, to be checked
// against the table before any is delivered.
struct TransferRound {
  const char* what;
  const LbTransfer& tr;
  int r, me, P, K;
  float mark;  // the table's fingerprint, carried in every row's weights
};

// Every received row must be a token of the table that names this rank, carrying the
// table's fingerprint; and every such token must arrive. Calls deliver(token, row) for each.
template <class Deliver>
void check_and_deliver(const TransferRound& rd, const DispatchResult& d, std::int64_t H, Deliver& deliver) {
  const LbTransfer& tr = rd.tr;
  const int r = rd.r, me = rd.me, K = rd.K;
  const std::int64_t N = d.recv_src.shape()[0];
  const auto* src = d.recv_src.as<std::int64_t>();
  const auto* ridx = d.recv_topk_idx.as<std::int64_t>();
  const auto* rw = d.recv_topk_weights.as<float>();
  const auto* rows = static_cast<const std::byte*>(d.recv_x.data());
  std::int64_t expected = 0;
  for (int s = 0; s < rd.P && r < tr.rounds; ++s)
    for (std::int64_t t = tr.begin(s, r); t < tr.end(s, r); ++t) {
      const LbToken& tok = tr.tokens[at(t)];
      for (int k = 0; k < tok.num_dests; ++k) expected += tr.dests[at(tok.first_dest + k)] == me;
    }
  const auto mismatch = [&](std::int64_t row, const std::string& why) {
    invalid(std::string(rd.what) + ", round " + std::to_string(r) + ": rank " + std::to_string(me) + " received row " +
                std::to_string(row) + " " + why + "; do all ranks pass the same placement and byte sizes?",
            row < N ? static_cast<int>(src[row * 2]) : -1);
  };
  if (N != expected)
    mismatch(N, "of " + std::to_string(N) + " rows, expected " + std::to_string(expected) + " from the transfer table");
  for (std::int64_t row = 0; row < N; ++row) {
    const std::int64_t s = src[row * 2], t = src[row * 2 + 1];
    if (s < 0 || s >= rd.P || r >= tr.rounds || t < 0 || t >= tr.end(static_cast<int>(s), r) - tr.begin(static_cast<int>(s), r))
      mismatch(row, "from (rank " + std::to_string(s) + ", token " + std::to_string(t) + "), not in the table");
    const LbToken& tok = tr.tokens[at(tr.begin(static_cast<int>(s), r) + t)];
    bool named = false;
    for (int k = 0; k < K; ++k)
      if (ridx[row * K + k] == 0) named = rw[row * K + k] == rd.mark;
    bool listed = false;
    for (int k = 0; k < tok.num_dests; ++k) listed |= tr.dests[at(tok.first_dest + k)] == me;
    if (!named || !listed)
      mismatch(row, "from (rank " + std::to_string(s) + ", token " + std::to_string(t) + ") with another fingerprint");
    deliver(tok, rows + at(row) * at(2 * H));
  }
}

// One collective over the Buffer: every rank sends its tokens of `tr` round by round,
// `fill(token, row)` writing each token's row (all row_bytes bytes, padding included) and `deliver(token, row)`
// taking each received one. A rank with bad arguments (`bad` non-empty) takes part in the
// first round with its problem as the dispatch's caller_error, which fails every rank.
template <class Fill, class Deliver>
void run_transfer(Buffer& buffer, const char* what, const LbTransfer& tr, const std::string& bad, Fill fill, Deliver deliver) {
  const BufferConfig& cfg = buffer.config();
  const int me = buffer.rank(), P = buffer.num_ranks(), K = cfg.num_topk;
  const std::int64_t H = cfg.hidden, L_buf = cfg.num_experts / P;
  const int rounds = std::max(1, tr.rounds);  // one round even when nothing moves: a bad rank must meet the others
  const float mark = static_cast<float>(tr.fingerprint);
  const std::int64_t most = std::max<std::int64_t>(1, tr.tokens_per_round);
  std::vector<std::uint16_t> x(at(most * H));  // every row filled in full (fill pads) before it is sent
  std::vector<std::int64_t> idx(at(most * K));
  std::vector<float> w(idx.size(), mark);
  for (int r = 0; r < rounds; ++r) {
    const std::int64_t first = bad.empty() && r < tr.rounds ? tr.begin(me, r) : 0;
    const std::int64_t S = bad.empty() ? (r < tr.rounds ? tr.end(me, r) - first : 0) : 1;
    std::fill(idx.begin(), idx.end(), -1);
    if (bad.empty()) {
      for (std::int64_t t = 0; t < S; ++t) {
        const LbToken& tok = tr.tokens[at(first + t)];
        fill(tok, reinterpret_cast<std::byte*>(x.data() + at(t * H)));
        for (int k = 0; k < tok.num_dests; ++k) idx[at(t * K + k)] = tr.dests[at(tok.first_dest + k)] * L_buf;
      }
    }
    DispatchArgs a;
    a.x = TensorView(x.data(), DType::kBF16, {S, H});
    a.topk_idx = TensorView(idx.data(), DType::kI64, {S, K});
    a.topk_weights = TensorView(w.data(), DType::kF32, {S, K});
    a.layout = RecvLayout::kCompact;
    // No copy where the Buffer allows it: the rows are read where the senders put them.
    a.recv_in_window = cfg.ring_rows == 0 && cfg.dataplane.protocol != Protocol::kFlag;
    // A bad rank's dispatch fails every rank's with its own words.
    const Error mine(ErrorCode::kInvalidArgument, "rank " + std::to_string(me) + ": " + what + ": " + bad, me);
    if (!bad.empty()) a.caller_error = &mine;
    // Its error is the same on every rank (the engine's rule): passed on as it is.
    DispatchResult d = buffer.dispatch(a);
    if (!bad.empty()) invalid(std::string(what) + ": rank " + std::to_string(me) + ": " + bad, me);
    check_and_deliver(TransferRound{what, tr, r, me, P, K, mark}, d, H, deliver);
  }
}

std::size_t row_bytes_of(const Buffer& b) { return static_cast<std::size_t>(b.config().hidden) * 2; }

// Tokens per rank per round: the Buffer's max_tokens_per_rank, and no receiver gets more
// than its max_recv_rows.
std::int64_t tokens_per_round(const Buffer& b) {
  const BufferConfig& c = b.config();
  const std::int64_t P = b.num_ranks();
  const std::int64_t cap = c.max_recv_rows > 0 ? c.max_recv_rows : P * c.max_tokens_per_rank;
  return std::min<std::int64_t>(c.max_tokens_per_rank, cap / P);
}

}  // namespace

void prefetch_weights(Buffer& buffer, const std::vector<ExpertTensors>& redundant_weights,
                      const std::vector<ExpertTensors>& expert_weights, const LbPlacement& placement) {
  const int me = buffer.rank(), P = buffer.num_ranks();
  std::string bad = args_error("prefetch_weights", redundant_weights, expert_weights, placement, P, false);
  if (bad.empty() && tokens_per_round(buffer) < 1)
    bad = "the Buffer's max_recv_rows < num_ranks leaves no room for one row per rank";
  LbTransfer tr;
  if (bad.empty())
    tr = plan_lb_transfer(LbDirection::kToReplicas, placement, P, total_bytes(expert_weights), row_bytes_of(buffer),
                          buffer.config().num_topk, tokens_per_round(buffer));
  const std::int64_t L = placement.home_experts, B = placement.slots;
  const size_t R = tr.row_bytes;
  run_transfer(
      buffer, "prefetch_weights", tr, bad,
      [&](const LbToken& tok, std::byte* row) {
        const size_t off = at(tok.row) * R;
        const size_t n = std::min(R, tr.expert_bytes - off);
        copy_span(Copy::kToBuf, expert_weights, tok.item - me * L, off, row, n);
        std::memset(row + n, 0, R - n);
      },
      [&](const LbToken& tok, const std::byte* row) {
        const size_t off = at(tok.row) * R;
        for (std::int64_t b = 0; b < B; ++b)
          if (placement.mapping[at(me * B + b)] == tok.item)
            copy_span(Copy::kFromBuf, redundant_weights, b, off, const_cast<std::byte*>(row),
                      std::min(R, tr.expert_bytes - off));
      });
}

void reduce_grads(Buffer& buffer, const std::vector<ExpertTensors>& redundant_grads,
                  const std::vector<ExpertTensors>& expert_grads, const LbPlacement& placement) {
  const int me = buffer.rank(), P = buffer.num_ranks();
  std::string bad = args_error("reduce_grads", redundant_grads, expert_grads, placement, P, true);
  if (bad.empty() && tokens_per_round(buffer) < 1)
    bad = "the Buffer's max_recv_rows < num_ranks leaves no room for one row per rank";
  LbTransfer tr;
  if (bad.empty())
    tr = plan_lb_transfer(LbDirection::kToHome, placement, P, total_bytes(expert_grads), row_bytes_of(buffer),
                          buffer.config().num_topk, tokens_per_round(buffer));
  const std::int64_t L = placement.home_experts;
  const size_t R = tr.row_bytes, X = tr.expert_bytes;
  // The slots whose expert lives here, ascending global slot: staged until every round is in,
  // then added in that order (the fixed order of the sum, whatever round a row came in).
  std::vector<std::int64_t> stage_of(placement.mapping.size(), -1), staged;
  for (size_t g = 0; g < placement.mapping.size() && bad.empty(); ++g)
    if (placement.mapping[g] >= 0 && placement.mapping[g] / L == me) {
      stage_of[g] = static_cast<std::int64_t>(staged.size());
      staged.push_back(static_cast<std::int64_t>(g));
    }
  std::vector<std::byte> stage(staged.size() * X);
  run_transfer(
      buffer, "reduce_grads", tr, bad,
      [&](const LbToken& tok, std::byte* row) {
        const size_t off = at(tok.row) * R;
        const size_t n = std::min(R, X - off);
        copy_span(Copy::kToBuf, redundant_grads, tok.item - me * placement.slots, off, row, n);
        std::memset(row + n, 0, R - n);
      },
      [&](const LbToken& tok, const std::byte* row) {
        const size_t off = at(tok.row) * R;
        std::memcpy(stage.data() + at(stage_of[at(tok.item)]) * X + off, row, std::min(R, X - off));
      });
  for (size_t j = 0; j < staged.size(); ++j) {
    const std::int64_t home = placement.mapping[at(staged[j])] - me * L;
    size_t kind_begin = 0;
    for (const ExpertTensors& k : expert_grads) {
      float* dst = reinterpret_cast<float*>(static_cast<std::byte*>(k.data) + at(home) * k.bytes_per_expert);
      const std::byte* from = stage.data() + j * X + kind_begin;
      const size_t n = k.bytes_per_expert / 4;
      for (size_t i = 0; i < n; ++i) {
        float g;
        std::memcpy(&g, from + i * 4, 4);
        dst[i] = dst[i] + g;
      }
      kind_begin += k.bytes_per_expert;
    }
  }
}

LbEvent prefetch_weights_async(Buffer& buffer, std::vector<ExpertTensors> redundant_weights,
                               std::vector<ExpertTensors> expert_weights, LbPlacement placement) {
  return LbEvent(std::async(std::launch::async, [&buffer, r = std::move(redundant_weights), e = std::move(expert_weights),
                                                 p = std::move(placement)]() { prefetch_weights(buffer, r, e, p); }));
}

}  // namespace epx
