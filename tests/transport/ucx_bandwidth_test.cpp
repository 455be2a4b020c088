// Bulk bytes across two "machines" (network namespaces on a veth, tests/transport/ucx_ranks.hpp)
// through the ucx transport, against a plain TCP socket between the same two processes (what
// gloo uses): one rank on each machine, rounds interleaved, medians printed, every byte
// checked. A measure to reproduce the transport's numbers across machines (docs/transport.md,
// "Measured"), not a speed gate: the table is printed, only wrong bytes fail.
//
//   ./epx_transport_tests --gtest_filter='UcxAcrossMachines.*'        # root
//   EPX_UCX_BW_MIB=16 EPX_UCX_BW_PUT_KIB=1024 EPX_UCX_BW_ROUNDS=7 ... (the defaults)
//
// Cases per round (rank 0's clock; each ends when rank 0 holds the peer's answer):
//   one way:  N bytes rank 0 -> rank 1 (ucx: puts of PUT bytes, an ordered signal, a quiet;
//             tcp: one send of N), then an 8-byte answer;
//   both ways: N bytes each way at once (ucx: each rank puts and signals, waits for the
//             other's signal; tcp: a sending thread per rank while it receives);
//   ping-pong: 8 bytes there and back, 20 times (the time per round trip).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/bucket.hpp"
#include "epx/buffer_allocator.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "ucx_ranks.hpp"

namespace epx::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? static_cast<std::size_t>(std::strtoull(v, nullptr, 10)) : fallback;
}

[[noreturn]] void die(int rank, const std::string& what) { throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank) + ": " + what); }

std::uint8_t byte_of(int writer, std::uint64_t round, std::size_t i) {
  return static_cast<std::uint8_t>(writer * 71 + round * 13 + i * 7 + (i >> 12));
}

void fill(std::vector<std::uint8_t>& v, int writer, std::uint64_t round) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = byte_of(writer, round, i);
}

void expect_bytes(const std::uint8_t* got, std::size_t n, int writer, std::uint64_t round, int me, const char* what) {
  for (std::size_t i = 0; i < n; ++i)
    if (got[i] != byte_of(writer, round, i))
      die(me, std::string(what) + ": byte " + std::to_string(i) + " of round " + std::to_string(round) + " from rank " +
                  std::to_string(writer) + " is wrong");
}

// This machine's eth1 address (the namespace's only routed interface).
std::string eth1_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string out;
  for (ifaddrs* a = all; a != nullptr; a = a->ifa_next)
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET && std::string(a->ifa_name) == "eth1") {
      char buf[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      out = buf;
    }
  ::freeifaddrs(all);
  return out;
}

// A TCP connection between rank 0 and rank 1 as gloo makes one (TCP_NODELAY, the kernel's
// buffer sizes); its address goes through the bootstrap.
int tcp_pair(Bootstrap& b) {
  const int me = b.rank();
  int listener = -1;
  std::string mine;
  if (me == 1) {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      die(me, "cannot listen");
    mine = eth1_address() + ":" + std::to_string(ntohs(a.sin_port));
  }
  const std::vector<std::string> all = allgather_strings(b, mine);
  int fd = -1;
  if (me == 1) {
    fd = ::accept(listener, nullptr, nullptr);
    ::close(listener);
  } else {
    const std::string& where = all[1];
    const auto colon = where.find(':');
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(where.substr(colon + 1))));
    ::inet_pton(AF_INET, where.substr(0, colon).c_str(), &a.sin_addr);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::close(fd), fd = -1;
  }
  if (fd < 0) die(me, "no TCP connection to the other machine");
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void send_all(int fd, const void* p, std::size_t n, int me) {
  if (!ucx::write_all(fd, p, n)) die(me, "tcp send failed");
}
void recv_all(int fd, void* p, std::size_t n, int me) {
  if (!ucx::read_all(fd, p, n)) die(me, "tcp recv failed");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void bandwidth(Bootstrap& b) {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  const std::size_t N = env_size("EPX_UCX_BW_MIB", 16) << 20, piece = env_size("EPX_UCX_BW_PUT_KIB", 1024) << 10;
  const int rounds = static_cast<int>(env_size("EPX_UCX_BW_ROUNDS", 7));
  constexpr int kPings = 20;
  const int me = b.rank(), peer = 1 - me;
  auto t = connect(b, {.kind = ConnectKind::kUcx, .timeout = std::chrono::seconds(60)});
  // The window: N bytes from each writer (slot = writer), then the signals: 0 data arrived
  // (from the peer), 1 answer, 2 ping.
  t->allocate(2 * N, 3);
  const int fd = tcp_pair(b);
  std::vector<std::uint8_t> src(N), sink(N);
  std::vector<double> ucx_one, tcp_one, ucx_both, tcp_both, ucx_ping, tcp_ping;
  std::uint64_t sig = 0, ping = 0;
  const auto ms = [](Clock::time_point a) { return std::chrono::duration<double, std::milli>(Clock::now() - a).count(); };
  const auto ucx_send = [&](std::size_t at) {
    for (std::size_t o = 0; o < N; o += piece) t->put(peer, at + o, src.data() + o, std::min(piece, N - o), 0);
  };
  for (int round = 0; round < rounds; ++round) {
    const auto r = static_cast<std::uint64_t>(round);
    // ucx, one way
    fill(src, me, r);
    t->barrier("bw: one way");
    auto t0 = Clock::now();
    if (me == 0) {
      ucx_send(0);
      t->signal(1, 0, ++sig, 0);
      t->quiet(0);
      t->wait_signal(1, sig, WaitPoint{"bw: the answer", 1});
      ucx_one.push_back(ms(t0));
    } else {
      t->wait_signal(0, ++sig, WaitPoint{"bw: one way", 0});
      t->signal(0, 1, sig, 0);
      t->quiet(0);
      expect_bytes(reinterpret_cast<const std::uint8_t*>(t->window()), N, 0, r, me, "ucx one way");
    }
    // tcp, one way
    t->barrier("bw: tcp");
    t0 = Clock::now();
    std::uint64_t answer = r;
    if (me == 0) {
      send_all(fd, src.data(), N, me);
      recv_all(fd, &answer, sizeof answer, me);
      tcp_one.push_back(ms(t0));
    } else {
      recv_all(fd, sink.data(), N, me);
      send_all(fd, &answer, sizeof answer, me);
      expect_bytes(sink.data(), N, 0, r, me, "tcp one way");
    }
    // ucx, both ways: this rank's bytes into the peer's slot `me`
    t->barrier("bw: both ways");
    t0 = Clock::now();
    ucx_send(static_cast<std::size_t>(me) * N);
    t->signal(peer, 0, ++sig, 0);
    t->quiet(0);
    t->wait_signal(0, sig, WaitPoint{"bw: both ways", peer});
    ucx_both.push_back(ms(t0));
    expect_bytes(reinterpret_cast<const std::uint8_t*>(t->window()) + static_cast<std::size_t>(peer) * N, N, peer, r, me, "ucx both ways");
    // tcp, both ways
    t->barrier("bw: tcp both ways");
    t0 = Clock::now();
    std::thread sender([&] { send_all(fd, src.data(), N, me); });
    recv_all(fd, sink.data(), N, me);
    sender.join();
    tcp_both.push_back(ms(t0));
    expect_bytes(sink.data(), N, peer, r, me, "tcp both ways");
    // ping-pong, 8 bytes
    t->barrier("bw: ping");
    t0 = Clock::now();
    for (int i = 0; i < kPings; ++i) {
      if (me == 0) {
        t->signal(1, 2, ++ping, 0);
        t->wait_signal(2, ping, WaitPoint{"bw: pong", 1});
      } else {
        t->wait_signal(2, ++ping, WaitPoint{"bw: ping", 0});
        t->signal(0, 2, ping, 0);
      }
    }
    ucx_ping.push_back(ms(t0) * 1000 / kPings);
    t->barrier("bw: tcp ping");
    t0 = Clock::now();
    for (int i = 0; i < kPings; ++i) {
      std::uint64_t v = static_cast<std::uint64_t>(i);
      if (me == 0) {
        send_all(fd, &v, sizeof v, me);
        recv_all(fd, &v, sizeof v, me);
      } else {
        recv_all(fd, &v, sizeof v, me);
        send_all(fd, &v, sizeof v, me);
      }
    }
    tcp_ping.push_back(ms(t0) * 1000 / kPings);
  }
  t->quiet(0);
  t->barrier("bw: end");
  ::close(fd);
  if (me != 0) return;
  const double mb = static_cast<double>(N) / 1e6;
  std::printf("ucx across 2 machines (1 + 1 ranks), %zu MiB in puts of %zu KiB, median of %d interleaved rounds:\n", N >> 20,
              piece >> 10, rounds);
  std::printf("  one way    ucx %8.2f ms %7.0f MB/s   tcp %8.2f ms %7.0f MB/s   ucx/tcp speed %.2f\n", median(ucx_one),
              mb / median(ucx_one) * 1e3, median(tcp_one), mb / median(tcp_one) * 1e3, median(tcp_one) / median(ucx_one));
  std::printf("  both ways  ucx %8.2f ms %7.0f MB/s   tcp %8.2f ms %7.0f MB/s   ucx/tcp speed %.2f (MB/s: each way)\n",
              median(ucx_both), mb / median(ucx_both) * 1e3, median(tcp_both), mb / median(tcp_both) * 1e3,
              median(tcp_both) / median(ucx_both));
  std::printf("  ping-pong  ucx %8.1f us per round trip   tcp %8.1f us\n", median(ucx_ping), median(tcp_ping));
  std::fflush(stdout);
}

// BucketBuffer all_reduce of EPX_UCX_BW_MIB (16) MiB float32 on 2 x 2 ranks over the ucx
// transport, the flat algorithm (no topology: what epx.distributed's groups use) against the
// two-level one (topology builtin:servers:2, the two machines), rounds interleaved; every
// element checked (integer-valued inputs: any summation order gives the same bits). Rank 0
// prints the medians and the bytes each algorithm put across machines (its own puts).
void all_reduce_algorithms(Bootstrap& b) {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  const std::size_t n = (env_size("EPX_UCX_BW_MIB", 16) << 20) / 4;
  const int rounds = static_cast<int>(env_size("EPX_UCX_BW_ROUNDS", 7));
  const int me = b.rank(), P = b.size();
  auto t = connect(b, {.kind = ConnectKind::kUcx, .timeout = std::chrono::seconds(60)});
  BufferAllocator plan;
  plan.allocate("x", Shape{static_cast<std::int64_t>(n)}, DType::kF32);
  std::vector<std::vector<int>> world{{}};
  for (int r = 0; r < P; ++r) world[0].push_back(r);
  BucketBuffer flat(*t, world, plan, {});
  BucketBuffer two(*t, world, plan, {.topology = "builtin:servers:2"});
  std::vector<double> ms[2];
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      BucketBuffer& bb = k == 0 ? flat : two;
      MutableView x = bb.tensor("x");
      auto* f = static_cast<float*>(x.data);
      for (std::size_t i = 0; i < n; ++i) f[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(me * 131 + round * 17)) % 1000);
      t->barrier("allreduce: start");
      const auto t0 = Clock::now();
      bb.all_reduce({x});
      ms[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < P; ++r) want += static_cast<float>((i * 7 + static_cast<std::size_t>(r * 131 + round * 17)) % 1000);
        if (f[i] != want) die(me, std::string(k == 0 ? "flat" : "two-level") + " all_reduce: element " + std::to_string(i) + " is " + std::to_string(f[i]) + ", want " + std::to_string(want));
      }
    }
  }
  t->barrier("allreduce: end");
  if (me != 0) return;
  std::printf("BucketBuffer all_reduce %zu MiB float32, 2 x 2 ranks over ucx, median of %d interleaved rounds: flat %.2f ms, "
              "two-level (builtin:servers:2) %.2f ms, flat / two-level %.2f\n",
              (n * 4) >> 20, rounds, median(ms[0]), median(ms[1]), median(ms[0]) / median(ms[1]));
  std::fflush(stdout);
}

TEST(UcxAcrossMachines, AllReduceFlatAgainstTwoLevel) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
  if (!ucx::run_cmd("ip -V")) GTEST_SKIP() << "no `ip` (apt-get install iproute2)";
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const std::uint64_t sent0[2] = {m.sent_bytes(0), m.sent_bytes(1)};
  const std::vector<bool> ok = ucx::run_ranks(4, m.names(), all_reduce_algorithms);
  for (std::size_t r = 0; r < ok.size(); ++r) EXPECT_TRUE(ok[r]) << "rank " << r << " failed (its error is above)";
  std::printf("each machine's eth1 sent %llu / %llu MB in all\n", static_cast<unsigned long long>((m.sent_bytes(0) - sent0[0]) >> 20),
              static_cast<unsigned long long>((m.sent_bytes(1) - sent0[1]) >> 20));
  m.remove();
}

TEST(UcxAcrossMachines, BulkBytesAgainstPlainTcp) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
  if (!ucx::run_cmd("ip -V")) GTEST_SKIP() << "no `ip` (apt-get install iproute2)";
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const std::vector<bool> ok = ucx::run_ranks(2, m.names(), bandwidth);
  for (std::size_t r = 0; r < ok.size(); ++r) EXPECT_TRUE(ok[r]) << "rank " << r << " failed (its error is above)";
  m.remove();
}

}  // namespace
}  // namespace epx::testing
