// The one liveness check of unwatched ranks (process_identity.hpp).
#include "process_identity.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

namespace epx::detail {
namespace {

std::uint64_t pid_namespace_of(const std::string& pid) noexcept {
  struct stat st {};
  return ::stat(("/proc/" + pid + "/ns/pid").c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

std::uint64_t own_pid_namespace() noexcept {
  static const std::uint64_t ns = pid_namespace_of("self");
  return ns;
}

/// Fields 3 and 22 of /proc/<pid>/stat (read with one read(): no stream, no allocation
/// failure to hide); present = false if it cannot be read.
ProcessIdentity::Seen read_stat(std::int32_t pid) noexcept {
  ProcessIdentity::Seen seen;
  try {
    const std::string path = "/proc/" + std::to_string(pid) + "/stat";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return seen;
    char buf[1024];
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) return seen;
    const std::string line(buf, static_cast<std::size_t>(n));
    const std::size_t close = line.rfind(')');  // the command name may hold spaces and ')'
    if (close == std::string::npos) return seen;
    std::istringstream rest(line.substr(close + 1));
    std::string field;
    rest >> seen.state;
    for (int f = 4; f <= 22 && rest >> field; ++f)
      if (f == 22) seen.start_time = std::strtoull(field.c_str(), nullptr, 10);
    seen.present = true;
  } catch (...) {
    seen = {};  // no memory for the path: nothing seen, which must not read as "gone"
    seen.present = true;
  }
  return seen;
}

}  // namespace

ProcessIdentity ProcessIdentity::self() noexcept {
  ProcessIdentity id;
  id.pid = static_cast<std::int32_t>(getpid());
  id.start_time = read_stat(id.pid).start_time;
  id.pid_ns = own_pid_namespace();
  return id;
}

bool ProcessIdentity::checkable() const noexcept { return pid > 0 && pid_ns != 0 && pid_ns == own_pid_namespace(); }

ProcessIdentity::Seen ProcessIdentity::look() const noexcept { return read_stat(pid); }

bool ProcessIdentity::ended(const Seen& seen) const noexcept {
  return !seen.present || seen.state == 'Z' || seen.state == 'X' ||
         (start_time != 0 && seen.start_time != 0 && seen.start_time != start_time);
}

bool ProcessIdentity::ended() const noexcept { return checkable() && ended(look()); }

std::string ProcessIdentity::describe(const Seen& seen) const {
  if (!seen.present) return "gone";
  if (seen.state == 'Z' || seen.state == 'X') return std::string("state ") + seen.state;
  return "started at " + std::to_string(seen.start_time) + ", not " + std::to_string(start_time);
}

}  // namespace epx::detail
