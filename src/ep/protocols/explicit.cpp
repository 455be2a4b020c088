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

// Relies on nothing beyond quiet; every path takes it; views work.
constexpr spi::ProtocolRule kExplicitRow{Protocol::kExplicit, "explicit", nullptr, "", true, "", nullptr, Protocol::kExplicit};

}  // namespace

const ProtocolUnit& explicit_protocol() {
  static const Explicit unit;
  static const ProtocolUnit protocol{kExplicitRow, unit};
  return protocol;
}

}  // namespace epx::detail
