// threads/: ranks are threads of one process; windows are heap blocks published in the
// control block. For fast unit tests and ThreadSanitizer.
#pragma once

#include "mapped_transport.hpp"

namespace epx::detail {

class ThreadsTransport final : public MappedTransport {
 public:
  ThreadsTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout);
  void allocate(std::size_t window_bytes, std::size_t num_signals) override;

  /// Frees every rank's window; called by the launcher once all rank threads joined.
  static void free_all(ControlBlock* control) noexcept;
};

}  // namespace epx::detail
