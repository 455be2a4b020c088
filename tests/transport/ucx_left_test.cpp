// A rank that leaves a call because a peer failed tells its peers, whose waits for it then
// fail at once naming the lost rank (src/transport/ucx/ucx_group.cpp, tell_left /
// check_left), instead of waiting a whole timeout for signals it will not send: a put to
// the other machines' ranks, a store into the mapped block of its own machine's.
// Two network-namespace machines (ucx_ranks.hpp), ranks 0-1 on machine 0, 2-3 on machine 1.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "ucx_ranks.hpp"

namespace epx::testing {
namespace {

long long ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Seen {
  int rank = -1, origin = -1;
  long long at_ms = 0;
  std::string code, message;
};

std::vector<Seen> read_seen(const std::string& path) {
  std::vector<Seen> v;
  std::ifstream f(path);
  for (Seen s; f >> s.rank >> s.origin >> s.at_ms >> s.code && std::getline(f, s.message);) v.push_back(s);
  return v;
}

}  // namespace

// Rank 3 dies; rank 0 waits for rank 3 and fails on its lost endpoint, then keeps its group
// alive for 6 s (no goodbye, which would end rank 2's wait anyway); rank 2 (the other
// machine) and rank 1 (rank 0's machine) wait for a signal from rank 0 that never comes.
// Both must fail long before rank 0's group ends and well before the 20 s timeout, with
// kPeerFailed naming rank 3 as the cause.
TEST(UcxLeft, AWaitForARankThatLeftOnAFailureFailsAtOnceNamingTheLostRank) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
  if (!ucx::run_cmd("ip -V")) GTEST_SKIP() << "no `ip` (apt-get install iproute2)";
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const std::string dir = std::filesystem::temp_directory_path() / ("epx-ucx-left-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string seen_path = dir + "/seen";
  const auto ok = ucx::run_ranks(4, m.names(), [&](Bootstrap& b) {
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
    auto t = connect(b, {.timeout = std::chrono::seconds(20)});
    t->allocate(4096, 8);
    t->barrier("ready");
    // Rank 3 dies only once every other rank has left the barrier: killed with bytes unread
    // in its sockets, its connections end with a reset, which can drop its own barrier
    // message before a peer read it (seen in CI: rank 0 failed in 'ready').
    if (b.rank() != 3) t->signal(3, static_cast<std::size_t>(4 + b.rank()), 1, 0);
    if (b.rank() == 3) {
      for (int p = 0; p < 3; ++p) t->wait_signal(static_cast<std::size_t>(4 + p), 1, WaitPoint{"past ready", p});
      ::raise(SIGKILL);
    }
    const int awaited = b.rank() == 0 ? 3 : 0;
    try {
      t->wait_signal(static_cast<std::size_t>(b.rank()), 1, WaitPoint{"left test", awaited});
    } catch (const Error& e) {
      std::ofstream(seen_path, std::ios::app) << b.rank() << ' ' << e.origin_rank() << ' ' << ms_now() << ' ' << to_string(e.code())
                                              << ' ' << e.what() << "\n";
      if (b.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(6));
      return;
    }
    std::_Exit(3);  // no signal was ever sent: the wait must not succeed
  });
  std::vector<Seen> seen = read_seen(seen_path);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(ok[0] && ok[1] && ok[2]);
  ASSERT_EQ(seen.size(), 3u);
  std::sort(seen.begin(), seen.end(), [](const Seen& a, const Seen& b) { return a.rank < b.rank; });
  ASSERT_EQ(seen[0].rank, 0);
  ASSERT_EQ(seen[1].rank, 1);
  ASSERT_EQ(seen[2].rank, 2);
  const Seen& r0 = seen[0];
  EXPECT_EQ(r0.code, "peer_failed") << r0.message;
  EXPECT_EQ(r0.origin, 3) << r0.message;
  for (const Seen* r : {&seen[1], &seen[2]}) {  // rank 1 on rank 0's machine, rank 2 on the other
    EXPECT_EQ(r->code, "peer_failed") << r->message;
    EXPECT_EQ(r->origin, 3) << r->message;
    EXPECT_NE(r->message.find("rank 3 (node 1 '" + m.names()[1] + "'"), std::string::npos) << r->message;
    EXPECT_NE(r->message.find("left the call"), std::string::npos) << r->message;
    EXPECT_LT(r->at_ms - r0.at_ms, 3000) << r->message;
  }
  EXPECT_NE(seen[1].message.find("rank 0 (node 0 '" + m.names()[0] + "', this machine)"), std::string::npos) << seen[1].message;
  m.remove();
}

}  // namespace epx::testing
