// Two ranks with an installed epx, one call of every library target, each checked:
//  - epx::engine: dispatch and combine where every token goes to one expert (K = 1) and the
//    experts return their rows unchanged, so combine must give x back bit for bit;
//  - epx::bucket: a BucketBuffer all-reduces rank + 1 (= 3 on both ranks);
//  - epx::pp: rank 0 sends a row to rank 1, which must receive it bit for bit;
//  - epx::engram: each rank writes its shard of a table and fetches rows of both shards,
//    which must equal the table rows (and -1 a zero row);
//  - epx::sim: the same dispatch and combine on the simulator transport, whose trace must
//    record the puts between the two ranks and be timed on a built-in hardware model;
//  - epx::eplb: 3 replicas of 2 experts of load 3 and 1: the heavier one gets the spare;
//  - epx::lb: the (t, k) slots a routing sends each expert, counted by hand;
//  - epx::diagnose: a 4-rank wait matrix whose rank 2 waits 100x the others: row 2 alone.
// Exit status 0 when all hold.
#include <epx/bucket.hpp>
#include <epx/buffer.hpp>
#include <epx/diagnose.hpp>
#include <epx/engram.hpp>
#include <epx/eplb.hpp>
#include <epx/launch.hpp>
#include <epx/lb.hpp>
#include <epx/pp.hpp>
#include <epx/sim/launch.hpp>
#include <epx/sim/timing.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr int P = 2, E = 4, H = 128, S = 5;

std::uint16_t bf16_of(int rank, int i) { return static_cast<std::uint16_t>(0x3f80 + (rank * 977 + i) % 256); }

bool ep_round_trip(epx::Transport& t) {
  epx::Buffer buffer(t, {.num_experts = E, .hidden = H, .num_topk = 1, .max_tokens_per_rank = S});
  std::vector<std::uint16_t> x(S * H);
  std::vector<std::int64_t> idx(S);
  std::vector<float> w(S, 1.0f);
  for (int i = 0; i < S * H; ++i) x[i] = bf16_of(t.rank(), i);
  for (int s = 0; s < S; ++s) idx[s] = (s + t.rank()) % E;
  epx::DispatchArgs a;
  a.x = epx::TensorView(x.data(), epx::DType::kBF16, {S, H});
  a.topk_idx = epx::TensorView(idx.data(), epx::DType::kI64, {S, 1});
  a.topk_weights = epx::TensorView(w.data(), epx::DType::kF32, {S, 1});
  epx::DispatchResult d = buffer.dispatch(a);
  epx::CombineArgs c;
  c.y = d.recv_x.view();
  c.handle = &d.handle;
  epx::CombineResult r = buffer.combine(c);
  return std::memcmp(r.combined_x.data(), x.data(), x.size() * 2) == 0;
}

bool bucket_all_reduce(epx::Transport& t) {
  epx::BucketBuffer bucket(t, {epx::world_ranks(P)}, 64);
  float* v = reinterpret_cast<float*>(bucket.storage());
  v[0] = static_cast<float>(t.rank() + 1);
  bucket.all_reduce({{v, epx::DType::kF32, epx::Shape{1}}});
  return v[0] == 3.0f;
}

bool pp_send_recv(epx::Transport& t) {
  epx::PPBuffer pp(t, {.num_max_tensor_bytes = H * 2, .num_max_inflight_tensors = 1});
  std::vector<std::uint16_t> row(H), expect(H);
  for (int i = 0; i < H; ++i) expect[i] = bf16_of(0, i);
  if (t.rank() == 0) {
    pp.send(epx::TensorView(expect.data(), epx::DType::kBF16, {H}), 1);
    return true;
  }
  pp.recv(epx::MutableView{row.data(), epx::DType::kBF16, epx::Shape{H}}, 0);
  return row == expect;
}

bool engram_fetch(epx::Transport& t) {
  constexpr int N = 3, T = 2, EP = 2;  // rows per rank, tokens, rows per token
  const epx::EngramConfig cfg{.num_entries_per_layer = {N}, .hidden = H, .num_max_tokens = T,
                              .num_entries_per_token = EP};
  const epx::EngramSizes sizes = epx::EngramBuffer::get_storage_size_hint(P, cfg);
  epx::EngramBuffer engram(t, sizes.num_bytes, sizes.num_storage_bytes);
  engram.set_config(cfg);
  std::vector<std::uint16_t> shard(N * H);  // global row g = rank * N + i holds bf16_of(g, j)
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < H; ++j) shard[i * H + j] = bf16_of(t.rank() * N + i, j);
  engram.write({epx::TensorView(shard.data(), epx::DType::kBF16, {N, H})});
  const std::vector<std::int32_t> indices = {5, 0, -1, 2 + t.rank()};  // [1, T, EP]
  epx::EngramFetch f = engram.fetch(epx::TensorView(indices.data(), epx::DType::kI32, {1, T, EP}));
  const auto* out = f.layer(0).data.as<std::uint16_t>();
  for (int k = 0; k < T * EP; ++k)
    for (int j = 0; j < H; ++j)
      if (out[k * H + j] != (indices[k] < 0 ? 0 : bf16_of(indices[k], j))) return false;
  return true;
}

// Local, pure calls of the planners and the diagnosis rule.
bool eplb_plan() {
  const epx::EplbPlan plan = epx::rebalance_experts({3.0f, 1.0f}, 1, 2, 3, 1, 1, 1);
  const std::vector<std::int64_t> logcnt{2, 1};
  int slots_of_0 = 0;
  for (std::int64_t e : plan.phy2log) slots_of_0 += e == 0;
  return plan.logcnt == logcnt && plan.phy2log.size() == 3 && slots_of_0 == 2;
}

bool lb_counts() {
  const std::vector<std::int64_t> expect{1, 0, 2};  // topk_idx [2, 2] = {0, 2 | -1, 2}
  return epx::count_expert_slots({0, 2, -1, 2}, 3) == expect;
}

bool diagnose_rule() {
  constexpr int R = 4;
  std::vector<double> m(R * R, 0.0);  // waits in us, m[src * R + dst]; the diagonal stays 0
  for (int s = 0; s < R; ++s)
    for (int d = 0; d < R; ++d)
      if (s != d) m[s * R + d] = s == 2 ? 1000.0 : 10.0;
  const epx::MatrixVerdict v = epx::diagnose_matrix(m, R);
  return v.rows == std::vector<int>{2} && v.cols.empty() && v.points.empty();
}

}  // namespace

int main() {
  std::atomic<bool> ep{true}, bucket{true}, pp{true}, engram{true}, sim{true};
  epx::launch({.num_ranks = P, .transport = epx::TransportKind::kThreads}, [&](epx::Transport& t) {
    if (!ep_round_trip(t)) ep = false;
    if (!bucket_all_reduce(t)) bucket = false;
    if (!pp_send_recv(t)) pp = false;
    if (!engram_fetch(t)) engram = false;
  });
  epx::sim::Trace trace;
  epx::sim::launch({.num_ranks = P}, {.trace = &trace}, [&](epx::Transport& t) {
    if (!ep_round_trip(t)) sim = false;
  });
  const epx::sim::PutTable puts = epx::sim::summarize_puts(trace, -1);
  std::uint64_t across = 0;
  for (const auto& queue : puts.at(0).at(1)) across += queue.bytes;
  // The last call (the combine) on a modelled machine: both ranks finish at a positive time.
  const epx::sim::CallTiming timing = epx::sim::time_call(
      trace, static_cast<int>(trace.calls.size()) - 1, epx::sim::load_hardware("h800-deepep"), {});
  if (across == 0 || timing.ranks.size() != P || timing.max_rank.ps <= 0) sim = false;
  const bool eplb = eplb_plan(), lb = lb_counts(), diagnose = diagnose_rule();
  const auto word = [](bool ok) { return ok ? "ok" : "MISMATCH"; };
  std::printf("epx consumer: engine %s, bucket %s, pp %s, engram %s, sim %s (%llu bytes rank 0 -> 1, %s %.3f us), "
              "eplb %s, lb %s, diagnose %s\n",
              word(ep), word(bucket), word(pp), word(engram), word(sim), static_cast<unsigned long long>(across),
              timing.name.c_str(), static_cast<double>(timing.max_rank.ps) / 1e6, word(eplb), word(lb), word(diagnose));
  return ep && bucket && pp && engram && sim && eplb && lb && diagnose ? 0 : 1;
}
