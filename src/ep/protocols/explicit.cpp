// The explicit completion protocol (Protocol::kExplicit): plain puts; at the end of the
// call every queue is quieted (Sender::flush) and then each peer gets one signal per
// worker. Relies on: a quiet completes the queue's puts, and a signal after a quiet is seen
// after them. The receiver waits for every source's and worker's signal (the default).
#include "../protocol.hpp"

namespace epx::detail {
namespace {

class Explicit final : public CompletionProtocol {
 public:
  void before_signal(Sender& s, int q) const override { s.impl().transport.quiet(q); }
  void finish(Sender& s) const override {
    if (s.signal_slot() == Sender::kNoSignal) return;
    for (int d : s.peers()) s.impl().transport.signal(d, s.signal_slot(), s.impl().epoch, s.queue_of(d));
  }
};

}  // namespace

const CompletionProtocol& explicit_unit() {
  static const Explicit unit;
  return unit;
}

}  // namespace epx::detail
