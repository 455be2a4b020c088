// threads/: ranks are threads of one process; windows are heap blocks published in the
// control block. For fast unit tests and ThreadSanitizer.
//
// Endpoints (open_endpoint) publish their blocks through the same control-block table
// between two bootstrap barriers, then keep their own pointer. A window a transport lets go
// (a new allocate, allocate(0, 0), its destruction) is not freed at once — a peer thread may
// still be unwinding through it after an error — but kept until the launch ends (free_all).
#pragma once

#include "mapped_transport.hpp"

namespace epx::detail {

class ThreadsTransport final : public MappedTransport {
 public:
  ThreadsTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout);
  ~ThreadsTransport() override;
  void allocate(std::size_t window_bytes, std::size_t num_signals) override;
  std::unique_ptr<Transport> open_endpoint() override;

  /// Frees every rank's window and every window let go; called by the launcher once all
  /// rank threads joined.
  static void free_all(ControlBlock* control) noexcept;

 private:
  ThreadsTransport(const ThreadsTransport& parent, int);  // an endpoint
  void let_go() noexcept;
  std::byte* mine_ = nullptr;  // this transport's block (the parent's is also in the table)
  bool endpoint_ = false;
};

}  // namespace epx::detail
