// The checks of a bucket call (src/bucket/check.cpp).
#pragma once

#include <optional>
#include <vector>

#include "call.hpp"

namespace epx::detail {

/// This rank's storage.
struct StorageRange {
  std::byte* begin = nullptr;
  std::size_t bytes = 0;
  /// Offset of [p, p + n) if it lies inside, else kOutside.
  std::uint64_t offset_of(const void* p, std::size_t n) const noexcept;
};

/// Fill c.mine.tensors, c.in, c.out from the arguments; the first problem with them, if any
/// (c is then incomplete and only its header travels).
std::optional<CallProblem> describe_all_gather(BucketCall& c, const std::vector<TensorView>& srcs,
                                               const std::vector<MutableView>& dsts, const StorageRange& s);
std::optional<CallProblem> describe_reduction(BucketCall& c, const std::vector<MutableView>& xs, const StorageRange& s);

/// Every member's verdict, by member, from all headers (c.headers): its own problem, or how
/// it differs from the others. The same on every member.
std::vector<std::optional<CallProblem>> cross_check(const BucketCall& c);

}  // namespace epx::detail
