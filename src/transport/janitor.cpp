#include "epx/spi/janitor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

namespace epx::detail {

namespace {

int g_pipe_write = -1;  // this process's end; -1 until the janitor runs
pid_t g_owner = 0;      // the process that started it (a forked child must not write)


[[noreturn]] void janitor_main(int read_fd) {
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  // Holds none of the owner's output open (a pipe reader waits for its last writer).
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    dup2(null, 0), dup2(null, 1), dup2(null, 2);
    close(null);
  }
  // Messages: "D<path>\n" a directory, "S<prefix>\n" a segment prefix.
  std::string buf;
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(read_fd, chunk, sizeof chunk);
    if (n > 0) {
      buf.append(chunk, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EOF: the owner is gone
  }
  std::size_t at = 0;
  while (at < buf.size()) {
    const std::size_t nl = buf.find('\n', at);
    if (nl == std::string::npos) break;
    const std::string line = buf.substr(at, nl - at);
    at = nl + 1;
    if (line.size() < 2) continue;
    if (line[0] == 'D') {
      std::error_code ec;
      std::filesystem::remove_all(line.substr(1), ec);
    } else if (line[0] == 'S') {
      unlink_segments(line.substr(1));
    }
  }
  _exit(0);
}

bool start_janitor() {
  if (g_pipe_write >= 0 && g_owner == getpid()) return true;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  if (pid == 0) {
    close(fds[1]);
    // Not a child the owner waits for: a new session keeps Ctrl-C's process-group signal away too.
    setsid();
    janitor_main(fds[0]);
  }
  close(fds[0]);
  g_pipe_write = fds[1];
  g_owner = getpid();
  return true;
}

void send(char kind, const std::string& what) {
  if (what.empty() || what.find('\n') != std::string::npos || !start_janitor()) return;
  const std::string msg = kind + what + "\n";
  std::size_t off = 0;
  while (off < msg.size()) {
    const ssize_t n = write(g_pipe_write, msg.data() + off, msg.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace

void remove_at_exit(const std::string& path) { send('D', std::filesystem::absolute(path).string()); }

void unlink_segments_at_exit(const std::string& prefix) { send('S', prefix); }

void janitor_after_fork_in_child() noexcept {
  if (g_pipe_write >= 0) {
    close(g_pipe_write);
    g_pipe_write = -1;
  }
}

void unlink_segments(const std::string& prefix) noexcept {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir))
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.emplace_back(e->d_name);
  closedir(dir);
  for (const std::string& n : names) shm_unlink(("/" + n).c_str());
}

}  // namespace epx::detail
