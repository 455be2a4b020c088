// BucketBuffer's state inside the library (src/bucket/bucket.cpp builds it, calls.cpp uses it).
#pragma once

#include <memory>
#include <vector>

#include "algorithms.hpp"
#include "board.hpp"
#include "call.hpp"
#include "channels.hpp"
#include "worker.hpp"

namespace epx {

struct BucketBuffer::Impl {
  /// `board_protocol`: the boards' (explicit, tail or flag); `channel_protocol`: the credit
  /// channels' and done signals' (explicit or tail; spi/kind_support.hpp).
  Impl(Transport& t, const detail::BucketLayout& layout, bool read_peers, std::vector<int> machines, BucketAlgorithm forced,
       bool yield, Protocol board_protocol, Protocol channel_protocol)
      : channels(t, layout, yield, channel_protocol), board(t, layout, yield, board_protocol),
        ctx{t, channels, read_peers, read_peers && layout.num_boards > 0 ? &board : nullptr, std::move(machines)}, forced(forced),
        header(detail::kHeaderBytes) {}
  detail::Channels channels;
  detail::Board board;
  detail::BucketContext ctx;
  BucketAlgorithm forced = BucketAlgorithm::kNone;
  std::vector<std::byte> header;  ///< my encoded call header (a put source until the exchange's quiet)
  std::shared_ptr<detail::BucketCall> pending;  ///< the last asynchronous call
  detail::Worker worker;
};

namespace detail {
/// FNV-1a of a group's ranks: what headers carry to tell groups apart.
std::uint64_t members_hash(const std::vector<int>& ranks);
}  // namespace detail

}  // namespace epx
