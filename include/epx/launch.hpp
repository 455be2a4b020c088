// epx/launch.hpp — start P ranks on this machine, each with a connected Transport.
//
//   epx::launch({.num_ranks = 8}, [](epx::Transport& t) { ... this runs on every rank ... });
//
// `threads`: ranks are threads of this process (fast tests, ThreadSanitizer).
// `sim`: like `threads`, and every transport operation is recorded for the discrete-event
// model of `epx sim` (epx/sim/trace.hpp); LaunchOptions::sim picks copy or model-only mode
// and where the records go.
// `shm` (default): ranks are P forked processes; each rank's window is a POSIX
// shared-memory segment (mode 0600, per-job unique name, unlinked as soon as every rank
// mapped it). launch() is called by one thread of a single-threaded process; it returns
// when every rank returned, or throws the error of the rank at fault after stopping the
// others (a rank that does not stop by itself within the timeout is killed). No
// /dev/shm entry is left behind either way.
#pragma once

#include <chrono>
#include <functional>
#include <string_view>

#include "epx/sim/trace.hpp"
#include "epx/transport.hpp"

namespace epx {

enum class TransportKind { kThreads, kShm, kSim };

/// "threads" | "shm" | "sim"; throws kInvalidArgument naming the accepted values otherwise.
TransportKind parse_transport_kind(std::string_view name);
const char* to_string(TransportKind kind) noexcept;

struct LaunchOptions {
  int num_ranks = 1;                             ///< P >= 1
  TransportKind transport = TransportKind::kShm;
  std::chrono::milliseconds timeout{60000};      ///< every wait of every rank
  sim::SimTransportOptions sim{};                ///< kSim only: mode and trace sink
};

/// The function every rank runs. It may throw: the exception becomes the launch's error
/// (epx::Error keeps its code and origin rank; other exceptions become kInternal).
using RankFn = std::function<void(Transport&)>;

/// Runs `fn` on P ranks and waits for all. Throws epx::Error if any rank failed: the one
/// reported by the rank at fault (or, failing that, by the lowest failed rank), with the
/// failed rank named in the message.
void launch(const LaunchOptions& options, const RankFn& fn);

}  // namespace epx
