#include "epx/spi/resources.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "epx/error.hpp"

namespace epx::detail {

std::string read_file_bounded(const std::string& path, std::size_t max_bytes, const std::string& what) {
  auto fail = [&](const std::string& why) { throw Error(ErrorCode::kIo, what + " " + path + ": " + why); };
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot read the file (") + std::strerror(errno) + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    fail(dir ? "is a directory, expected a regular file" : "is not a regular file (a device, FIFO or socket)");
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    fail("is " + format_bytes(static_cast<std::uint64_t>(st.st_size)) + ", more than the " + format_bytes(max_bytes) +
         " epx reads");
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(std::string("read error (") + std::strerror(err) + ")");
    }
    if (n == 0) break;
    if (text.size() + static_cast<std::size_t>(n) > max_bytes) {
      ::close(fd);
      fail("grew beyond the " + format_bytes(max_bytes) + " epx reads");
    }
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

namespace {

// The first number of a one-line file ("max" -> nullopt-as-UINT64_MAX), UINT64_MAX if absent.
std::uint64_t read_number(const char* path) noexcept {
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) return UINT64_MAX;
  unsigned long long v = 0;
  const int got = std::fscanf(f, "%llu", &v);
  std::fclose(f);
  return got == 1 ? v : UINT64_MAX;
}

// This process's cgroup v2 directory under /sys/fs/cgroup ("" if not v2).
std::string cgroup_v2_dir() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  return {};
}

}  // namespace

std::uint64_t available_memory_bytes() noexcept {
  std::uint64_t avail = UINT64_MAX;
  try {
    std::ifstream f("/proc/meminfo");
    std::string key;
    std::uint64_t kib = 0;
    std::string unit;
    while (f >> key >> kib) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kib * 1024;
        break;
      }
    }
    auto lower_to_limit = [&](std::uint64_t limit, std::uint64_t usage) {
      if (limit == UINT64_MAX || usage == UINT64_MAX) return;
      avail = std::min(avail, limit > usage ? limit - usage : 0);
    };
    const std::string v2 = cgroup_v2_dir();
    if (!v2.empty())
      lower_to_limit(read_number((v2 + "/memory.max").c_str()), read_number((v2 + "/memory.current").c_str()));
    const std::uint64_t v1_limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (v1_limit < (std::uint64_t{1} << 60))
      lower_to_limit(v1_limit, read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes"));
  } catch (...) {
  }
  return avail;
}

std::uint64_t shm_free_bytes() noexcept {
  struct statvfs s {};
  if (statvfs("/dev/shm", &s) != 0) return UINT64_MAX;
  return mul_sat(s.f_bavail, s.f_frsize);
}

std::int64_t cgroup_oom_kills() noexcept {
  try {
    std::string path = cgroup_v2_dir();
    path = path.empty() ? "/sys/fs/cgroup/memory/memory.oom_control" : path + "/memory.events";
    std::ifstream f(path);
    if (!f) return -1;
    std::string key;
    std::int64_t v = 0;
    while (f >> key >> v)
      if (key == "oom_kill") return v;
  } catch (...) {
  }
  return -1;
}

std::int64_t threads_available() noexcept {
  std::uint64_t limit = UINT64_MAX;
  struct rlimit rl {};
  if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) limit = rl.rlim_cur;
  limit = std::min(limit, read_number("/proc/sys/kernel/threads-max"));
  limit = std::min(limit, read_number("/proc/sys/kernel/pid_max"));
  std::uint64_t running = 0;  // every task of the machine (RLIMIT_NPROC counts the user's; an upper bound)
  if (std::FILE* f = std::fopen("/proc/loadavg", "re")) {
    double a = 0, b = 0, c = 0;
    unsigned long long run = 0, total = 0;
    if (std::fscanf(f, "%lf %lf %lf %llu/%llu", &a, &b, &c, &run, &total) == 5) running = total;
    std::fclose(f);
  }
  std::uint64_t avail = limit == UINT64_MAX ? UINT64_MAX : (limit > running ? limit - running : 0);
  try {
    const std::string v2 = cgroup_v2_dir();
    if (!v2.empty()) {
      const std::uint64_t max = read_number((v2 + "/pids.max").c_str()), cur = read_number((v2 + "/pids.current").c_str());
      if (max != UINT64_MAX && cur != UINT64_MAX) avail = std::min(avail, max > cur ? max - cur : 0);
    }
  } catch (...) {
  }
  return avail == UINT64_MAX ? INT64_MAX : static_cast<std::int64_t>(std::min<std::uint64_t>(avail, INT64_MAX));
}

std::string format_bytes(std::uint64_t bytes) {
  if (bytes == UINT64_MAX) return "more than 16 EiB";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

void check_memory_fits(const std::string& who, const std::string& what, std::uint64_t per_rank, int ranks, bool in_shm) {
  const std::uint64_t total = mul_sat(per_rank, static_cast<std::uint64_t>(ranks < 1 ? 1 : ranks));
  const std::string need = what + " needs " + format_bytes(per_rank) + " per rank x " + std::to_string(ranks) +
                           " ranks = " + format_bytes(total);
  if (in_shm) {
    const std::uint64_t shm = shm_free_bytes();
    if (total > shm) throw Error(ErrorCode::kCapacityExceeded, who + need + "; /dev/shm has " + format_bytes(shm) + " free");
  }
  const std::uint64_t mem = available_memory_bytes();
  if (total > mem)
    throw Error(ErrorCode::kCapacityExceeded,
                who + need + "; the machine has " + format_bytes(mem) + " of memory available (MemAvailable / cgroup limit)");
}

}  // namespace epx::detail
