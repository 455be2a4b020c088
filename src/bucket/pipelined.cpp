// Pipelined (reduce_scatter, all_reduce with puts only: OpenSHMEM across machines, the
// simulator): each member's part is cut into chunks; round r, every member puts its
// contribution to chunk r of every other member's part into that member's slot (bf16 when
// the precision says so) while it sums chunk r of its own part from its slots, in member
// order. all_reduce then puts each summed chunk into every member's tensor, and a done
// round tells them it landed. Two slots per channel with credits: a member runs at most one
// chunk ahead of the slowest receiver. Only the end waits for the puts to complete (quiet):
// over a transport that moves puts while the receiver polls (UCX over TCP), every member
// keeps several transfers in flight.
#include <algorithm>

#include "algorithms.hpp"
#include "kernels.hpp"

namespace epx::detail {

namespace {

class Pipeline {
 public:
  Pipeline(BucketContext& ctx, BucketCall& c) : ctx_(ctx), c_(c), n_(c.n()) {
    bf16_ = c.op == BucketOp::kReduceScatter && c.precision == CommPrecision::kBF16;
    const std::uint64_t cap = ctx.ch.layout().chunk_bytes / wire_bytes(bf16_);
    for (int k = 0; k < n_; ++k) {
      chunks_.push_back(chunks_of(part_of(c, k), cap));
      rounds_ = std::max(rounds_, chunks_.back().size());
    }
    pack_.resize(2 * static_cast<std::size_t>(n_));
    srcs_.resize(static_cast<std::size_t>(n_));
    slot_.resize(static_cast<std::size_t>(n_));
  }

  void run() {
    if (rounds_ > 0) send(0);
    for (std::size_t r = 0; r < rounds_; ++r) {
      if (r + 1 < rounds_) send(r + 1);
      receive(r);
    }
    if (!ctx_.t.caps().put_completes_on_return) ctx_.t.quiet(0);
    if (c_.op != BucketOp::kAllReduce) return;
    for (int s = 1; s < n_; ++s) ctx_.ch.send_done(rank_of((c_.me + s) % n_));
    for (int s = 1; s < n_; ++s) ctx_.ch.wait_done(rank_of((c_.me + n_ - s) % n_), "bucket done");
  }

 private:
  int rank_of(int member) const { return c_.members[static_cast<std::size_t>(member)]; }
  const std::vector<Piece>* chunk(int k, std::size_t r) const {
    const auto& ck = chunks_[static_cast<std::size_t>(k)];
    return r < ck.size() ? &ck[r] : nullptr;
  }

  /// My contribution to chunk r of every other member's part.
  void send(std::size_t r) {
    for (int s = 1; s < n_; ++s) {
      const int k = (c_.me + s) % n_;
      if (const auto* pieces = chunk(k, r)) put_chunk(k, *pieces, r);
    }
    // No quiet: the signal is ordered after the puts, and a packed bf16 buffer is reused two
    // rounds later, after the receiver's credit says it has read what it carried.
    for (int s = 1; s < n_; ++s) {
      const int k = (c_.me + s) % n_;
      if (chunk(k, r)) ctx_.ch.send(rank_of(k));
    }
  }

  void put_chunk(int k, const std::vector<Piece>& pieces, std::size_t r) {
    const int peer = rank_of(k);
    ctx_.ch.wait_credit(peer, "bucket chunk credit");
    std::size_t off = ctx_.ch.out_slot(peer) + kHeaderBytes;
    if (bf16_) {
      auto& pack = pack_[static_cast<std::size_t>(2 * k) + r % 2];
      pack.resize(static_cast<std::size_t>(elems_of(pieces)));
      std::size_t at = 0;
      for (const Piece& p : pieces) {
        pack_bf16(pack.data() + at, reinterpret_cast<const float*>(c_.in[static_cast<std::size_t>(p.tensor)]) + p.elem,
                  static_cast<std::size_t>(p.count));
        at += static_cast<std::size_t>(p.count);
      }
      ctx_.t.put(peer, off, pack.data(), at * 2, 0);
      return;
    }
    for (const Piece& p : pieces) {
      ctx_.t.put(peer, off, c_.in[static_cast<std::size_t>(p.tensor)] + p.elem * 4, p.count * 4, 0);
      off += p.count * 4;
    }
  }

  /// Chunk r of my own part: every member's contribution, summed in member order.
  void receive(std::size_t r) {
    const auto* pieces = chunk(c_.me, r);
    if (!pieces) return;
    for (int j = 0; j < n_; ++j)
      if (j != c_.me) slot_[static_cast<std::size_t>(j)] = ctx_.ch.receive(rank_of(j), "bucket chunk") + kHeaderBytes;
    std::uint64_t pos = 0;
    const std::uint64_t wire = wire_bytes(bf16_);
    for (const Piece& p : *pieces) {
      float* own = reinterpret_cast<float*>(c_.out[static_cast<std::size_t>(p.tensor)]) + p.elem;
      for (int j = 0; j < n_; ++j)
        srcs_[static_cast<std::size_t>(j)] =
            j == c_.me ? ReduceSource{own, bf16_ ? SourceKind::kF32ToBF16 : SourceKind::kF32}
                       : ReduceSource{slot_[static_cast<std::size_t>(j)] + pos * wire, bf16_ ? SourceKind::kBF16Bits : SourceKind::kF32};
      reduce_into(own, srcs_.data(), n_, static_cast<std::size_t>(p.count), c_.scale);
      if (c_.op == BucketOp::kAllReduce)
        for (int s = 1; s < n_; ++s) {
          const int j = (c_.me + s) % n_;
          const TensorDesc& d = c_.headers[static_cast<std::size_t>(j)].tensors[static_cast<std::size_t>(p.tensor)];
          ctx_.t.put(rank_of(j), d.out_off + p.elem * 4, own, p.count * 4, 0);
        }
      pos += p.count;
    }
    for (int j = 0; j < n_; ++j)
      if (j != c_.me) ctx_.ch.consume(rank_of(j));
  }

  BucketContext& ctx_;
  BucketCall& c_;
  int n_;
  bool bf16_ = false;
  std::vector<std::vector<std::vector<Piece>>> chunks_;  ///< [member][round]
  std::size_t rounds_ = 0;
  std::vector<std::vector<std::uint16_t>> pack_;  ///< [2 member + round % 2] my bf16 contribution to its chunk
  std::vector<ReduceSource> srcs_;
  std::vector<const std::byte*> slot_;
};

}  // namespace

void run_pipelined(BucketContext& ctx, BucketCall& c) { Pipeline(ctx, c).run(); }

}  // namespace epx::detail
