// epx/spi/agreement.hpp — the one rule by which every rank of a collective call turns the
// ranks' verdicts into the same error (implementer header: the buffer kinds and the EP
// engine's header exchange call it; users see its result as epx::Error).
//
//   nobody has a problem            -> returns
//   rank o (the lowest with one)    -> every rank throws o's code with origin_rank() == o and
//                                      the message "rank o: <call>: <message>"; a rank whose
//                                      own, different problem would be lost appends
//                                      "; rank r's own problem: <its message>"
//   every rank, the same problem    -> "every rank: <call>: <message>", origin_rank() == -1
//
// (`call` empty: no "<call>: " part.) Local: every rank applies it to the same verdicts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "epx/error.hpp"

namespace epx {

/// A rank's verdict on one collective call before anything moves: nullopt = fine.
struct CallProblem {
  ErrorCode code = ErrorCode::kInvalidArgument;
  std::string message;  ///< names the argument and what was expected, without the "rank r: " prefix
};

namespace spi {

/// Throws the agreed error of `all` (all[p] = rank p's verdict) on rank `me`, or returns.
void throw_agreed_error(const char* call, const std::vector<std::optional<CallProblem>>& all, int me);

}  // namespace spi
}  // namespace epx
