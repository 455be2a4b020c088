// Whether a call's payload values exist: the one place the simulator's model-only mode
// shows in the engine. Every transport moves payload bytes but a model-only simulator
// (sim::ModelTransport::moves_payload() false), which only accounts for the puts into the
// payload region (Geometry::payload_begin() on) and leaves the values unspecified. The
// engine then moves the same control data, issues the same puts and waits for the same
// signals, but does no work whose only product is payload values: the data path asks this
// policy at each such step instead of testing the mode itself.
#pragma once

#include <cstdint>
#include <utility>

#include "epx/sim/model_transport.hpp"
#include "geometry.hpp"

namespace epx::detail {

class PayloadPolicy {
 public:
  /// Asked once, of the Buffer's transport's model interface (null: no simulator).
  explicit PayloadPolicy(const sim::ModelTransport* model) noexcept
      : moves_(model == nullptr || model->moves_payload()) {}

  /// Payload values exist (every transport but a model-only simulator).
  bool moves() const noexcept { return moves_; }
  /// Runs `work`, whose only product is payload values (copies out of or into the window,
  /// sums, placements), where they exist.
  template <class F>
  void values(F&& work) const {
    if (moves_) std::forward<F>(work)();
  }
  /// The bytes that a put into region r carried have arrived: metadata always (the engine
  /// reads it), rows only where payload moves.
  bool carried(Region r) const noexcept { return moves_ || r == Region::kMeta; }
  /// A dispatch's recv_x is a view of the receive area: asked for (recv_in_window), or
  /// there are no values to copy out (the view's are as unspecified as a copy's would be).
  bool recv_view(bool asked) const noexcept { return asked || !moves_; }
  /// Peers may read each other's values in place (pull, relays summing in place): only
  /// where the values exist.
  bool reads_in_place() const noexcept { return moves_; }
  /// A combine's [S, H] output is computed into a tensor of its own; else (no values to
  /// add up) it is a view of the reply area.
  bool computes_sums() const noexcept { return moves_; }
  /// The output pool for a configured size (< 0: automatic). With no values the auto pool
  /// is none: its window still has the bytes a real one has, but no output uses them, so
  /// its calls go rows first as the copying engine's do. A pool sized explicitly stays
  /// (`epx sim --one-copy`): rows land in output blocks, whose payload is not moved either.
  std::int64_t output_pool_bytes(std::int64_t configured) const noexcept {
    return !moves_ && configured < 0 ? 0 : configured;
  }

 private:
  bool moves_;
};

}  // namespace epx::detail
