// epx/spi/janitor.hpp — what a process leaves behind is removed even if it is SIGKILLed
// (implementer header: the launcher and the tools use it, not user API).
//
// The first registration forks one small watcher process per process (the janitor). It
// ignores SIGINT/SIGTERM/SIGHUP and blocks reading a pipe whose only writer is this
// process (close-on-exec, closed in forked ranks); when the pipe closes — this process
// exited, normally or killed by any signal — it removes every registered directory and
// unlinks every /dev/shm segment under a registered prefix, then exits. Registered things
// this process removes itself are simply gone when the janitor looks.
#pragma once

#include <string>

namespace epx::detail {

/// Removes directory `path` (recursively) when this process ends, however it ends.
/// Local; call from a single-threaded moment (it may fork the janitor).
void remove_at_exit(const std::string& path);

/// Unlinks every /dev/shm segment whose name starts with `prefix` (no '/') at exit.
void unlink_segments_at_exit(const std::string& prefix);

/// Unlinks every /dev/shm segment whose name starts with `prefix` (no '/') now.
void unlink_segments(const std::string& prefix) noexcept;

/// In a freshly forked child (a rank): closes this process's end of the janitor's pipe so
/// that the janitor only waits for the process that registered with it. Async-signal-safe.
void janitor_after_fork_in_child() noexcept;

}  // namespace epx::detail
