// epx/launch.hpp — start P ranks on this machine, each with a connected Transport.
//
//   epx::launch({.num_ranks = 8}, [](epx::Transport& t) { ... this runs on every rank ... });
//
// `threads`: ranks are threads of this process (fast tests, ThreadSanitizer).
// `sim`: like `threads`, on the simulator's transport (copy mode, nothing kept); the
// recording options of `epx sim` (model-only mode, the trace) are in epx/sim/launch.hpp.
// `shm` (default): ranks are P forked processes; each rank's window is a POSIX
// shared-memory segment (mode 0600, per-job unique name, unlinked as soon as every rank
// mapped it). launch() is called by one thread of a single-threaded process; it returns
// when every rank returned, or throws the error of the rank at fault after stopping the
// others (a rank that does not stop by itself within the timeout is killed). No
// /dev/shm entry is left behind either way. Each rank gets PR_SET_PDEATHSIG = SIGKILL: a
// launcher that is itself SIGKILLed takes its ranks with it, and its segments are unlinked
// by the janitor (epx/spi/janitor.hpp). SIGINT/SIGTERM of the launcher stop the ranks,
// clean up, and then end the launcher by that signal.
//
// A rank's report of how it ended names the phase it was last in (each transport wait
// records its phase in the rank's control-block slot): "rank 3 was killed by signal 9
// (SIGKILL) in phase 'dispatch notify'". The out-of-memory killer is named only when the
// cgroup's oom_kill count rose during the launch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "epx/transport.hpp"

namespace epx {

enum class TransportKind { kThreads, kShm, kSim };

/// "threads" | "shm" | "sim"; throws kInvalidArgument naming the accepted values otherwise.
TransportKind parse_transport_kind(std::string_view name);
const char* to_string(TransportKind kind) noexcept;

/// The most ranks launch() starts: 1024 on every transport, and with `shm` (a process per
/// rank) also at most kMaxRanksPerCore per online core: beyond that the ranks only spin
/// the machine to a standstill (1000 processes on 2 cores gave a load of 470).
inline constexpr int kMaxRanks = 1024;
inline constexpr int kMaxRanksPerCore = 32;

/// The largest P launch() accepts for `transport` on this machine (see kMaxRanks).
int max_ranks(TransportKind transport) noexcept;

/// The one rule for a timeout given in milliseconds (the CLI's --timeout-ms, every
/// LaunchOptions::timeout): 1 <= ms <= 86'400'000 (one day). Throws kInvalidArgument
/// naming `what` otherwise.
std::chrono::milliseconds checked_timeout(std::int64_t ms, const std::string& what = "--timeout-ms");

struct LaunchOptions {
  int num_ranks = 1;                             ///< 1 <= P <= max_ranks(transport)
  TransportKind transport = TransportKind::kShm;
  std::chrono::milliseconds timeout{60000};      ///< every wait of every rank (checked_timeout's rule)
  /// kShm only (epx/elastic.hpp): a rank that dies (killed, or exited without returning)
  /// does not end the job. The others keep running — their next wait throws kPeerFailed
  /// naming it, and they may agree_survivors / rebuild_group and go on — and launch()
  /// returns normally if every rank that did not die returned normally (a rank that throws
  /// still fails the launch, as without elastic). A rank that is stopped when all the others
  /// have ended is killed and counted as lost. kThreads / kSim: kUnsupported.
  bool elastic = false;
  /// With `elastic`: if set, receives the ranks that died (ascending); empty if none did.
  std::vector<int>* lost = nullptr;
  /// With `elastic`: how many ranks may join while the job runs (epx/elastic.hpp:
  /// request_ranks, admit), over the whole launch. Joiner k (in the order they were asked
  /// for) has the root number num_ranks + k (in `lost`, and in the launcher's messages).
  /// num_ranks + spare_ranks <= max_ranks(kShm).
  int spare_ranks = 0;
};

/// The function every rank runs. It may throw: the exception becomes the launch's error
/// (epx::Error keeps its code and origin rank; other exceptions become kInternal).
using RankFn = std::function<void(Transport&)>;

/// Runs `fn` on P ranks and waits for all. Throws epx::Error if any rank failed: the one
/// reported by the rank at fault (or, failing that, by the lowest failed rank), with the
/// failed rank named in the message.
void launch(const LaunchOptions& options, const RankFn& fn);

}  // namespace epx
