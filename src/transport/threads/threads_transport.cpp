#include "threads/threads_transport.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "epx/error.hpp"
#include "epx/spi/resources.hpp"

namespace epx::detail {

namespace {
// Blocks let go per launch (keyed by its control block), freed by free_all.
std::mutex g_graveyard_mutex;
std::map<const ControlBlock*, std::vector<std::byte*>> g_graveyard;
}  // namespace

ThreadsTransport::ThreadsTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout)
    : MappedTransport(control, rank, timeout, mapped_caps("threads")) {}

ThreadsTransport::ThreadsTransport(const ThreadsTransport& parent, int)
    : MappedTransport(parent.control_, parent.rank(), parent.timeout(), mapped_caps("threads")), endpoint_(true) {
  inherit_from(parent);
}

ThreadsTransport::~ThreadsTransport() {
  if (endpoint_) let_go();  // the parent's block stays in the table: free_all frees it
}

std::unique_ptr<Transport> ThreadsTransport::open_endpoint() {
  return std::unique_ptr<Transport>(new ThreadsTransport(*this, 0));
}

void ThreadsTransport::let_go() noexcept {
  if (mine_ == nullptr) return;
  std::lock_guard<std::mutex> lock(g_graveyard_mutex);
  g_graveyard[control_].push_back(mine_);
  mine_ = nullptr;
}

void ThreadsTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  std::byte*& slot = control_->window_table()[rank()];
  if (window_bytes == 0 && num_signals == 0) {  // release only: local (the block is kept until the launch ends)
    if (!endpoint_ && slot == mine_) slot = nullptr;
    let_go();
    clear_segments();
    return;
  }
  bootstrap_barrier("allocate: enter");  // nobody touches the old windows any more
  if (!endpoint_ && slot == mine_) slot = nullptr;
  let_go();
  clear_segments();
  std::byte* const parents = endpoint_ ? slot : nullptr;
  const std::size_t bytes = segment_bytes(window_bytes, num_signals);
  // Before anything is allocated (every rank asks the same size, so every rank refuses alike).
  detail::check_memory_fits("rank " + std::to_string(rank()) + ": ", "the window", bytes, 1, false);
  mine_ = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (mine_ == nullptr)
    throw Error(ErrorCode::kCapacityExceeded,
                "rank " + std::to_string(rank()) + ": cannot allocate a window of " + std::to_string(bytes) + " bytes");
  std::memset(mine_, 0, bytes);
  slot = mine_;
  bootstrap_barrier("allocate: published");
  std::vector<std::byte*> bases(control_->window_table(), control_->window_table() + num_ranks());
  set_segments(bases, window_bytes, num_signals);
  bootstrap_barrier("allocate: mapped");
  if (endpoint_) slot = parents;  // the table entry is the parent's again (free_all frees it)
}

void ThreadsTransport::free_all(ControlBlock* control) noexcept {
  for (int r = 0; r < control->num_ranks; ++r) {
    std::free(control->window_table()[r]);
    control->window_table()[r] = nullptr;
  }
  std::lock_guard<std::mutex> lock(g_graveyard_mutex);
  auto it = g_graveyard.find(control);
  if (it == g_graveyard.end()) return;
  for (std::byte* p : it->second) std::free(p);
  g_graveyard.erase(it);
}

}  // namespace epx::detail
