// Two-level all_reduce (machine by machine, SPEC §8's member order): see run_two_level.
#include "algorithms.hpp"
#include "epx/error.hpp"

namespace epx::detail {

void run_two_level(BucketContext&, BucketCall&) {
  throw Error(ErrorCode::kUnsupported, "bucket: two-level all_reduce is not built yet");
}

}  // namespace epx::detail
