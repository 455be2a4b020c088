// What a Buffer carries from one collective call to the next, as one small state machine:
// which areas of every peer's window the previous call proved free, whether this rank's
// latest dispatch output is a view of its window, and the handle that dispatch used. It
// decides whether a call may put its data before the header exchange ("rows first" for a
// dispatch, "replies first" for a combine; docs/engine.md). The state is the same on every
// rank, because every input to it comes from the headers every rank sees alike (or from
// the call itself, which every rank makes in the same order). It also knows the
// asynchronous call in flight, if any: until it finishes, every other call is refused.
#pragma once

#include <cstdint>
#include <string>

#include "epx/error.hpp"

namespace epx::detail {

class AsyncCall;

class CallState {
 public:
  /// A dispatch starts. `possible`: the support table and the window allow rows first at
  /// all; `view`: this dispatch returns views of my receive area. Returns whether its rows
  /// go before the header exchange: only right after a combine whose headers proved every
  /// receive area free (every peer finished its last dispatch, and nobody holds a view).
  bool begin_dispatch(bool possible, bool view) noexcept {
    const bool first = possible && receive_areas_free_;
    receive_areas_free_ = reply_areas_free_ = false;  // until this call's exchange says otherwise
    view_ = view;
    return first;
  }
  /// The dispatch's header exchange succeeded: `any_view` = some rank's header said it
  /// holds a view of its receive area; `handle` = the dispatch epoch of the handle used or made.
  void dispatch_exchanged(bool any_view, std::uint64_t handle) noexcept {
    reply_areas_free_ = !any_view;  // every peer sent its header after reducing its last combine
    last_handle_ = handle;
  }
  /// A combine starts with the handle of dispatch epoch `handle` (0: a bad input, no handle).
  /// Returns whether its replies go before the header exchange: only right after a dispatch
  /// with that handle whose headers said no rank holds a view (nobody can pull then).
  bool begin_combine(bool possible, std::uint64_t handle) noexcept {
    const bool first = possible && reply_areas_free_ && handle != 0 && handle == last_handle_;
    receive_areas_free_ = reply_areas_free_ = false;
    return first;
  }
  /// The combine's header exchange succeeded: every peer is done with its last dispatch's
  /// receive area, which is free for the next dispatch's rows unless someone holds a view.
  void combine_exchanged(bool any_view) noexcept { receive_areas_free_ = !any_view; }

  /// My latest dispatch returned views of my receive area (sent in every header).
  bool holds_view() const noexcept { return view_; }

  /// Local, before a call touches anything: throws if an asynchronous call is pending.
  /// `call`: what was asked ("dispatch", "combine"), `rank`: this rank.
  void refuse_while_pending(const char* call, int rank) const {
    if (pending_ == nullptr) return;
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(rank) + ": " + call + " refused: the asynchronous " + pending_name_ +
                    " on this Buffer is still pending; finish it first (PendingDispatch/PendingCombine::finish, "
                    "Python: event.wait())",
                rank);
  }
  /// An asynchronous call (`name`, e.g. "dispatch (call 7)") is in flight until finished().
  void begin_async(AsyncCall* call, std::string name) {
    pending_ = call;
    pending_name_ = std::move(name);
  }
  void end_async() noexcept { pending_ = nullptr; }
  AsyncCall* pending() const noexcept { return pending_; }

 private:
  AsyncCall* pending_ = nullptr;
  std::string pending_name_;
  bool view_ = false;
  bool receive_areas_free_ = false;
  bool reply_areas_free_ = false;
  std::uint64_t last_handle_ = 0;
};

}  // namespace epx::detail
