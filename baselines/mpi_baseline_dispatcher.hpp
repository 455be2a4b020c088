// The MPI baseline's dispatcher: the Megatron-style all-to-all token dispatcher over
// MPI_Alltoallv (mpi_baseline.cpp's header says what each step does), with the combine in
// docs/spec.md §4's fixed float32 order. Collective over MPI_COMM_WORLD: every rank calls
// dispatch() and combine() the same number of times.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "mpi_baseline_input.hpp"

namespace epx_mpi_baseline::detail {

inline float bf16_to_f32(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffU) > 0x7f800000U) {  // NaN: keep it NaN (quiet)
    return static_cast<std::uint16_t>((u >> 16) | 0x0040U);
  }
  u += 0x7fffU + ((u >> 16) & 1U);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

class Dispatcher {
 public:
  // `node_of_rank`: [P] the node of each rank for the node-first combine order; empty = flat.
  Dispatcher(const Meta& m, int rank, const RankInput& in, bool expanded, int alignment,
             std::vector<int> node_of_rank = {});
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  void dispatch();

  // The dispatch output in the requested layout: [rows, H] bf16.
  const std::uint16_t* recv_rows_data() const { return expanded_ ? exp_x_.data() : recv_x_.data(); }
  int recv_rows() const { return expanded_ ? n_exp_ : n_recv_; }
  int recv_tokens() const { return n_recv_; }
  int sent_rows() const { return n_send_; }
  int sent_rows_remote() const { return n_send_ - send_counts_[static_cast<std::size_t>(rank_)]; }

  // Combine of y (rows of the dispatch output, same layout) back to [S, H] bf16 in out().
  void combine(const std::uint16_t* y);
  const std::vector<std::uint16_t>& out() const { return out_; }

  // The expert function of `epx replay` (docs/spec.md §7) over the dispatch output:
  // y = bf16(f32(row) * g(n)), g(n) = float((n + 1) * 256^(n mod 4)), n = the local expert
  // (expanded) or the sum of the row's local recv_topk_idx (compact); padding rows zero.
  std::vector<std::uint16_t> replay_expert_y() const;

 private:
  // dispatch's steps (see mpi_baseline.cpp's header).
  void count_destinations();
  void permute();
  int combine_order(int t, const std::uint8_t* mark, int* rows);
  void exchange();
  void restore_compact();
  void restore_expanded();
  // combine's steps.
  const std::uint16_t* reduce_expert_slots(const std::uint16_t* y);
  void sum_partials();
  // Node first: a token's partials by (node of the destination, destination) ascending;
  // fills rows / nodes, returns their number.
  int node_first_rows(const std::uint8_t* mark, const std::vector<int>& pos, int* rows, int* nodes) const;

  Meta m_;
  int rank_;
  const RankInput& in_;
  bool expanded_;
  int A_;
  std::size_t H_, K_;
  std::vector<int> node_of_;
  MPI_Datatype row_t_{}, meta_t_{};
  std::uint16_t dummy_row_ = 0;

  std::vector<int> send_counts_, recv_counts_, sdispl_, rdispl_, cursor_, pos_;
  int n_send_ = 0, n_recv_ = 0, n_exp_ = 0;
  std::vector<std::uint8_t> dest_mark_;
  std::vector<int> comb_rows_, comb_node_, comb_n_;
  std::vector<std::uint16_t> send_x_, recv_x_;
  std::vector<char> send_meta_, recv_meta_;
  std::vector<std::int64_t> recv_topk_idx_;
  std::vector<float> recv_topk_w_;
  std::vector<int> num_recv_per_expert_, offsets_, exp_cursor_, slot_row_;
  std::vector<std::uint16_t> exp_x_;
  std::vector<float> exp_w_;
  std::vector<std::uint16_t> partial_, comb_recv_, out_;
  std::vector<float> acc_, node_acc_;
};

}  // namespace epx_mpi_baseline::detail
