// Two-level all_reduce, puts only, for a group laid out machine by machine (M machines of L
// members each, in member order): docs/spec.md §8's sum is a left fold in member order, so it can
// run machine after machine. The elements are split into L lane parts; member l of every
// machine owns lane l. Per chunk of lane l:
//   * every member of machine m puts its contribution to the lane-l member of machine m;
//   * that member continues the fold: the partial sum from machine m - 1's lane-l member
//     (machine 0 starts with member 0's value), plus its machine's members in order, and
//     sends the partial on to machine m + 1 (one message across machines per lane);
//   * the last machine's lane-l member has the result: it writes it into its machine's
//     tensors and sends it back to the lane-l member of every other machine, which writes
//     it into its own machine's tensors.
// Across machines each element travels twice (the partial forward, the result back) on
// one lane, instead of 2(P-1)/P times per member for the flat reduce-scatter + all-gather.
// A done round inside each machine ends the call.
#include <algorithm>
#include <cstring>

#include "algorithms.hpp"
#include "kernels.hpp"

namespace epx::detail {

namespace {

class TwoLevel {
 public:
  TwoLevel(BucketContext& ctx, BucketCall& c) : ctx_(ctx), c_(c) {
    const auto& mach = ctx.machine_of_rank;
    while (L_ < c.n() && mach[static_cast<std::size_t>(c.members[static_cast<std::size_t>(L_)])] ==
                             mach[static_cast<std::size_t>(c.members[0])])
      ++L_;
    M_ = c.n() / L_;
    m_ = c.me / L_;
    l_ = c.me % L_;
    const std::uint64_t cap = ctx.ch.layout().chunk_bytes / 4;
    for (int l = 0; l < L_; ++l) {
      lanes_.push_back(chunks_of(stream_part(c, L_, l), cap));
      rounds_ = std::max(rounds_, lanes_.back().size());
    }
    for (auto& p : partial_) p.resize(static_cast<std::size_t>(cap));
    srcs_.resize(static_cast<std::size_t>(L_) + 1);
  }

  void run() {
    if (rounds_ > 0) contribute(0);
    for (std::size_t r = 0; r < rounds_; ++r) {
      if (r + 1 < rounds_) contribute(r + 1);
      fold(r);
      if (m_ < M_ - 1 && r > 0) take_result(r - 1);
    }
    if (m_ < M_ - 1 && rounds_ > 0) take_result(rounds_ - 1);
    if (!ctx_.t.caps().put_completes_on_return) ctx_.t.quiet(0);
    for (int s = 1; s < L_; ++s) ctx_.ch.send_done(rank_at(m_, (l_ + s) % L_));
    for (int s = 1; s < L_; ++s) ctx_.ch.wait_done(rank_at(m_, (l_ + L_ - s) % L_), "bucket done");
  }

 private:
  int rank_at(int machine, int lane) const { return c_.members[static_cast<std::size_t>(machine * L_ + lane)]; }
  const std::vector<Piece>* chunk(int lane, std::size_t r) const {
    const auto& ch = lanes_[static_cast<std::size_t>(lane)];
    return r < ch.size() ? &ch[r] : nullptr;
  }
  float* own(const Piece& p) const { return reinterpret_cast<float*>(c_.out[static_cast<std::size_t>(p.tensor)]) + p.elem; }

  /// My elements of chunk r of every other lane, to that lane's member on my machine.
  void contribute(std::size_t r) {
    for (int s = 1; s < L_; ++s) {
      const int lane = (l_ + s) % L_;
      const auto* pieces = chunk(lane, r);
      if (!pieces) continue;
      const int peer = rank_at(m_, lane);
      ctx_.ch.wait_credit(peer, "bucket chunk credit");
      std::size_t off = ctx_.ch.out_slot(peer) + kHeaderBytes;
      for (const Piece& p : *pieces) {
        ctx_.t.put(peer, off, own(p), p.count * 4, 0);
        off += p.count * 4;
      }
    }
    for (int s = 1; s < L_; ++s)
      if (chunk((l_ + s) % L_, r)) ctx_.ch.send(rank_at(m_, (l_ + s) % L_));
  }

  /// Chunk r of my lane: the fold through my machine's members.
  void fold(std::size_t r) {
    const auto* pieces = chunk(l_, r);
    if (!pieces) return;
    std::vector<const std::byte*> slot(static_cast<std::size_t>(L_));
    for (int lane = 0; lane < L_; ++lane)
      if (lane != l_) slot[static_cast<std::size_t>(lane)] = ctx_.ch.receive(rank_at(m_, lane), "bucket chunk") + kHeaderBytes;
    const std::byte* before = m_ > 0 ? ctx_.ch.receive(rank_at(m_ - 1, l_), "bucket partial sum") + kHeaderBytes : nullptr;
    std::uint64_t pos = 0;
    for (const Piece& p : *pieces) {
      int k = 0;
      if (before) srcs_[static_cast<std::size_t>(k++)] = {before + pos * 4, SourceKind::kF32};
      for (int lane = 0; lane < L_; ++lane)
        srcs_[static_cast<std::size_t>(k++)] = {lane == l_ ? static_cast<const void*>(own(p)) : slot[static_cast<std::size_t>(lane)] + pos * 4,
                                                SourceKind::kF32};
      const bool last = m_ == M_ - 1;
      float* out = last ? own(p) : partial_[r % 2].data() + pos;
      reduce_into(out, srcs_.data(), k, static_cast<std::size_t>(p.count), last ? c_.scale : 1.0f);
      pos += p.count;
    }
    for (int lane = 0; lane < L_; ++lane)
      if (lane != l_) ctx_.ch.consume(rank_at(m_, lane));
    if (before) ctx_.ch.consume(rank_at(m_ - 1, l_));
    if (m_ < M_ - 1) return send_partial(r, pos);
    spread(*pieces);
    for (int m = 0; m < M_ - 1; ++m) send_result(m, *pieces);
    for (int m = 0; m < M_ - 1; ++m) ctx_.ch.send(rank_at(m, l_));
  }

  /// partial_[r % 2] is written again two rounds later, after the receiver's credit for it.
  void send_partial(std::size_t r, std::uint64_t elems) {
    const int peer = rank_at(m_ + 1, l_);
    ctx_.ch.wait_credit(peer, "bucket partial credit");
    ctx_.t.put(peer, ctx_.ch.out_slot(peer) + kHeaderBytes, partial_[r % 2].data(), elems * 4, 0);
    ctx_.ch.send(peer);
  }

  void send_result(int machine, const std::vector<Piece>& pieces) {
    const int peer = rank_at(machine, l_);
    ctx_.ch.wait_credit(peer, "bucket result credit");
    std::size_t off = ctx_.ch.out_slot(peer) + kHeaderBytes;
    for (const Piece& p : pieces) {
      ctx_.t.put(peer, off, own(p), p.count * 4, 0);
      off += p.count * 4;
    }
  }

  /// The result of my lane's chunk (in my tensor) into the tensors of my machine's other members.
  void spread(const std::vector<Piece>& pieces) {
    for (int s = 1; s < L_; ++s) {
      const int lane = (l_ + s) % L_, j = m_ * L_ + lane;
      for (const Piece& p : pieces) {
        const TensorDesc& d = c_.headers[static_cast<std::size_t>(j)].tensors[static_cast<std::size_t>(p.tensor)];
        ctx_.t.put(c_.members[static_cast<std::size_t>(j)], d.out_off + p.elem * 4, own(p), p.count * 4, 0);
      }
    }
  }

  /// Chunk r of my lane's result from the last machine: into my tensor and my machine's.
  void take_result(std::size_t r) {
    const auto* pieces = chunk(l_, r);
    if (!pieces) return;
    const int from = rank_at(M_ - 1, l_);
    const std::byte* slot = ctx_.ch.receive(from, "bucket result") + kHeaderBytes;
    std::uint64_t pos = 0;
    for (const Piece& p : *pieces) {
      std::memcpy(own(p), slot + pos * 4, p.count * 4);
      pos += p.count;
    }
    ctx_.ch.consume(from);
    spread(*pieces);
  }

  BucketContext& ctx_;
  BucketCall& c_;
  int L_ = 1, M_ = 1, m_ = 0, l_ = 0;
  std::vector<std::vector<std::vector<Piece>>> lanes_;  ///< [lane][round]
  std::size_t rounds_ = 0;
  std::vector<float> partial_[2];  ///< my machine's partial sums of rounds r % 2 (a put source until credited)
  std::vector<ReduceSource> srcs_;
};

}  // namespace

void run_two_level(BucketContext& ctx, BucketCall& c) { TwoLevel(ctx, c).run(); }

}  // namespace epx::detail
