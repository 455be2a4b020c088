// The MPI baseline's dispatcher (mpi_baseline_dispatcher.hpp).
#include "mpi_baseline_dispatcher.hpp"

#include <algorithm>
#include <cmath>

namespace epx_mpi_baseline::detail {
namespace {

template <class T>
T* ptr(std::vector<T>& v) {
  static T dummy{};
  return v.empty() ? &dummy : v.data();
}

}  // namespace

Dispatcher::Dispatcher(const Meta& m, int rank, const RankInput& in, bool expanded, int alignment,
                       std::vector<int> node_of_rank)
    : m_(m), rank_(rank), in_(in), expanded_(expanded), A_(alignment),
      H_(static_cast<std::size_t>(m.H)), K_(static_cast<std::size_t>(m.K)), node_of_(std::move(node_of_rank)) {
  MPI_Type_contiguous(m.H * 2, MPI_BYTE, &row_t_);
  MPI_Type_commit(&row_t_);
  MPI_Type_contiguous(m.K * 12, MPI_BYTE, &meta_t_);
  MPI_Type_commit(&meta_t_);
  const auto P = static_cast<std::size_t>(m.P);
  send_counts_.assign(P, 0);
  recv_counts_.assign(P, 0);
  sdispl_.assign(P, 0);
  rdispl_.assign(P, 0);
  out_.assign(static_cast<std::size_t>(in.S) * H_, 0);
  acc_.assign(H_, 0.0f);
  node_acc_.assign(H_, 0.0f);
}

Dispatcher::~Dispatcher() {
  MPI_Type_free(&row_t_);
  MPI_Type_free(&meta_t_);
}

void Dispatcher::dispatch() {
  count_destinations();
  permute();
  exchange();
  num_recv_per_expert_.assign(static_cast<std::size_t>(m_.L), 0);
  if (expanded_) restore_expanded();
  else restore_compact();
}

// (1) rows per destination rank, then the counts exchange.
void Dispatcher::count_destinations() {
  const int P = m_.P, L = m_.L, S = in_.S;
  dest_mark_.assign(static_cast<std::size_t>(S) * P, 0);
  std::fill(send_counts_.begin(), send_counts_.end(), 0);
  for (int t = 0; t < S; ++t) {
    std::uint8_t* mark = &dest_mark_[static_cast<std::size_t>(t) * P];
    for (std::size_t k = 0; k < K_; ++k) {
      const std::int64_t e = in_.idx[t * K_ + k];
      if (e >= 0) {
        const auto d = static_cast<int>(e / L);
        if (!mark[d]) {
          mark[d] = 1;
          ++send_counts_[static_cast<std::size_t>(d)];
        }
      }
    }
  }
  MPI_Alltoall(send_counts_.data(), 1, MPI_INT, recv_counts_.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int ns = 0, nr = 0;
  for (int d = 0; d < P; ++d) {
    sdispl_[static_cast<std::size_t>(d)] = ns;
    rdispl_[static_cast<std::size_t>(d)] = nr;
    ns += send_counts_[static_cast<std::size_t>(d)];
    nr += recv_counts_[static_cast<std::size_t>(d)];
  }
  n_send_ = ns;
  n_recv_ = nr;
}

// (2) permute into the send buffer, grouped by destination, token ascending.  Also note,
// per token, the send-buffer rows in the order combine must add them.
void Dispatcher::permute() {
  const int P = m_.P, S = in_.S;
  send_x_.resize(static_cast<std::size_t>(n_send_) * H_);
  send_meta_.resize(static_cast<std::size_t>(n_send_) * K_ * 12);
  comb_rows_.resize(static_cast<std::size_t>(S) * K_);
  comb_node_.resize(static_cast<std::size_t>(S) * K_);
  comb_n_.assign(static_cast<std::size_t>(S), 0);
  cursor_.assign(sdispl_.begin(), sdispl_.end());
  pos_.assign(static_cast<std::size_t>(P), -1);
  for (int t = 0; t < S; ++t) {
    const std::uint8_t* mark = &dest_mark_[static_cast<std::size_t>(t) * P];
    const std::size_t tk = static_cast<std::size_t>(t) * K_;
    for (int d = 0; d < P; ++d) {
      if (!mark[d]) continue;
      const int r = cursor_[static_cast<std::size_t>(d)]++;
      pos_[static_cast<std::size_t>(d)] = r;
      std::memcpy(&send_x_[static_cast<std::size_t>(r) * H_], &in_.x[t * H_], H_ * 2);
      char* meta = &send_meta_[static_cast<std::size_t>(r) * K_ * 12];
      std::memcpy(meta, &in_.idx[tk], K_ * 8);
      std::memcpy(meta + K_ * 8, &in_.w[tk], K_ * 4);
    }
    comb_n_[static_cast<std::size_t>(t)] = combine_order(t, mark, &comb_rows_[tk]);
  }
}

// Token t's send-buffer rows (pos_: its row per destination) in the order combine adds
// them: compact ascending destination; expanded the groups in ascending order of their
// largest k; node first regrouped by node. Returns their number.
int Dispatcher::combine_order(int t, const std::uint8_t* mark, int* rows) {
  const std::size_t tk = static_cast<std::size_t>(t) * K_;
  const int L = m_.L;
  int n = 0;
  if (!expanded_) {
    for (int d = 0; d < m_.P; ++d)
      if (mark[d]) rows[n++] = pos_[static_cast<std::size_t>(d)];
  } else {
    for (std::size_t k = 0; k < K_; ++k) {
      const std::int64_t e = in_.idx[tk + k];
      if (e < 0) continue;
      const std::int64_t d = e / L;
      bool last = true;
      for (std::size_t k2 = k + 1; k2 < K_; ++k2) {
        if (in_.idx[tk + k2] >= 0 && in_.idx[tk + k2] / L == d) last = false;
      }
      if (last) rows[n++] = pos_[static_cast<std::size_t>(d)];
    }
  }
  if (!node_of_.empty()) n = node_first_rows(mark, pos_, rows, &comb_node_[tk]);
  return n;
}

// (3) the all-to-all of the rows and of the routing metadata.
void Dispatcher::exchange() {
  recv_x_.resize(static_cast<std::size_t>(n_recv_) * H_);
  recv_meta_.resize(static_cast<std::size_t>(n_recv_) * K_ * 12);
  MPI_Alltoallv(ptr(send_x_), send_counts_.data(), sdispl_.data(), row_t_, ptr(recv_x_),
                recv_counts_.data(), rdispl_.data(), row_t_, MPI_COMM_WORLD);
  MPI_Alltoallv(ptr(send_meta_), send_counts_.data(), sdispl_.data(), meta_t_, ptr(recv_meta_),
                recv_counts_.data(), rdispl_.data(), meta_t_, MPI_COMM_WORLD);
}

// (4) DeepEP compact: recv_x is the alltoallv output; local topk ids and weights.
void Dispatcher::restore_compact() {
  const std::int64_t base = static_cast<std::int64_t>(rank_) * m_.L;
  recv_topk_idx_.resize(static_cast<std::size_t>(n_recv_) * K_);
  recv_topk_w_.resize(static_cast<std::size_t>(n_recv_) * K_);
  for (int i = 0; i < n_recv_; ++i) {
    const char* meta = &recv_meta_[static_cast<std::size_t>(i) * K_ * 12];
    for (std::size_t k = 0; k < K_; ++k) {
      std::int64_t e;
      float wt;
      std::memcpy(&e, meta + k * 8, 8);
      std::memcpy(&wt, meta + K_ * 8 + k * 4, 4);
      const bool local = e >= base && e < base + m_.L;
      recv_topk_idx_[i * K_ + k] = local ? e - base : -1;
      recv_topk_w_[i * K_ + k] = local ? wt : 0.0f;
      if (local) ++num_recv_per_expert_[static_cast<std::size_t>(e - base)];
    }
  }
}

// (4) Expanded: one row per (token, local slot), grouped by local expert, (source, token)
// order inside an expert, each expert padded to a multiple of A with zero rows.
void Dispatcher::restore_expanded() {
  const int L = m_.L;
  const std::int64_t base = static_cast<std::int64_t>(rank_) * L;
  auto local_expert = [&](int i, std::size_t k) {  // -1: slot k of received row i is not ours
    std::int64_t e;
    std::memcpy(&e, &recv_meta_[static_cast<std::size_t>(i) * K_ * 12 + k * 8], 8);
    return e >= base && e < base + L ? static_cast<int>(e - base) : -1;
  };
  slot_row_.assign(static_cast<std::size_t>(n_recv_) * K_, -1);
  for (int i = 0; i < n_recv_; ++i)
    for (std::size_t k = 0; k < K_; ++k)
      if (const int j = local_expert(i, k); j >= 0) ++num_recv_per_expert_[static_cast<std::size_t>(j)];
  offsets_.assign(static_cast<std::size_t>(L) + 1, 0);
  for (int j = 0; j < L; ++j) {
    const int n = num_recv_per_expert_[static_cast<std::size_t>(j)];
    offsets_[static_cast<std::size_t>(j) + 1] = offsets_[static_cast<std::size_t>(j)] + (n + A_ - 1) / A_ * A_;
  }
  n_exp_ = offsets_[static_cast<std::size_t>(L)];
  exp_x_.resize(static_cast<std::size_t>(n_exp_) * H_);
  exp_w_.resize(static_cast<std::size_t>(n_exp_));
  exp_cursor_.assign(offsets_.begin(), offsets_.end() - 1);
  for (int i = 0; i < n_recv_; ++i) {
    for (std::size_t k = 0; k < K_; ++k) {
      const int j = local_expert(i, k);
      if (j < 0) continue;
      const int r = exp_cursor_[static_cast<std::size_t>(j)]++;
      slot_row_[i * K_ + k] = r;
      std::memcpy(&exp_x_[static_cast<std::size_t>(r) * H_], &recv_x_[static_cast<std::size_t>(i) * H_], H_ * 2);
      std::memcpy(&exp_w_[static_cast<std::size_t>(r)], &recv_meta_[static_cast<std::size_t>(i) * K_ * 12 + K_ * 8 + k * 4], 4);
    }
  }
  for (int j = 0; j < L; ++j) {  // zero padding rows
    const int from = exp_cursor_[static_cast<std::size_t>(j)];
    const int to = offsets_[static_cast<std::size_t>(j) + 1];
    if (to > from) {
      std::memset(&exp_x_[static_cast<std::size_t>(from) * H_], 0, static_cast<std::size_t>(to - from) * H_ * 2);
      std::fill(exp_w_.begin() + from, exp_w_.begin() + to, 0.0f);
    }
  }
}

void Dispatcher::combine(const std::uint16_t* y) {
  const std::uint16_t* partial = reduce_expert_slots(y);
  comb_recv_.resize(static_cast<std::size_t>(n_send_) * H_);
  MPI_Alltoallv(const_cast<std::uint16_t*>(n_recv_ ? partial : &dummy_row_), recv_counts_.data(),
                rdispl_.data(), row_t_, ptr(comb_recv_), send_counts_.data(), sdispl_.data(),
                row_t_, MPI_COMM_WORLD);
  sum_partials();
}

// The expert rank's side: one partial per received token. Compact: the token's row is its
// partial. Expanded: the f32 sum from 0.0f of its slots in ascending k, rounded to bf16; a
// single slot passes unchanged.
const std::uint16_t* Dispatcher::reduce_expert_slots(const std::uint16_t* y) {
  if (!expanded_) return y;
  partial_.resize(static_cast<std::size_t>(n_recv_) * H_);
  float* acc = acc_.data();
  for (int i = 0; i < n_recv_; ++i) {
    const int* rows = &slot_row_[static_cast<std::size_t>(i) * K_];
    std::uint16_t* dst = &partial_[static_cast<std::size_t>(i) * H_];
    int n = 0, only = -1;
    for (std::size_t k = 0; k < K_; ++k) {
      if (rows[k] >= 0) {
        ++n;
        only = rows[k];
      }
    }
    if (n == 1) {
      std::memcpy(dst, y + static_cast<std::size_t>(only) * H_, H_ * 2);
      continue;
    }
    std::fill(acc, acc + H_, 0.0f);
    for (std::size_t k = 0; k < K_; ++k) {  // ascending k
      if (rows[k] < 0) continue;
      const std::uint16_t* src = y + static_cast<std::size_t>(rows[k]) * H_;
      for (std::size_t h = 0; h < H_; ++h) acc[h] += bf16_to_f32(src[h]);
    }
    for (std::size_t h = 0; h < H_; ++h) dst[h] = f32_to_bf16(acc[h]);
  }
  return partial_.data();
}

// Source side: out[t] = bf16(0.0f + sum of the partials in the fixed order); node first: a
// node's partials (consecutive in comb_rows_) summed and rounded first, a node with one
// partial passing it unchanged.
void Dispatcher::sum_partials() {
  float* acc = acc_.data();
  float* node_acc = node_acc_.data();
  for (int t = 0; t < in_.S; ++t) {
    std::fill(acc, acc + H_, 0.0f);
    const int* rows = &comb_rows_[static_cast<std::size_t>(t) * K_];
    const int* nodes = &comb_node_[static_cast<std::size_t>(t) * K_];
    const int n = comb_n_[static_cast<std::size_t>(t)];
    for (int g = 0; g < n;) {
      int end = g + 1;
      while (!node_of_.empty() && end < n && nodes[end] == nodes[g]) ++end;
      const std::uint16_t* src = &comb_recv_[static_cast<std::size_t>(rows[g]) * H_];
      if (end == g + 1) {
        for (std::size_t h = 0; h < H_; ++h) acc[h] += bf16_to_f32(src[h]);
      } else {
        std::fill(node_acc, node_acc + H_, 0.0f);
        for (int i = g; i < end; ++i) {
          const std::uint16_t* row = &comb_recv_[static_cast<std::size_t>(rows[i]) * H_];
          for (std::size_t h = 0; h < H_; ++h) node_acc[h] += bf16_to_f32(row[h]);
        }
        for (std::size_t h = 0; h < H_; ++h) acc[h] += bf16_to_f32(f32_to_bf16(node_acc[h]));
      }
      g = end;
    }
    std::uint16_t* dst = &out_[static_cast<std::size_t>(t) * H_];
    for (std::size_t h = 0; h < H_; ++h) dst[h] = f32_to_bf16(acc[h]);
  }
}

std::vector<std::uint16_t> Dispatcher::replay_expert_y() const {
  const int rows = recv_rows();
  const std::uint16_t* x = recv_rows_data();
  std::vector<std::uint16_t> y(static_cast<std::size_t>(rows) * H_, 0);
  auto scale = [&](int row, std::int64_t n) {
    const auto c = static_cast<float>(static_cast<double>(n + 1) *
                                      std::pow(256.0, static_cast<double>(n % 4)));
    for (std::size_t h = 0; h < H_; ++h) {
      y[static_cast<std::size_t>(row) * H_ + h] =
          f32_to_bf16(bf16_to_f32(x[static_cast<std::size_t>(row) * H_ + h]) * c);
    }
  };
  if (expanded_) {
    for (int j = 0; j < m_.L; ++j) {
      const auto ju = static_cast<std::size_t>(j);
      for (int r = offsets_[ju]; r < offsets_[ju] + num_recv_per_expert_[ju]; ++r) scale(r, j);
    }
  } else {
    for (int i = 0; i < rows; ++i) {
      std::int64_t n = 0;
      for (std::size_t k = 0; k < K_; ++k) n += std::max<std::int64_t>(0, recv_topk_idx_[i * K_ + k]);
      scale(i, n);
    }
  }
  return y;
}

int Dispatcher::node_first_rows(const std::uint8_t* mark, const std::vector<int>& pos, int* rows, int* nodes) const {
  int n = 0, last = 0;
  for (int node : node_of_) last = std::max(last, node);
  for (int node = 0; node <= last; ++node)
    for (int d = 0; d < m_.P; ++d)
      if (mark[d] && node_of_[static_cast<std::size_t>(d)] == node) {
        rows[n] = pos[static_cast<std::size_t>(d)];
        nodes[n++] = node;
      }
  return n;
}

}  // namespace epx_mpi_baseline::detail
