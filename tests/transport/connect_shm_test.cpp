// epx::connect(kShm) for ranks that epx did not launch: the test forks P processes itself,
// each joins through a FunctionBootstrap whose all-gather goes through a hub in the parent
// (socketpairs), connects, and runs dispatch + combine against the reference. A peer
// killed mid-job makes every other rank fail naming it and the phase; ranks on "two nodes"
// are refused; nothing is left in /dev/shm.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>

#include "epx/bootstrap.hpp"
#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "../multirank/multirank_support.hpp"

namespace epx::testing {
namespace {

bool write_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w, n -= static_cast<std::size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, std::size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r, n -= static_cast<std::size_t>(r);
  }
  return true;
}

// The hub: gathers one message from every rank, sends the concatenation to all. If a rank
// closes its end while another has a round pending, the hub closes every socket.
void run_hub(std::vector<int> fds) {
  const std::size_t P = fds.size();
  std::vector<std::vector<char>> msg(P);
  std::vector<bool> open(P, true), have(P, false);
  for (;;) {
    std::vector<pollfd> pf;
    for (std::size_t r = 0; r < P; ++r)
      if (open[r] && !have[r]) pf.push_back({fds[r], POLLIN, 0});
    if (pf.empty()) break;
    if (::poll(pf.data(), pf.size(), 100) <= 0) continue;
    bool broken = false;
    for (const pollfd& p : pf) {
      if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const std::size_t r = static_cast<std::size_t>(std::find(fds.begin(), fds.end(), p.fd) - fds.begin());
      std::uint64_t len = 0;
      if (!read_all(p.fd, &len, sizeof len)) {
        open[r] = false;
        continue;
      }
      msg[r].resize(len);
      if (!read_all(p.fd, msg[r].data(), len)) open[r] = false;
      else have[r] = true;
    }
    bool all = true, any = false;
    for (std::size_t r = 0; r < P; ++r) all = all && have[r], any = any || have[r];
    for (std::size_t r = 0; r < P; ++r) broken = broken || (!open[r] && any);
    if (broken) break;
    if (!all) continue;
    std::vector<char> out;
    for (auto& m : msg) out.insert(out.end(), m.begin(), m.end());
    for (std::size_t r = 0; r < P; ++r) {
      write_all(fds[r], out.data(), out.size());
      have[r] = false;
    }
  }
  for (int fd : fds) ::close(fd);
}

FunctionBootstrap::AllgatherFn socket_allgather(int fd, int P) {
  return [fd, P](const void* in, void* out, std::size_t bytes) {
    const std::uint64_t len = bytes;
    if (!write_all(fd, &len, sizeof len) || !write_all(fd, in, bytes) ||
        !read_all(fd, out, bytes * static_cast<std::size_t>(P)))
      throw Error(ErrorCode::kPeerFailed, "test bootstrap: the hub closed (a peer left)");
  };
}

std::set<std::string> shm_entries() {
  std::set<std::string> s;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind("epx-", 0) == 0) s.insert(e.path().filename().string());
  return s;
}

// Forks P ranks; each runs body(bootstrap) and exits 0 if it returns, 1 (message on stderr)
// if it throws. Returns each rank's wait status.
std::vector<int> run_forked(int P, const std::function<void(Bootstrap&)>& body) {
  std::vector<int> hub_fds, pids;
  std::fflush(nullptr);
  for (int r = 0; r < P; ++r) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int fd : hub_fds) ::close(fd);
      ::close(sv[0]);
      int code = 0;
      try {
        FunctionBootstrap b(r, P, socket_allgather(sv[1], P), "test-socket");
        body(b);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    ::close(sv[1]);
    hub_fds.push_back(sv[0]);
    pids.push_back(pid);
  }
  run_hub(hub_fds);
  std::vector<int> status(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) ::waitpid(pids[static_cast<std::size_t>(r)], &status[static_cast<std::size_t>(r)], 0);
  return status;
}

void expect_no_new_segments(const std::set<std::string>& before) {
  std::set<std::string> leaked;
  for (int attempt = 0; attempt < 20; ++attempt) {  // another suite's live segments come and go
    leaked.clear();
    for (const auto& n : shm_entries())
      if (!before.count(n)) leaked.insert(n);
    if (leaked.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "left in /dev/shm: " << *leaked.begin();
}

void dispatch_combine_vs_reference(Transport& t, const ref::Problem& p, bool expanded) {
  const int r = t.rank();
  Buffer buffer(t, config_for(p));
  ref::DispatchOptions o;
  o.expanded = expanded;
  o.alignment = expanded ? 4 : 1;
  const auto outs = ref::dispatch_all(p, o);
  DispatchResult d = buffer.dispatch(dispatch_args(views_of(p, r), o));
  expect_dispatch(r, p, o, outs[static_cast<std::size_t>(r)], d);
  std::vector<std::vector<std::uint16_t>> y;
  for (int q = 0; q < p.num_ranks; ++q) y.push_back(ref::expert_fn(p, outs[static_cast<std::size_t>(q)], o));
  const auto& mine = y[static_cast<std::size_t>(r)];
  CombineArgs ca;
  ca.y = TensorView(mine.data(), DType::kBF16, {d.handle.num_recv_rows(), p.hidden});
  ca.handle = &d.handle;
  CombineResult c = buffer.combine(ca);
  expect_bits(r, "combined_x", c.combined_x.data(), ref::combine(p, o, outs, y, nullptr, nullptr, false, r));
}

TEST(ConnectShm, ForkedRanksDispatchAndCombineMatchTheReference) {
  const auto before = shm_entries();
  for (bool expanded : {false, true}) {
    ref::FixtureOptions fo;
    fo.num_ranks = 4;
    fo.num_experts = 16;
    fo.tokens_per_rank = {9, 0, 14, 5};
    fo.seed = expanded ? 41 : 42;
    const ref::Problem p = ref::make_problem(fo);
    const auto status = run_forked(4, [&](Bootstrap& b) {
      auto t = connect(b, {.kind = ConnectKind::kShm, .timeout = std::chrono::seconds(30)});
      if (std::string(t->caps().name) != "shm") throw std::runtime_error("connect gave a non-shm transport");
      dispatch_combine_vs_reference(*t, p, expanded);
    });
    for (int r = 0; r < 4; ++r)
      EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r << (expanded ? " expanded" : " compact");
  }
  expect_no_new_segments(before);
}

TEST(ConnectShm, AutoPicksShmOnOneNode) {
  const auto status = run_forked(2, [&](Bootstrap& b) {
    auto t = connect(b, {});
    if (std::string(t->caps().name) != "shm" || t->num_ranks() != 2 || t->rank() != b.rank())
      throw std::runtime_error("auto connect on one node is not a 2-rank shm transport");
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
}

// The bootstrap's setup helpers over real forked ranks: strings of different lengths (one
// empty, one longer than any fixed buffer) come back whole and in rank order; a failed
// step fails every rank with the lowest failing rank's error, named as that rank.
TEST(ConnectShm, BootstrapGathersStringsAndAgreesOnTheLowestFailure) {
  const auto status = run_forked(3, [&](Bootstrap& b) {
    auto check = [&](bool ok, const std::string& what) {
      if (!ok) throw std::runtime_error("rank " + std::to_string(b.rank()) + ": " + what);
    };
    auto text_of = [](int r) { return std::string(static_cast<std::size_t>(r) * 700, static_cast<char>('a' + r)); };
    const auto all = allgather_strings(b, text_of(b.rank()));
    check(all.size() == 3, "allgather_strings gave " + std::to_string(all.size()) + " strings, expected 3");
    for (int r = 0; r < 3; ++r) check(all[static_cast<std::size_t>(r)] == text_of(r), "rank " + std::to_string(r) + "'s string differs");
    agree_on_step(b, [] {});  // nobody fails: returns on every rank
    // Ranks 1 and 2 fail with different errors: every rank gets rank 1's.
    try {
      agree_on_step(b, [&] {
        if (b.rank() == 1) throw Error(ErrorCode::kIo, "rank 1: cannot open the thing");
        if (b.rank() == 2) throw Error(ErrorCode::kInvalidArgument, "rank 2: bad size", 0);
      });
      check(false, "a failed step returned");
    } catch (const Error& e) {
      check(e.code() == ErrorCode::kIo && e.origin_rank() == 1 && std::string(e.what()).find("rank 1: cannot open") != std::string::npos,
            std::string("got ") + e.what() + " from rank " + std::to_string(e.origin_rank()));
    }
    // A non-epx exception on rank 2 only: kInternal, origin rank 2, its text kept.
    try {
      agree_on_step(b, [&] {
        if (b.rank() == 2) throw std::runtime_error("out of luck");
      });
      check(false, "a failed step returned");
    } catch (const Error& e) {
      check(e.code() == ErrorCode::kInternal && e.origin_rank() == 2 && std::string(e.what()).find("out of luck") != std::string::npos,
            std::string("got ") + e.what());
    }
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
}

// Rank 2 dies (SIGKILL) after the buffer exists; ranks 0, 1, 3 are in dispatch and must
// fail well before the 30 s timeout with kPeerFailed naming rank 2 and the phase.
TEST(ConnectShm, KilledPeerFailsEveryOtherRankNamingIt) {
  const auto before = shm_entries();
  ref::FixtureOptions fo;
  fo.num_ranks = 4;
  fo.num_experts = 8;
  fo.seed = 43;
  const ref::Problem p = ref::make_problem(fo);
  const auto status = run_forked(4, [&](Bootstrap& b) {
    auto t = connect(b, {.kind = ConnectKind::kShm, .timeout = std::chrono::seconds(30)});
    Buffer buffer(*t, config_for(p));
    if (b.rank() == 2) ::raise(SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    try {
      buffer.dispatch(dispatch_args(views_of(p, b.rank()), {}));
    } catch (const Error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string m = e.what();
      if (e.code() != ErrorCode::kPeerFailed || e.origin_rank() != 2 || m.find("rank 2") == std::string::npos ||
          m.find("phase '") == std::string::npos || s > 10)
        throw std::runtime_error("wrong failure after " + std::to_string(s) + " s: " + m);
      return;
    }
    throw std::runtime_error("dispatch succeeded with rank 2 dead");
  });
  EXPECT_TRUE(WIFSIGNALED(status[2]) && WTERMSIG(status[2]) == SIGKILL);
  for (int r : {0, 1, 3}) EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
  expect_no_new_segments(before);
}

// A rank that fails to join (here: its all-gather reports ranks on two nodes) fails connect
// on every rank with the same error.
TEST(ConnectShm, RanksOnTwoNodesAreRefusedOnEveryRank) {
  const auto status = run_forked(3, [&](Bootstrap& real) {
    int calls = 0;
    FunctionBootstrap b(real.rank(), real.size(), [&](const void* in, void* out, std::size_t bytes) {
      real.allgather(in, out, bytes);
      if (calls++ == 0) static_cast<char*>(out)[2 * bytes] ^= 1;  // rank 2's node identity differs
    });
    try {
      connect(b, {.kind = ConnectKind::kShm});
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kInvalidArgument && std::string(e.what()).find("2 nodes") != std::string::npos) return;
      throw;
    }
    throw std::runtime_error("connect across two nodes succeeded");
  });
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r;
}

}  // namespace
}  // namespace epx::testing
