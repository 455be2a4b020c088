#include "epx/error.hpp"

namespace epx {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kShapeMismatch: return "shape_mismatch";
    case ErrorCode::kDtypeMismatch: return "dtype_mismatch";
    case ErrorCode::kCapacityExceeded: return "capacity_exceeded";
    case ErrorCode::kBadHandle: return "bad_handle";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerFailed: return "peer_failed";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message, int origin_rank)
    : std::runtime_error(message), code_(code), origin_rank_(origin_rank) {}

}  // namespace epx
