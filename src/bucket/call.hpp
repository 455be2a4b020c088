// One bucket call inside the library: what this rank asked for, what every member's
// header said, and the state an event waits on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "epx/bucket.hpp"

namespace epx::detail {

enum class BucketOp : std::uint8_t { kAllGather = 1, kReduceScatter = 2, kAllReduce = 3 };
/// "all_gather" | "reduce_scatter" | "all_reduce": names the call in errors.
const char* op_name(BucketOp op) noexcept;

/// Offset meaning "not in the storage".
inline constexpr std::uint64_t kOutside = ~std::uint64_t{0};

/// One tensor of a call as one member describes it (what its header carries).
struct TensorDesc {
  std::uint64_t bytes = 0;        ///< all_gather: the src's; reductions: x's
  std::uint64_t in_off = kOutside;   ///< storage offset of the src / x
  std::uint64_t out_off = kOutside;  ///< all_gather: the gathered tensor's; reductions: x's
  DType dtype = DType::kF32;
  bool operator==(const TensorDesc&) const = default;
};

/// A member's call header.
struct CallHeader {
  BucketOp op = BucketOp::kAllReduce;
  CommPrecision precision = CommPrecision::kFP32;
  float scale = 1.0f;
  int group = 0;
  std::uint64_t members_hash = 0;  ///< of the group's world ranks
  BucketAlgorithm algorithm = BucketAlgorithm::kNone;
  std::uint64_t payload_bytes = 0;  ///< staged: bytes after the header area
  std::vector<TensorDesc> tensors;
  std::optional<CallProblem> problem;  ///< the member's own verdict on its inputs
};

/// Bytes of `h` on the wire (at most kHeaderWireBytes; a long problem text is cut to fit).
std::size_t encode_header(const CallHeader& h, std::byte* out);
/// Throws kInternal naming `from` if the bytes are not a header.
CallHeader decode_header(const std::byte* in, int from);

/// The call as this rank runs it.
struct BucketCall {
  BucketOp op = BucketOp::kAllReduce;
  int group = 0;
  std::vector<int> members;  ///< world ranks, ascending
  int me = 0;                ///< my position in members
  CommPrecision precision = CommPrecision::kFP32;
  float scale = 1.0f;
  /// This rank's tensors: in = src / x, out = gathered tensor / x.
  std::vector<const std::byte*> in;
  std::vector<std::byte*> out;
  std::vector<TensorView> in_views;  ///< shapes and dtypes as given
  CallHeader mine;
  std::vector<CallHeader> headers;  ///< [n], by member, after the exchange
  std::vector<const std::byte*> slots;  ///< [n]: the slot each member's header arrived in (mine: null)
  bool via_board = false;  ///< the headers went through the one-shot boards (no channel message to consume)
  std::vector<MutableView> results;
  BucketStats stats;

  // The data phase and its state (an event waits on it).
  std::function<void()> data_phase;
  std::mutex m;
  std::condition_variable cv;
  enum class State { kQueued, kRunning, kDone } state = State::kDone;
  std::exception_ptr error;
  bool waited = false;  ///< its event was waited for or dropped: the buffer takes the next call

  int n() const noexcept { return static_cast<int>(members.size()); }
  int num_tensors() const noexcept { return static_cast<int>(mine.tensors.size()); }
  const char* call_name = nullptr;  ///< names the call in errors (default: the op's name)
  const char* name() const noexcept { return call_name ? call_name : op_name(op); }
  /// Runs the data phase here unless another thread took it; waits for it either way.
  /// Returns with state kDone; rethrows nothing (see error).
  void run_or_wait();
  /// As run_or_wait, but a wait for another thread's run ends after `timeout`; true when done.
  bool run_or_wait_for(std::chrono::milliseconds timeout);
};

}  // namespace epx::detail
