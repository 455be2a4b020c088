// Forked ranks for the UCX transport's tests (connect_ucx_test.cpp): each rank joins through a
// FunctionBootstrap whose all-gather goes through a hub thread in the test process
// (socketpairs), optionally inside a "machine": a network namespace made by Machines below,
// entered the way tests/multinode/agent.sh enters one (`ip netns exec NS unshare --uts
// --mount --ipc --propagation private` with a private tmpfs on /dev/shm, /sys remounted for
// the namespace), here with the same system calls in a machine leader process that then
// forks that machine's ranks. UCX then finds no shared memory and no loopback towards the
// other machine: its bytes cross the veth.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/error.hpp"

namespace epx::testing::ucx {

inline bool write_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w, n -= static_cast<std::size_t>(w);
  }
  return true;
}
inline bool read_all(int fd, void* p, std::size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r, n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Gathers one message from every rank, sends the concatenation to all; ends when every rank
// closed its end, or when one closed while others have a round pending.
inline void run_hub(std::vector<int> fds) {
  const std::size_t P = fds.size();
  std::vector<std::vector<char>> msg(P);
  std::vector<bool> open(P, true), have(P, false);
  for (;;) {
    std::vector<pollfd> pf;
    for (std::size_t r = 0; r < P; ++r)
      if (open[r] && !have[r]) pf.push_back({fds[r], POLLIN, 0});
    if (pf.empty()) break;
    if (::poll(pf.data(), pf.size(), 100) <= 0) continue;
    for (const pollfd& p : pf) {
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const auto r = static_cast<std::size_t>(std::find(fds.begin(), fds.end(), p.fd) - fds.begin());
      std::uint64_t len = 0;
      if (!read_all(p.fd, &len, sizeof len)) {
        open[r] = false;
        continue;
      }
      msg[r].resize(len);
      if (!read_all(p.fd, msg[r].data(), len)) open[r] = false;
      else have[r] = true;
    }
    bool all = true, any = false, broken = false;
    for (std::size_t r = 0; r < P; ++r) all = all && have[r], any = any || have[r];
    for (std::size_t r = 0; r < P; ++r) broken = broken || (!open[r] && any);
    if (broken) break;
    if (!all) continue;
    std::vector<char> out;
    for (auto& m : msg) out.insert(out.end(), m.begin(), m.end());
    for (std::size_t r = 0; r < P; ++r) write_all(fds[r], out.data(), out.size()), have[r] = false;
  }
  for (int fd : fds) ::close(fd);
}

inline FunctionBootstrap::AllgatherFn socket_allgather(int fd, int P) {
  return [fd, P](const void* in, void* out, std::size_t bytes) {
    const std::uint64_t len = bytes;
    if (!write_all(fd, &len, sizeof len) || !write_all(fd, in, bytes) || !read_all(fd, out, bytes * static_cast<std::size_t>(P)))
      throw Error(ErrorCode::kPeerFailed, "test bootstrap: the hub closed (a peer left)");
  };
}

using Body = std::function<void(Bootstrap&)>;

// In a forked rank: body(bootstrap), exit 0 if it returns, 1 (message on stderr) if it throws.
[[noreturn]] inline void rank_process(int r, int P, int fd, const Body& body) {
  int code = 0;
  try {
    FunctionBootstrap b(r, P, socket_allgather(fd, P), "test-socket");
    body(b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    code = 1;
  }
  std::fflush(nullptr);
  ::_exit(code);
}

// Enters network namespace `ns` with its own UTS, mount and IPC namespaces, hostname `ns`, a
// private /dev/shm and the namespace's /sys (where UCX lists its network devices).
inline bool enter_machine(const std::string& ns) {
  const int fd = ::open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) return false;
  ::close(fd);
  if (::unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC) != 0) return false;
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  ::umount2("/sys", MNT_DETACH);
  if (::mount(ns.c_str(), "/sys", "sysfs", 0, nullptr) != 0) return false;
  if (::sethostname(ns.c_str(), ns.size()) != 0) return false;
  return ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=512m,mode=1777") == 0;
}

/// Forks P ranks (rank r on machine r / (P / machines.size()) when `machines` is not empty),
/// runs the hub until they are done; `during` runs in the test process meanwhile (e.g. cuts a
/// link). Returns each rank's success.
inline std::vector<bool> run_ranks(int P, const std::vector<std::string>& machines, const Body& body,
                                   const std::function<void()>& during = {}) {
  std::vector<int> hub, rank_fd;
  for (int r = 0; r < P; ++r) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) throw std::runtime_error("socketpair failed");
    hub.push_back(sv[0]), rank_fd.push_back(sv[1]);
  }
  std::fflush(nullptr);
  const int groups = machines.empty() ? P : static_cast<int>(machines.size()), per = P / groups;
  std::vector<pid_t> leaders;
  for (int g = 0; g < groups; ++g) {
    const pid_t pid = ::fork();
    if (pid != 0) {
      leaders.push_back(pid);
      continue;
    }
    for (int fd : hub) ::close(fd);
    if (!machines.empty() && !enter_machine(machines[static_cast<std::size_t>(g)])) {
      std::perror("entering the test machine");
      ::_exit(255);
    }
    std::vector<pid_t> ranks;
    for (int r = g * per; r < (g + 1) * per; ++r) {
      const pid_t rp = ::fork();
      if (rp == 0) {
        for (int fd : rank_fd)
          if (fd != rank_fd[static_cast<std::size_t>(r)]) ::close(fd);
        rank_process(r, P, rank_fd[static_cast<std::size_t>(r)], body);
      }
      ranks.push_back(rp);
    }
    for (int fd : rank_fd) ::close(fd);
    int failed = 0;  // bit i: the machine's rank i failed
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      int st = 0;
      ::waitpid(ranks[i], &st, 0);
      if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) failed |= 1 << i;
    }
    ::_exit(failed);
  }
  for (int fd : rank_fd) ::close(fd);
  std::thread hub_thread(run_hub, hub);
  if (during) during();
  hub_thread.join();
  std::vector<bool> ok(static_cast<std::size_t>(P), false);
  for (int g = 0; g < groups; ++g) {
    int st = 0;
    ::waitpid(leaders[static_cast<std::size_t>(g)], &st, 0);
    for (int i = 0; i < per; ++i) ok[static_cast<std::size_t>(g * per + i)] = WIFEXITED(st) && WEXITSTATUS(st) != 255 && !(WEXITSTATUS(st) & (1 << i));
  }
  return ok;
}

/// Runs a command (no shell), its output captured; true if it exited 0.
inline bool run_cmd(const std::string& cmd, std::string* out = nullptr) {
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return false;
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f) != nullptr) text += buf;
  const int st = ::pclose(f);
  if (out != nullptr) *out = text;
  return st == 0;
}

/// Two or more "machines": network namespaces on a bridge, 10.203.0.i on eth1 in namespace i,
/// named after this process; remove() (and the destructor) kills what runs in them and
/// deletes them.
class Machines {
 public:
  explicit Machines(int n) : id_(std::to_string(::getpid())) {
    bridge_ = "epxub" + id_;
    if (!run_cmd("ip link add " + bridge_ + " type bridge", &error_)) return;
    made_bridge_ = true;
    run_cmd("ip link set " + bridge_ + " up");
    for (int i = 1; i <= n; ++i) {
      const std::string ns = "epx-u" + id_ + "-m" + std::to_string(i), v = "epxuv" + id_ + "x" + std::to_string(i),
                        t = "epxut" + id_ + "x" + std::to_string(i);
      if (!run_cmd("ip netns add " + ns, &error_)) return;
      names_.push_back(ns);
      const bool ok = run_cmd("ip link add " + v + " type veth peer name " + t, &error_) && (veths_.push_back(v), true) &&
                      run_cmd("ip link set " + t + " netns " + ns, &error_) && run_cmd("ip -n " + ns + " link set " + t + " name eth1", &error_) &&
                      run_cmd("ip link set " + v + " master " + bridge_ + " up", &error_) &&
                      run_cmd("ip -n " + ns + " addr add 10.203.0." + std::to_string(i) + "/24 dev eth1", &error_) &&
                      run_cmd("ip -n " + ns + " link set eth1 up", &error_) && run_cmd("ip -n " + ns + " link set lo up", &error_);
      if (!ok) return;
    }
    ready_ = true;
  }
  ~Machines() { remove(); }
  bool ready() const { return ready_; }
  const std::string& error() const { return error_; }
  const std::vector<std::string>& names() const { return names_; }
  /// Bytes machine i (0-based) sent out of its eth1: what its veth's host end received.
  std::uint64_t sent_bytes(int i) const {
    std::ifstream f("/sys/class/net/" + veths_[static_cast<std::size_t>(i)] + "/statistics/rx_bytes");
    std::uint64_t v = 0;
    f >> v;
    return v;
  }
  void remove() {
    for (const std::string& ns : names_) {
      std::string pids;
      run_cmd("ip netns pids " + ns, &pids);
      std::istringstream in(pids);
      for (int p; in >> p;) ::kill(p, SIGKILL);
    }
    for (const std::string& v : veths_) run_cmd("ip link del " + v);
    for (const std::string& ns : names_) run_cmd("ip netns del " + ns);
    if (made_bridge_) run_cmd("ip link del " + bridge_);
    names_.clear(), veths_.clear(), made_bridge_ = false;
  }

 private:
  std::string id_, bridge_, error_;
  std::vector<std::string> names_, veths_;
  bool made_bridge_ = false, ready_ = false;
};

}  // namespace epx::testing::ucx
