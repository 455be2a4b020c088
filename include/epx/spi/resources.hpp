// epx/spi/resources.hpp — what the machine has, checked before epx uses it (implementer
// header: the transports, the plan's file inputs and the tools call these; not user API).
//
// Every function here is local (no rank talks to another) and throws epx::Error only where
// it says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace epx::detail {

/// Largest file epx reads whole into memory as text or JSON (meta.json, topology files):
/// 64 MiB. A bigger (or endless: /dev/zero, a FIFO) input is refused, never read forever.
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{64} << 20;

/// Reads the regular file `path` whole. Throws kIo naming `what` and the path if it is not
/// a regular file (a directory, a device such as /dev/zero, a FIFO: refused without
/// blocking), cannot be read, or is larger than `max_bytes`.
std::string read_file_bounded(const std::string& path, std::size_t max_bytes, const std::string& what);

/// Bytes this process may still allocate without swapping or an OOM kill: MemAvailable of
/// /proc/meminfo, lowered to the cgroup's memory.max - memory.current (cgroup v2) or
/// limit - usage (v1) when that is smaller. SIZE_MAX if nothing can be read.
std::uint64_t available_memory_bytes() noexcept;

/// Free bytes of the file system holding /dev/shm (statvfs f_bavail * f_frsize), SIZE_MAX if
/// it cannot be read.
std::uint64_t shm_free_bytes() noexcept;

/// The cgroup's count of OOM kills so far (memory.events "oom_kill", cgroup v2; v1's
/// memory.oom_control "oom_kill"), -1 if this machine does not say.
std::int64_t cgroup_oom_kills() noexcept;

/// Threads (tasks) this user may still start: min(RLIMIT_NPROC, kernel.threads-max,
/// kernel.pid_max) minus the tasks running now (/proc/loadavg), INT64_MAX if unknown.
std::int64_t threads_available() noexcept;

/// "7.1 GiB", "512 KiB", "100 B": a size for error messages.
std::string format_bytes(std::uint64_t bytes);

/// Throws kCapacityExceeded, before anything is allocated, if `ranks` ranks of `per_rank`
/// bytes each do not fit in the available memory (and, with `in_shm`, in /dev/shm's free
/// space): "rank 3: the window needs 7.1 GiB per rank x 8 ranks = 56.8 GiB; /dev/shm has
/// 3.2 GiB free". `what` names the allocation ("the window", "the inputs and outputs"),
/// `who` prefixes the message ("rank 3: ", "epx bench: "). Overflowing products count as
/// too big.
void check_memory_fits(const std::string& who, const std::string& what, std::uint64_t per_rank, int ranks, bool in_shm);

/// a * b, saturated at UINT64_MAX (sizes computed from untrusted inputs).
inline std::uint64_t mul_sat(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
inline std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

}  // namespace epx::detail
