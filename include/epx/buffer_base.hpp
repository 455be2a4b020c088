// epx/buffer_base.hpp — what every buffer kind shares (DeepEP V2.5's BufferBase): its own
// endpoint of the group, the collective lifecycle, and the agreements that make a bad
// input fail on every rank.
//
//   epx::launch({.num_ranks = 8}, [](epx::Transport& t) {
//     epx::Buffer ep(t, ep_config);                 // an EP buffer ...
//     epx::BucketBuffer bucket(t, {world}, plan);   // ... and a bucket buffer on the same ranks
//     ep.dispatch(...); bucket.all_reduce(...);     // neither touches the other's memory or signals
//     bucket.destroy();                             // collective, in any order
//   });
//
// Each buffer opens its own endpoint of the transport (Transport::open_endpoint): its own
// window and signal slots, created when the buffer is built and released at destroy(). Any
// number of buffers of any kinds may live on one transport at once; every rank creates and
// destroys them in the same order (creation and destruction are collective).
//
// Lifecycle, the same for every kind:
//   * construction is collective: every rank passes the same configuration, or every rank
//     throws kInvalidArgument naming the first differing value and the rank;
//   * destroy() is collective and idempotent; the destructor calls it when the caller did
//     not (errors there are swallowed: a destructor may run while unwinding);
//   * any call after destroy() throws kInvalidArgument "rank r: <kind>.<call>: the buffer
//     was destroyed" on the calling rank, without entering a collective;
//   * window_bytes() reports this rank's window (0 after destroy()).
// A buffer is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "epx/buffer_allocator.hpp"
#include "epx/error.hpp"
#include "epx/spi/agreement.hpp"
#include "epx/transport.hpp"

namespace epx {

/// One value every rank must agree on at construction (compared as strings).
struct AgreedValue {
  std::string name;   ///< e.g. "hidden", "plan entry 3"
  std::string value;  ///< e.g. "7168", "grads:[1048576]:float32@0"
};


namespace detail {
/// What a rank says in one agreement round (src/comm/buffer_base.cpp).
struct RoundMessage {
  std::int32_t code = -1;  // -1: no problem, else an ErrorCode
  std::uint32_t flags = 0;
  std::string text;
};
}  // namespace detail

class BufferBase {
 public:
  BufferBase(const BufferBase&) = delete;
  BufferBase& operator=(const BufferBase&) = delete;
  virtual ~BufferBase();

  /// Collective, idempotent: a barrier on this buffer's endpoint (every rank stops using the
  /// buffer), then its window is released. Throws kTimeout / kPeerFailed if a peer never
  /// arrives (the window is released anyway).
  void destroy();
  bool destroyed() const noexcept { return destroyed_; }

  /// "ep", "bucket", "pp", "engram": names the buffer in errors.
  const char* kind() const noexcept { return kind_; }
  int rank() const noexcept { return rank_; }
  int num_ranks() const noexcept { return num_ranks_; }
  /// Bytes of this rank's window (the kind's bytes and the base's agreement area), 0 after destroy().
  std::size_t window_bytes() const noexcept;
  /// This buffer's endpoint of the transport it was built on (what its calls run on: e.g.
  /// peer_window() tells whether peers' windows are mapped here). Throws after destroy().
  const Transport& transport() const;

 protected:
  /// Collective: opens this buffer's endpoint on `transport` (which must outlive the buffer)
  /// and a small window for agree(). A transport whose open_endpoint() returns nullptr is
  /// used itself: then it holds one buffer at a time.
  BufferBase(Transport& transport, const char* kind);

  /// Collective, at construction or at any time between collective calls (it runs in the
  /// base's own agreement area, which exists before and after allocate()): every rank passes
  /// its values (the same names in the same order) and its own problem with them ("" if none). Throws kInvalidArgument on every rank:
  /// the lowest rank's problem if any rank has one ("rank r: <problem>", origin r), else the
  /// first value that differs from rank 0's ("rank r: <kind> config differs from rank 0's:
  /// name = a vs b", origin r).
  void agree(const std::vector<AgreedValue>& values, const std::string& problem);
  /// agree() on a plan's entries, one value per tensor ("plan entry i").
  static std::vector<AgreedValue> plan_values(const BufferAllocator& plan);

  /// Collective: (re)creates the window: `bytes` for the kind (offsets 0..bytes), zeroed and
  /// pre-faulted, and `num_signals` signal slots for the kind (0..num_signals); the base's
  /// own agreement area and slots come after both. Sizes are checked against the machine's
  /// memory before anything is allocated.
  void allocate(std::size_t bytes, std::size_t num_signals);

  /// The endpoint, for the kind's puts, signals and waits. Throws kInvalidArgument
  /// "rank r: <kind>.<call>: the buffer was destroyed" after destroy().
  Transport& endpoint(const char* call);
  /// Throws as endpoint() does after destroy(); a kind's entry points call it first.
  void require_alive(const char* call) const;
  /// This rank's window (the kind's bytes at offset 0); nullptr after destroy().
  std::byte* window() noexcept;

  /// Collective, per call, before anything moves: every rank passes its verdict; every rank
  /// then throws the same error if any rank has a problem (epx/spi/agreement.hpp: the lowest
  /// such rank's code, origin and words; "every rank: ..." with origin -1 when all ranks have
  /// the same one). Costs one exchange of the base's agreement area (P small puts and
  /// signals per rank).
  void agree_call(const char* call, const std::optional<CallProblem>& mine);

  /// The same rule, for a kind that carries its ranks' verdicts in its own first exchange
  /// instead: `all[p]` is rank p's verdict. Local.
  void resolve_call_problems(const char* call, const std::vector<std::optional<CallProblem>>& all) const {
    spi::throw_agreed_error(call, all, rank_);
  }

  /// Called by destroy() before the window goes: a kind releases what lies in it.
  virtual void on_destroy() noexcept {}

  /// The endpoint as a shared reference, for what must keep its window mapped after
  /// destroy() (the EP buffer's one-copy outputs). Null after destroy().
  std::shared_ptr<Transport> endpoint_ref() const noexcept;

 private:
  /// One agreement round over the base's area: every rank's message, by rank.
  std::vector<detail::RoundMessage> round(const detail::RoundMessage& mine, const char* phase);

  Transport* transport_;
  std::shared_ptr<Transport> endpoint_;  // own (open_endpoint), or the transport itself, not owned
  const char* kind_;
  int rank_;
  int num_ranks_;
  std::size_t user_bytes_ = 0;    // the kind's bytes
  std::size_t user_signals_ = 0;  // the kind's signal slots
  std::uint64_t agree_epoch_ = 0;
  bool destroyed_ = false;
};

}  // namespace epx
