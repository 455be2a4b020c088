// epx/error.hpp — the one error type of epx.
//
// Every failure epx reports is an epx::Error: a code saying what kind of failure it is
// and a message naming where (rank, token, slot) and what was expected. Collective calls
// throw on every rank of the call; `origin_rank()` names the rank at fault (the rank whose
// input was bad, or the peer that died or timed out), -1 when no single rank is to blame.
#pragma once

#include <stdexcept>
#include <string>

namespace epx {

enum class ErrorCode {
  kInvalidArgument,   ///< a value outside its documented range (topk_idx, alignment, ...)
  kShapeMismatch,     ///< a tensor has the wrong shape
  kDtypeMismatch,     ///< a tensor has the wrong dtype
  kCapacityExceeded,  ///< more rows than num_worst_tokens or than the buffer holds
  kBadHandle,         ///< an empty, foreign or stale dispatch handle
  kTimeout,           ///< a peer did not answer within the configured timeout
  kPeerFailed,        ///< a peer process died or reported a failure
  kUnsupported,       ///< a valid request this build or transport cannot honour
  kIo,                ///< file input/output (the command-line tool)
  kInternal,          ///< a broken invariant inside epx (a bug)
};

/// Name of an error code, e.g. "invalid_argument".
const char* to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  /// `message` should already name rank/token/slot; `origin_rank` is the rank at fault.
  Error(ErrorCode code, const std::string& message, int origin_rank = -1);

  ErrorCode code() const noexcept { return code_; }
  int origin_rank() const noexcept { return origin_rank_; }

 private:
  ErrorCode code_;
  int origin_rank_;
};

}  // namespace epx
