// Fresh handles' per-row arrays, recycled across calls. A multi-MB std::vector freed and
// allocated again every call is given back to the kernel (malloc trims the heap) and faults
// in again page by page: ~360 page faults, ~0.5 ms of a rank's CPU per 4096-token dispatch
// (BENCHMARKS.md, "What we tried": FP8 and the expanded layout). When a handle dies, its
// arrays wait here, emptied with their capacity kept, for the next fresh handle.
#pragma once

#include <memory>
#include <mutex>

#include "handle.hpp"

namespace epx::detail {

class HandleRecycler {
 public:
  /// A default HandleState; its recycled arrays are empty but may keep a dead handle's capacity.
  std::shared_ptr<HandleState> make();

 private:
  struct Spare {
    std::mutex mutex;
    std::unique_ptr<HandleState> dead;  // the last dead handle's arrays (null: none kept)
  };
  std::shared_ptr<Spare> spare_ = std::make_shared<Spare>();
};

}  // namespace epx::detail
