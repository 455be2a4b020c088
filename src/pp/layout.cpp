#include "layout.hpp"

#include <algorithm>
#include <string>

#include "epx/error.hpp"
#include "epx/spi/resources.hpp"

namespace epx::pp {

Layout::Layout(int num_ranks, std::size_t max_tensor_bytes, int inflight,
               const std::vector<std::pair<int, int>>& links, std::size_t chunk_bytes, std::size_t user_bytes)
    : num_ranks_(num_ranks), inflight_(inflight), all_(links.empty()), user_bytes_(user_bytes) {
  if (chunk_bytes % 64 != 0)
    throw Error(ErrorCode::kInvalidArgument, "pp: chunk_bytes = " + std::to_string(chunk_bytes) +
                                                 ", expected 0 (the default) or a multiple of 64");
  if (chunk_bytes != 0) chunk_bytes_ = chunk_bytes;
  if (!all_) {
    peers_.resize(static_cast<std::size_t>(num_ranks));
    for (std::size_t i = 0; i < links.size(); ++i) {
      const auto [a, b] = links[i];
      if (a < 0 || a >= num_ranks || b < 0 || b >= num_ranks)
        throw Error(ErrorCode::kInvalidArgument, "pp: link " + std::to_string(i) + " {" + std::to_string(a) + ", " +
                                                     std::to_string(b) + "} names a rank outside 0.." +
                                                     std::to_string(num_ranks - 1));
      peers_[static_cast<std::size_t>(a)].push_back(b);
      peers_[static_cast<std::size_t>(b)].push_back(a);
    }
    for (auto& p : peers_) {
      std::sort(p.begin(), p.end());
      p.erase(std::unique(p.begin(), p.end()), p.end());
    }
  }
  std::size_t most = all_ ? static_cast<std::size_t>(num_ranks) : 0;
  for (const auto& p : peers_) most = std::max(most, p.size());
  const std::uint64_t slot = detail::add_sat(detail::add_sat(max_tensor_bytes, kHeaderBytes), 63) & ~std::uint64_t{63};
  slot_bytes_ = static_cast<std::size_t>(slot);
  const std::uint64_t slots = detail::mul_sat(detail::mul_sat(slot, most), static_cast<std::uint64_t>(inflight));
  rings_ = max_tensor_bytes / kRingChunks >= chunk_bytes_;
  control_ = static_cast<std::size_t>(slots);
  rings_at_ = static_cast<std::size_t>(detail::add_sat(slots, static_cast<std::uint64_t>(num_ranks) * 192));
  const std::uint64_t rings =
      rings_ ? detail::mul_sat(static_cast<std::uint64_t>(chunk_bytes_) * kRingChunks, most) : 0;
  const std::uint64_t end = detail::add_sat(rings_at_, rings);
  if (user_bytes == 0) {
    user_at_ = static_cast<std::size_t>(end);
    window_bytes_ = static_cast<std::size_t>(end);
    return;
  }
  user_at_ = static_cast<std::size_t>(detail::add_sat(end, 4095) & ~std::uint64_t{4095});
  window_bytes_ = static_cast<std::size_t>(detail::add_sat(user_at_, user_bytes));
}

std::size_t Layout::ring_offset(int receiver, int sender, std::uint64_t k) const noexcept {
  const auto inbox = static_cast<std::size_t>(inbox_index(receiver, sender));
  return rings_at_ + (inbox * kRingChunks + static_cast<std::size_t>(k % kRingChunks)) * chunk_bytes_;
}

std::vector<int> Layout::peers_of(int r) const {
  if (!all_) return peers_[static_cast<std::size_t>(r)];
  std::vector<int> all(static_cast<std::size_t>(num_ranks_));
  for (int i = 0; i < num_ranks_; ++i) all[static_cast<std::size_t>(i)] = i;
  return all;
}

int Layout::inbox_index(int receiver, int sender) const noexcept {
  if (receiver < 0 || receiver >= num_ranks_ || sender < 0 || sender >= num_ranks_) return -1;
  if (all_) return sender;
  const auto& p = peers_[static_cast<std::size_t>(receiver)];
  const auto it = std::lower_bound(p.begin(), p.end(), sender);
  return it != p.end() && *it == sender ? static_cast<int>(it - p.begin()) : -1;
}

std::size_t Layout::slot_offset(int receiver, int sender, std::uint64_t seq) const noexcept {
  const auto inbox = static_cast<std::size_t>(inbox_index(receiver, sender));
  const auto slot = static_cast<std::size_t>(seq % static_cast<std::uint64_t>(inflight_));
  return (inbox * static_cast<std::size_t>(inflight_) + slot) * slot_bytes_;
}

}  // namespace epx::pp
