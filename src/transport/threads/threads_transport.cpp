#include "threads/threads_transport.hpp"

#include <cstdlib>
#include <cstring>

#include "epx/error.hpp"

namespace epx::detail {

ThreadsTransport::ThreadsTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout)
    : MappedTransport(control, rank, timeout, mapped_caps("threads")) {}

void ThreadsTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  bootstrap_barrier("allocate: enter");  // nobody touches the old windows any more
  std::byte*& mine = control_->window_table()[rank()];
  std::free(mine);
  const std::size_t bytes = segment_bytes(window_bytes, num_signals);
  mine = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (mine == nullptr)
    throw Error(ErrorCode::kCapacityExceeded,
                "rank " + std::to_string(rank()) + ": cannot allocate a window of " + std::to_string(bytes) + " bytes");
  std::memset(mine, 0, bytes);
  bootstrap_barrier("allocate: published");
  std::vector<std::byte*> bases(control_->window_table(), control_->window_table() + num_ranks());
  set_segments(bases, window_bytes, num_signals);
  bootstrap_barrier("allocate: mapped");
}

void ThreadsTransport::free_all(ControlBlock* control) noexcept {
  for (int r = 0; r < control->num_ranks; ++r) {
    std::free(control->window_table()[r]);
    control->window_table()[r] = nullptr;
  }
}

}  // namespace epx::detail
