// Two ranks (threads) dispatch and combine with an installed epx: every token goes to one
// expert (K = 1), the experts return their rows unchanged, so combine must give x back
// bit for bit; then a BucketBuffer on the same ranks all-reduces rank + 1 (= 3). Exit status
// 0 when both hold.
#include <epx/bucket.hpp>
#include <epx/buffer.hpp>
#include <epx/launch.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  const int P = 2, E = 4, H = 128, S = 5;
  bool ok = true;
  epx::launch({.num_ranks = P, .transport = epx::TransportKind::kThreads}, [&](epx::Transport& t) {
    epx::Buffer buffer(t, {.num_experts = E, .hidden = H, .num_topk = 1, .max_tokens_per_rank = S});
    std::vector<std::uint16_t> x(S * H);
    std::vector<std::int64_t> idx(S);
    std::vector<float> w(S, 1.0f);
    for (int i = 0; i < S * H; ++i) x[i] = static_cast<std::uint16_t>(0x3f80 + (t.rank() * 977 + i) % 256);
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
    if (std::memcmp(r.combined_x.data(), x.data(), x.size() * 2) != 0) ok = false;
    epx::BucketBuffer bucket(t, {epx::world_ranks(P)}, 64);
    float* v = reinterpret_cast<float*>(bucket.storage());
    v[0] = static_cast<float>(t.rank() + 1);
    bucket.all_reduce({{v, epx::DType::kF32, epx::Shape{1}}});
    if (v[0] != 3.0f) ok = false;
  });
  std::printf("epx consumer: %s\n", ok ? "combine(dispatch(x)) == x and all_reduce on both ranks" : "MISMATCH");
  return ok ? 0 : 1;
}
