// Who a rank's process is, to tell later whether it still lives — the one liveness check of
// the transports whose ranks no launcher watches: the shm groups that connect() made (and
// the groups rebuilt from them), which record each rank's identity in their control block,
// and the ucx transport's same-machine peers, whose identities go through the bootstrap.
// A process has ended when /proc/<pid>/stat is gone, shows a zombie, or shows another start
// time (its pid reused). A process of another pid namespace cannot be told apart: only the
// caller's timeout catches it.
#pragma once

#include <cstdint>
#include <string>

namespace epx::detail {

struct ProcessIdentity {
  std::int32_t pid = 0;
  std::uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  std::uint64_t pid_ns = 0;      // inode of /proc/<pid>/ns/pid

  /// What one look at /proc/<pid>/stat showed.
  struct Seen {
    bool present = false;          // the file could be read
    char state = '?';              // field 3
    std::uint64_t start_time = 0;  // field 22
  };

  /// This process.
  static ProcessIdentity self() noexcept;
  /// Whether ended() can tell: a pid, and the pid namespace of this process.
  bool checkable() const noexcept;
  /// One look at the process now.
  Seen look() const noexcept;
  /// Whether `seen` shows the process ended (gone, a zombie, or its pid reused).
  bool ended(const Seen& seen) const noexcept;
  /// checkable() and one look shows it ended. False while it runs, and when it cannot be told.
  bool ended() const noexcept;
  /// `seen` in words, for an error: "gone", "state Z", "started at T, not T0".
  std::string describe(const Seen& seen) const;
};

}  // namespace epx::detail
