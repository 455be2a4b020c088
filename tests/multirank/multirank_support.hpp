// Shared by the multi-rank tests: run a rank function on P ranks of a transport, views of
// the reference fixture's inputs, and exact comparisons that name rank, tensor and index.
// Rank functions run in forked processes for the shm transport, so they report failure
// by throwing (the launcher carries the message back), never with gtest macros.
#pragma once

#include <dirent.h>

#include <chrono>

#include <cstring>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "epx/buffer.hpp"
#include "epx/launch.hpp"
#include "epx/spi/support.hpp"
#include "epx/sim/model_transport.hpp"
#include "reference/fixtures.hpp"
#include "reference/reference.hpp"

namespace epx::testing {

inline const std::vector<TransportKind> kTransports = {TransportKind::kThreads, TransportKind::kShm};
/// The conformance suites also run on the simulator transport in copy mode (bit-exact).
inline const std::vector<TransportKind> kDataTransports = {TransportKind::kThreads, TransportKind::kShm, TransportKind::kSim};

/// The rank's inputs of a reference problem, as the views dispatch takes.
struct RankViews {
  TensorView x, x_scales, topk_idx, topk_weights;
};
inline RankViews views_of(const ref::Problem& p, int r) {
  const ref::RankInput& in = p.ranks[static_cast<std::size_t>(r)];
  const std::int64_t S = in.num_tokens;
  RankViews v;
  if (p.fp8) {
    v.x = TensorView(in.x_fp8.data(), DType::kFP8E4M3, {S, p.hidden});
    v.x_scales = TensorView(in.x_scales.data(), DType::kF32, {S, p.hidden / 128});
  } else {
    v.x = TensorView(in.x.data(), DType::kBF16, {S, p.hidden});
  }
  v.topk_idx = TensorView(in.topk_idx.data(), DType::kI64, {S, p.num_topk});
  v.topk_weights = TensorView(in.topk_weights.data(), DType::kF32, {S, p.num_topk});
  return v;
}

inline std::int64_t max_tokens(const ref::Problem& p) {
  std::int64_t c = 0;
  for (const auto& r : p.ranks) c = std::max(c, r.num_tokens);
  return c;
}

inline BufferConfig config_for(const ref::Problem& p, int workers = 2) {
  BufferConfig c;
  c.num_experts = p.num_experts;
  c.hidden = p.hidden;
  c.num_topk = p.num_topk;
  c.max_tokens_per_rank = max_tokens(p);
  c.num_workers = workers;
  return c;
}

/// bf16 values whose float32 sums depend on the order of the additions: a quarter with
/// exponents spread over 2^-40..2^40, the rest +-2^30 (half of them) or +-1, so that three
/// terms such as 2^30, -2^30, 1 sum to 1 in one order and to 0 in another (1 is lost next
/// to 2^30 in float32). Widely spread values alone rarely show an order: a small term is
/// lost whichever way round, and a partial's rounding to bf16 hides the rest.
inline std::vector<std::uint16_t> wide_bf16(std::uint64_t seed, std::int64_t n) {
  std::vector<std::uint16_t> v(static_cast<std::size_t>(n));
  std::uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto bits = static_cast<std::uint32_t>(state >> 33);
    const std::uint32_t sign = ((bits >> 8) & 1u) << 15;
    switch ((bits >> 16) % 4) {
      case 0: b = static_cast<std::uint16_t>(sign | (127 - 40 + bits % 81) << 7 | ((bits >> 9) & 0x7fu)); break;
      case 3: b = static_cast<std::uint16_t>(sign | 127u << 7); break;  // +-1
      default: b = static_cast<std::uint16_t>(sign | (127u + 30) << 7); break;  // +-2^30
    }
  }
  return v;
}

/// A transport that forwards every call to another one; tests override what they watch
/// (on_put) or what they pretend (caps). It forwards the simulator's model interface too
/// (to the wrapped transport's, when it has one), so a wrapped sim still hears the engine.
class ForwardingTransport : public Transport, public sim::ModelTransport {
 public:
  explicit ForwardingTransport(Transport& t) : t_(t), model_(dynamic_cast<sim::ModelTransport*>(&t)) {}
  int rank() const noexcept override { return t_.rank(); }
  int num_ranks() const noexcept override { return t_.num_ranks(); }
  const TransportCaps& caps() const noexcept override { return t_.caps(); }
  void allocate(std::size_t bytes, std::size_t signals) override { t_.allocate(bytes, signals); }
  std::byte* window() noexcept override { return t_.window(); }
  std::size_t window_bytes() const noexcept override { return t_.window_bytes(); }
  void put(int peer, std::size_t off, const void* src, std::size_t bytes, int q) override {
    on_put(peer, off, bytes, q);
    t_.put(peer, off, src, bytes, q);
  }
  void put_flagged(int peer, std::size_t off, const void* src, std::size_t bytes, std::uint64_t flag, int q) override {
    on_put(peer, off, bytes, q);
    t_.put_flagged(peer, off, src, bytes, flag, q);
  }
  void signal(int peer, std::size_t slot, std::uint64_t v, int q) override { t_.signal(peer, slot, v, q); }
  void wait_signal(std::size_t slot, std::uint64_t v, const WaitPoint& w) override { t_.wait_signal(slot, v, w); }
  void wait_flag(std::size_t off, std::uint64_t v, const WaitPoint& w) override { t_.wait_flag(off, v, w); }
  std::uint64_t read_signal(std::size_t slot) noexcept override { return t_.read_signal(slot); }
  void get(int peer, std::size_t off, void* dst, std::size_t bytes, int q) override { t_.get(peer, off, dst, bytes, q); }
  void quiet(int q) override { t_.quiet(q); }
  void barrier(const char* phase) override { t_.barrier(phase); }
  bool moves_payload() const noexcept override { return model_ == nullptr || model_->moves_payload(); }
  void set_payload_region(std::size_t begin, std::size_t end) override {
    payload_begin_ = begin;
    if (model_) model_->set_payload_region(begin, end);
  }
  void workers_joined() override {
    if (model_) model_->workers_joined();
  }
  std::chrono::milliseconds timeout() const noexcept override { return t_.timeout(); }

 protected:
  /// Called for every put and flagged put before it is forwarded (from any worker thread).
  virtual void on_put(int peer, std::size_t offset, std::size_t bytes, int queue) { (void)peer, (void)offset, (void)bytes, (void)queue; }
  /// Where the engine's payload (rows) starts in the window (set_payload_region).
  std::size_t payload_begin_ = ~std::size_t{0};
  /// The wrapped transport (for a test that forwards more, such as peer_window).
  const Transport& inner() const noexcept { return t_; }

 private:
  Transport& t_;
  sim::ModelTransport* model_;
};

/// The epx segments in /dev/shm now (every name epx gives starts with "epx-"), for the
/// tests' leak checks.
inline std::set<std::string> epx_segments() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind("epx-", 0) == 0) names.emplace(e->d_name);
    closedir(d);
  }
  return names;
}

/// The epx segments that were not in `before` and are still there after waiting up to
/// `patience` for them to go. Another epx job on the machine (ctest -j runs tests side by
/// side) holds its segments only between creating and unlinking them; a leaked one stays.
inline std::set<std::string> segments_left(const std::set<std::string>& before,
                                           std::chrono::milliseconds patience = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    std::set<std::string> left;
    for (const std::string& n : epx_segments())
      if (before.count(n) == 0) left.insert(n);
    if (left.empty() || std::chrono::steady_clock::now() >= deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

[[noreturn]] inline void fail(int rank, const std::string& what) {
  throw std::runtime_error("rank " + std::to_string(rank) + ": " + what);
}

/// Bitwise equality of `n` elements; the message names the first differing index.
template <class T>
void expect_bits(int rank, const std::string& what, const void* got, const std::vector<T>& want) {
  if (want.empty()) return;  // shapes are checked apart
  if (std::memcmp(got, want.data(), want.size() * sizeof(T)) == 0) return;
  const T* g = static_cast<const T*>(got);
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&g[i], &want[i], sizeof(T)) != 0) {
      std::ostringstream os;
      os << what << " differs at element " << i << " of " << want.size() << ": got " << +g[i] << ", want " << +want[i];
      fail(rank, os.str());
    }
  }
}

inline void expect_shape(int rank, const std::string& what, const Tensor& t, Shape want) {
  if (!(t.shape() == want)) fail(rank, what + " has shape " + t.shape().str() + ", want " + want.str());
}

/// A dispatch result against the reference, everything compared bit for bit.
inline void expect_dispatch(int r, const ref::Problem& p, const ref::DispatchOptions& o, const ref::DispatchOut& want,
                            const DispatchResult& got) {
  const std::int64_t rows = want.rows, H = p.hidden, K = p.num_topk;
  if (p.fp8) {
    expect_shape(r, "recv_x", got.recv_x, {rows, H});
    expect_bits(r, "recv_x (fp8)", got.recv_x.data(), want.recv_x_fp8);
    expect_shape(r, "recv_x_scales", got.recv_x_scales, {rows, H / 128});
    expect_bits(r, "recv_x_scales", got.recv_x_scales.data(), want.recv_x_scales);
  } else {
    expect_shape(r, "recv_x", got.recv_x, {rows, H});
    expect_bits(r, "recv_x", got.recv_x.data(), want.recv_x);
  }
  expect_shape(r, "recv_src", got.recv_src, {rows, o.expanded ? 3 : 2});
  expect_bits(r, "recv_src", got.recv_src.data(), want.recv_src);
  if (o.expanded) {
    expect_bits(r, "recv_weights", got.recv_weights.data(), want.recv_weights);
    expect_bits(r, "expert_offsets", got.expert_offsets.data(), want.expert_offsets);
  } else {
    expect_shape(r, "recv_topk_idx", got.recv_topk_idx, {rows, K});
    expect_bits(r, "recv_topk_idx", got.recv_topk_idx.data(), want.recv_topk_idx);
    expect_bits(r, "recv_topk_weights", got.recv_topk_weights.data(), want.recv_topk_weights);
  }
  expect_bits(r, "num_recv_tokens_per_expert", got.num_recv_tokens_per_expert.data(), want.num_recv_tokens_per_expert);
  expect_bits(r, "num_recv_tokens_per_expert_aligned", got.num_recv_tokens_per_expert_aligned.data(),
              want.num_recv_tokens_per_expert_aligned);
}

// What recv_x of a dispatch that is not a view must be: a block of the output pool (one
// copy) where the support table allows it, else a copy that says why.
inline void expect_output(int r, const Buffer& b, RecvLayout layout, const char* when, bool may_be_full = false) {
  const CallStats& st = b.last_stats();
  const std::string got = std::string(to_string(st.output)) + " (" + st.output_why + ", epilogue copied " +
                          std::to_string(st.epilogue_copy_bytes) + " B)";
  if (may_be_full && st.output == OutputKind::kCopy && std::string(st.output_why) == "output pool exhausted") return;
  const char* why = spi::why_copy(b.config(), layout);
  if (st.output == OutputKind::kView) return;  // a model-only simulator: views of its window
  if (*why == '\0') {
    if (st.output != OutputKind::kOneCopy || st.epilogue_copy_bytes != 0)
      fail(r, std::string(when) + ": recv_x should be one copy (a block of the output pool), got " + got);
  } else if (st.output != OutputKind::kOneCopy) {  // a rank with no output rows copies nothing
    if (st.output != OutputKind::kCopy || std::string(st.output_why) != why)
      fail(r, std::string(when) + ": recv_x should be a copy (" + why + "), got " + got);
  }
}

inline DispatchArgs dispatch_args(const RankViews& v, const ref::DispatchOptions& o) {
  DispatchArgs a;
  a.x = v.x;
  a.x_scales = v.x_scales;
  a.topk_idx = v.topk_idx;
  a.topk_weights = v.topk_weights;
  a.layout = o.expanded ? RecvLayout::kExpanded : RecvLayout::kCompact;
  a.expert_alignment = o.alignment;
  a.num_worst_tokens = o.worst;
  a.deterministic = true;
  a.zero_padding = true;
  return a;
}

}  // namespace epx::testing
