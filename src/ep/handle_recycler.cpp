#include "handle_recycler.hpp"

namespace epx::detail {
namespace {

// The arrays a fresh dispatch sizes per row or slot, each moved from `from` into `to` and
// emptied. Listing one here only saves its page faults: a field not listed starts empty.
void take_arrays(HandleState& to, HandleState& from) {
  auto take = [](auto& a, auto& b) {
    a = std::move(b);
    a.clear();
  };
  take(to.plan.token_begin, from.plan.token_begin);
  take(to.plan.entry_rank, from.plan.entry_rank);
  take(to.plan.entry_position, from.plan.entry_position);
  take(to.plan.entry_max_slot, from.plan.entry_max_slot);
  take(to.plan.segment_token, from.plan.segment_token);
  take(to.plan.slot_rank_in_expert, from.plan.slot_rank_in_expert);
  take(to.recv_token, from.recv_token);
  take(to.recv_relay_row, from.recv_relay_row);
  take(to.recv_slot_row, from.recv_slot_row);
  take(to.recv_slot_weight, from.recv_slot_weight);
  take(to.slot_begin, from.slot_begin);
  take(to.slot_row, from.slot_row);
  take(to.slot_k, from.slot_k);
  take(to.slot_dest, from.slot_dest);
}

}  // namespace

std::shared_ptr<HandleState> HandleRecycler::make() {
  auto h = std::make_unique<HandleState>();
  {
    std::lock_guard<std::mutex> lock(spare_->mutex);
    if (spare_->dead) take_arrays(*h, *spare_->dead);
    spare_->dead.reset();
  }
  // The last owner (any thread, possibly after the Buffer is gone) leaves its arrays here.
  std::weak_ptr<Spare> weak = spare_;
  return std::shared_ptr<HandleState>(h.release(), [weak](HandleState* dead) {
    std::unique_ptr<HandleState> owned(dead);
    if (const std::shared_ptr<Spare> spare = weak.lock()) {
      std::lock_guard<std::mutex> lock(spare->mutex);
      if (!spare->dead) spare->dead = std::move(owned);
    }
  });
}

}  // namespace epx::detail
