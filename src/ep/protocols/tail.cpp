// The tail completion protocol (Protocol::kTail): plain puts; right after a worker's last
// put to a peer, its signal on the same queue, ordered after those puts by the transport
// (caps().ordered_signal). No quiet before it. The receiver waits for every source's and
// worker's signal (the default).
#include "../protocol.hpp"

namespace epx::detail {
namespace {

class Tail final : public CompletionProtocol {
 public:
  void end_channel(Sender& s, int d) const override {
    if (s.signal_slot() == Sender::kNoSignal) return;
    s.impl().transport.signal(d, s.signal_slot(), s.impl().epoch, s.queue_of(d));
  }
};

// Relies on ordered signals; every path takes it; views work.
constexpr spi::ProtocolRule kTailRow{Protocol::kTail, "tail", &TransportCaps::ordered_signal_per_queue,
                                     "signals ordered after earlier puts on their queue", true, "", nullptr, Protocol::kTail};

}  // namespace

const ProtocolUnit& tail_protocol() {
  static const Tail unit;
  static const ProtocolUnit protocol{kTailRow, unit};
  return protocol;
}

}  // namespace epx::detail
