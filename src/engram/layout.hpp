// The one owner of an EngramBuffer's offsets and signal slots (implementer header).
//
// Window of every rank, the fetch area first (num_bytes), then the storage:
//   fetch area: outputs of layer l (T_max * E' rows of H values), all layers; their scales
//               (T_max * E' * S floats per layer); the served path's requests (one block
//               per requesting rank: L counts and reply bases, then L * T_max * E' int32
//               local rows) and its replies (L * T_max * E' rows + scale rows, filled by
//               the owners in request order).
//   storage:    layer l's N_l local rows, then their scale rows, layer after layer.
// Every region starts 64-byte aligned.
//
// Signal slots (served path): request(q) = fetches whose requests rank q put here;
// reply(p) = layers rank p has served to this rank, over all fetches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "epx/engram.hpp"

namespace epx::engram {

/// The served path's request header, one per requester in each owner's window.
struct RequestHeader {
  std::uint64_t fetch;  ///< the fetch's number on the requester (1, 2, ...)
  std::uint32_t num_layers;
  std::uint32_t pad;
  // then per layer: std::uint32_t count, std::uint32_t reply_base (rows), then the rows
};

class Layout {
 public:
  /// Checks `c` (throws kInvalidArgument naming the field) and lays it out for `num_ranks`.
  Layout(int num_ranks, const EngramConfig& c);

  int num_ranks() const noexcept { return P_; }
  int num_layers() const noexcept { return static_cast<int>(N_.size()); }
  std::int64_t entries(int l) const noexcept { return N_[static_cast<std::size_t>(l)]; }
  std::int64_t tokens() const noexcept { return T_; }
  std::int64_t per_token() const noexcept { return E_; }
  std::int64_t hidden() const noexcept { return H_; }
  std::int64_t sf_packs() const noexcept { return S_; }
  DType dtype() const noexcept { return dtype_; }
  std::size_t row_bytes() const noexcept { return row_bytes_; }
  std::size_t sf_row_bytes() const noexcept { return sf_row_bytes_; }
  /// Rows one fetch asks for at most: L * T_max * E'.
  std::size_t max_rows() const noexcept { return max_rows_; }

  std::size_t num_bytes() const noexcept { return fetch_bytes_; }
  std::size_t num_storage_bytes() const noexcept { return storage_bytes_; }

  /// Fetch area (offsets from the window's start).
  std::size_t out_offset(int l) const noexcept { return out_[static_cast<std::size_t>(l)]; }
  std::size_t out_sf_offset(int l) const noexcept { return out_sf_[static_cast<std::size_t>(l)]; }
  std::size_t request_offset(int requester) const noexcept {
    return requests_ + static_cast<std::size_t>(requester) * request_block_;
  }
  static std::size_t request_meta_bytes(int num_layers) noexcept {
    return sizeof(RequestHeader) + 8 * static_cast<std::size_t>(num_layers);
  }
  std::size_t reply_offset(std::size_t reply_row) const noexcept { return replies_ + reply_row * row_bytes_; }
  std::size_t reply_sf_offset(std::size_t reply_row) const noexcept { return reply_sf_ + reply_row * sf_row_bytes_; }

  /// Storage (offsets from the window's start, given the fetch area's size `num_bytes`).
  std::size_t row_offset(std::size_t num_bytes, int l, std::int64_t local_row) const noexcept {
    return num_bytes + store_[static_cast<std::size_t>(l)] + static_cast<std::size_t>(local_row) * row_bytes_;
  }
  std::size_t sf_offset(std::size_t num_bytes, int l, std::int64_t local_row) const noexcept {
    return num_bytes + store_sf_[static_cast<std::size_t>(l)] + static_cast<std::size_t>(local_row) * sf_row_bytes_;
  }

  static std::size_t request_signal(int requester) noexcept { return static_cast<std::size_t>(requester); }
  std::size_t reply_signal(int owner) const noexcept { return static_cast<std::size_t>(P_ + owner); }
  std::size_t num_signals() const noexcept { return 2 * static_cast<std::size_t>(P_); }

 private:
  int P_;
  std::vector<std::int64_t> N_;
  std::int64_t T_, E_, H_, S_;
  DType dtype_;
  std::size_t row_bytes_, sf_row_bytes_, max_rows_;
  std::vector<std::size_t> out_, out_sf_, store_, store_sf_;
  std::size_t requests_ = 0, request_block_ = 0, replies_ = 0, reply_sf_ = 0;
  std::size_t fetch_bytes_ = 0, storage_bytes_ = 0;
};

/// Problems of a config in words ("" if none): what set_config and the size hint refuse.
std::string config_problem(const EngramConfig& c);

}  // namespace epx::engram
