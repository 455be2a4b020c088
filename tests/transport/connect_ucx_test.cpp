// epx::connect(kUcx): the UCX transport for ranks that epx did not launch. The test forks the
// ranks itself (tests/transport/ucx_ranks.hpp), each joins through a FunctionBootstrap over
// sockets to the test process, connects and checks:
//   * one machine, 4 ranks: the transport's contract (puts from two threads then ordered
//     signals, flagged puts, gets, barriers, reused slots, an endpoint of its own, a timeout
//     naming the peer, its node and the phase); dispatch + combine bit for bit against
//     tests/reference (three protocols, both layouts); BucketBuffer all_reduce bit for bit;
//   * auto across "nodes" picks ucx (rank 1's node identity changed in the bootstrap);
//   * two "machines" (network namespaces, tests/multinode's layout; needs root and `ip`):
//     2 x 2 ranks, auto picks ucx, the same bit-exact checks, and the bytes crossed the veth;
//     the link cut mid-call: every rank raises within the timeout naming a peer, its machine
//     and the phase; a rank that closes while a peer on the other machine still signals it
//     (the peer's calls complete) and one killed instead (they fail naming it).
// Nothing is left in /dev/shm or among the System V segments; namespaces are removed.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "epx/bootstrap.hpp"
#include "epx/bucket.hpp"
#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "../multirank/bucket_cases.hpp"
#include "../multirank/multirank_support.hpp"
#include "../multirank/round_trip_cases.hpp"
#include "ucx_ranks.hpp"

namespace epx::testing {
namespace {

using ucx::run_ranks;

std::set<std::string> dev_shm() {
  std::set<std::string> s;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) s.insert(e.path().filename().string());
  return s;
}

// System V shared memory segments (UCX's sysv transport allocates windows there).
std::string sysv_segments() {
  std::ifstream f("/proc/sysvipc/shm");
  std::string line, all;
  std::getline(f, line);  // header
  while (std::getline(f, line)) all += line + "\n";
  return all;
}

// What the ucx transport could leave: UCX's POSIX segments (/dev/shm/ucx*) and System V
// segments nobody is attached to any more (UCX's are removed at once and go with their last
// user). Other names and attached segments belong to whatever else runs on the machine.
class NothingLeft {
 public:
  NothingLeft() : shm_(dev_shm()), sysv_(orphan_segments()) {}
  void check() const {
    for (int attempt = 0;; ++attempt) {
      std::set<std::string> left;
      for (const auto& n : dev_shm())
        if (!shm_.count(n) && n.rfind("ucx", 0) == 0) left.insert("/dev/shm/" + n);
      for (const auto& id : orphan_segments())
        if (!sysv_.count(id)) left.insert("System V segment " + id);
      if (left.empty()) return;
      if (attempt >= 20) {
        ADD_FAILURE() << "left behind: " << *left.begin();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  // The ids of System V segments with no process attached (/proc/sysvipc/shm: key shmid perms
  // size cpid lpid nattch ...).
  static std::set<std::string> orphan_segments() {
    std::set<std::string> ids;
    std::istringstream all(sysv_segments());
    for (std::string line; std::getline(all, line);) {
      std::istringstream f(line);
      std::string key, shmid, perms, size, cpid, lpid, nattch;
      if (f >> key >> shmid >> perms >> size >> cpid >> lpid >> nattch && nattch == "0") ids.insert(shmid);
    }
    return ids;
  }
  std::set<std::string> shm_;
  std::set<std::string> sysv_;
};

void expect_all(const std::vector<bool>& ok, const char* what) {
  for (std::size_t r = 0; r < ok.size(); ++r) EXPECT_TRUE(ok[r]) << what << ": rank " << r << " failed (its error is above)";
}

void check(bool ok, int rank, const std::string& what) {
  if (!ok) fail(rank, what);
}

std::unique_ptr<Transport> connect_ucx(Bootstrap& b, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto t = connect(b, {.kind = ConnectKind::kUcx, .timeout = timeout});
  check(std::string(t->caps().name) == "ucx", b.rank(), std::string("connect(ucx) gave '") + t->caps().name + "'");
  return t;
}

std::uint8_t pattern(int writer, int queue, std::size_t i) { return static_cast<std::uint8_t>(writer * 37 + queue * 101 + i * 7 + (i >> 9)); }

constexpr std::size_t kChunk = std::size_t{256} << 10;  // per writer: two halves, one per queue
constexpr std::size_t kPiece = std::size_t{16} << 10;   // puts of this size (many per signal)

// Two threads (queues 0 and 1) put their halves of this rank's chunk into every rank's
// window piece by piece, then signal; every rank checks every writer's bytes after the signal.
void puts_then_signals(Transport& t, std::uint64_t epoch) {
  const int P = t.num_ranks(), r = t.rank();
  std::vector<std::uint8_t> src[2];
  for (int q = 0; q < 2; ++q) {
    src[q].resize(kChunk / 2);
    for (std::size_t i = 0; i < src[q].size(); ++i) src[q][i] = static_cast<std::uint8_t>(pattern(r, q, i) + epoch);
  }
  std::vector<std::thread> threads;
  for (int q = 0; q < 2; ++q)
    threads.emplace_back([&, q] {
      for (int p = 0; p < P; ++p) {
        const std::size_t at = static_cast<std::size_t>(r) * kChunk + static_cast<std::size_t>(q) * kChunk / 2;
        for (std::size_t off = 0; off < kChunk / 2; off += kPiece) t.put(p, at + off, src[q].data() + off, kPiece, q);
        t.signal(p, static_cast<std::size_t>(2 * r + q), epoch, q);
      }
      t.quiet(q);
    });
  for (auto& th : threads) th.join();
  for (int s = 0; s < P; ++s)
    for (int q = 0; q < 2; ++q) {
      t.wait_signal(static_cast<std::size_t>(2 * s + q), epoch, {"conformance puts", s});
      const std::byte* w = t.window() + static_cast<std::size_t>(s) * kChunk + static_cast<std::size_t>(q) * kChunk / 2;
      for (std::size_t i = 0; i < kChunk / 2; ++i)
        if (static_cast<std::uint8_t>(w[i]) != static_cast<std::uint8_t>(pattern(s, q, i) + epoch))
          fail(r, "byte " + std::to_string(i) + " from rank " + std::to_string(s) + " queue " + std::to_string(q) +
                      " differs after its signal (epoch " + std::to_string(epoch) + ")");
    }
}

// Data-as-flag blocks: 200 bytes then the flag, to every rank; each checks every writer's.
void flagged_blocks(Transport& t, std::size_t area, std::uint64_t flag) {
  const int P = t.num_ranks(), r = t.rank();
  constexpr std::size_t kBytes = 200;
  std::vector<std::uint8_t> block(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) block[i] = static_cast<std::uint8_t>(pattern(r, 5, i) ^ flag);
  for (int p = 0; p < P; ++p) t.put_flagged(p, area + static_cast<std::size_t>(r) * 256, block.data(), kBytes, flag, 0);
  for (int s = 0; s < P; ++s) {
    t.wait_flag(area + static_cast<std::size_t>(s) * 256 + kBytes, flag, {"conformance flag", s});
    for (std::size_t i = 0; i < kBytes; ++i)
      check(static_cast<std::uint8_t>(t.window()[area + static_cast<std::size_t>(s) * 256 + i]) == static_cast<std::uint8_t>(pattern(s, 5, i) ^ flag), r,
            "flagged block from rank " + std::to_string(s) + " differs at byte " + std::to_string(i));
  }
  t.quiet(0);
}

// One-sided reads: this rank's chunk as the next rank holds it (written by this rank).
void gets(Transport& t, std::uint64_t epoch) {
  const int P = t.num_ranks(), r = t.rank();
  std::vector<std::uint8_t> got(kChunk);
  t.get((r + 1) % P, static_cast<std::size_t>(r) * kChunk, got.data(), kChunk, 1);
  t.quiet(1);
  for (std::size_t i = 0; i < kChunk; ++i) {
    const int q = i < kChunk / 2 ? 0 : 1;
    check(got[i] == static_cast<std::uint8_t>(pattern(r, q, i % (kChunk / 2)) + epoch), r, "get from rank " + std::to_string((r + 1) % P) + " differs at byte " + std::to_string(i));
  }
}

// An endpoint's window is its own: writes into it leave the transport's window alone.
void endpoint_is_independent(Transport& t) {
  const int P = t.num_ranks(), r = t.rank();
  auto e = t.open_endpoint();
  check(e != nullptr && std::string(e->caps().name) == "ucx" && e->num_ranks() == P, r, "open_endpoint gave no ucx endpoint");
  e->allocate(4096, static_cast<std::size_t>(P));
  const std::uint64_t mine = 0xabc000 + static_cast<std::uint64_t>(r);
  for (int p = 0; p < P; ++p) e->put(p, static_cast<std::size_t>(r) * 8, &mine, 8, 0), e->signal(p, static_cast<std::size_t>(r), 1, 0);
  for (int s = 0; s < P; ++s) {
    e->wait_signal(static_cast<std::size_t>(s), 1, {"endpoint", s});
    std::uint64_t v = 0;
    std::memcpy(&v, e->window() + static_cast<std::size_t>(s) * 8, 8);
    check(v == 0xabc000 + static_cast<std::uint64_t>(s), r, "endpoint word from rank " + std::to_string(s) + " differs");
    check(static_cast<std::uint8_t>(t.window()[static_cast<std::size_t>(s) * kChunk]) == static_cast<std::uint8_t>(pattern(s, 0, 0) + 2), r,
          "the transport's window changed under an endpoint's puts");
  }
  e->barrier("endpoint done");
}

void transport_contract(Bootstrap& b) {
  auto t = connect_ucx(b, std::chrono::seconds(3));
  const int P = t->num_ranks(), r = t->rank();
  const TransportCaps& c = t->caps();
  check(P == b.size() && r == b.rank() && !c.peer_memory_mapped && c.ordered_signal_per_queue && c.flagged_puts && c.one_sided_get &&
            !c.put_completes_on_return && c.max_queues >= 2,
        r, "caps or rank/size of the ucx transport are not what it implements");
  const std::size_t flag_area = static_cast<std::size_t>(P) * kChunk;
  t->allocate(flag_area + static_cast<std::size_t>(P) * 256, static_cast<std::size_t>(2 * P + 1));
  puts_then_signals(*t, 1);
  flagged_blocks(*t, flag_area, 1);
  t->barrier("before gets");
  gets(*t, 1);
  t->barrier("round two");
  puts_then_signals(*t, 2);  // the same slots, the next epoch
  flagged_blocks(*t, flag_area, 2);
  t->barrier("before the endpoint");
  endpoint_is_independent(*t);
  // A signal that never comes: kTimeout after the transport's 3 s, naming peer, node, phase.
  const int peer = (r + 1) % P;
  const auto start = std::chrono::steady_clock::now();
  try {
    t->wait_signal(static_cast<std::size_t>(2 * P), 1, {"never signalled", peer});
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string m = e.what();
    check(e.code() == ErrorCode::kTimeout && e.origin_rank() == peer && s >= 2.9 && s < 8 &&
              m.find("rank " + std::to_string(peer) + " (node 0 '") != std::string::npos && m.find("phase 'never signalled'") != std::string::npos,
          r, "wrong timeout after " + std::to_string(s) + " s: " + m);
    b.barrier();  // no rank ends while another still waits for it (that would be a death, not a timeout)
    return;
  }
  fail(r, "a wait for a signal nobody sent returned");
}

// The one-machine tests run twice: same-machine peers mapped (ucp_rkey_ptr: copies), the
// default, and through UCX's own transports (EPX_UCX_MAP_PEERS=0: ucp_put_nbx over sysv/posix).
ucx::Body unmapped(ucx::Body body) {
  return [body](Bootstrap& b) {
    ::setenv("EPX_UCX_MAP_PEERS", "0", 1);
    body(b);
  };
}

TEST(ConnectUcx, TransportKeepsItsContract) {
  NothingLeft nothing_left;
  expect_all(run_ranks(4, {}, transport_contract), "contract");
  expect_all(run_ranks(4, {}, unmapped(transport_contract)), "contract, peers not mapped");
  nothing_left.check();
}

struct Flavour {
  Protocol protocol;
  int queues;
};

void dispatch_combine(Transport& t, const ref::Problem& p, bool expanded, Flavour f) {
  const int r = t.rank();
  BufferConfig config = config_for(p);
  config.dataplane.protocol = f.protocol;
  config.dataplane.queues = f.queues;
  Buffer buffer(t, config);
  ref::DispatchOptions o;
  o.expanded = expanded;
  o.alignment = expanded ? 4 : 1;
  const auto outs = ref::dispatch_all(p, o);
  DispatchResult d = buffer.dispatch(dispatch_args(views_of(p, r), o));
  expect_dispatch(r, p, o, outs[static_cast<std::size_t>(r)], d);
  std::vector<std::vector<std::uint16_t>> y;
  for (int q = 0; q < p.num_ranks; ++q) y.push_back(ref::expert_fn(p, outs[static_cast<std::size_t>(q)], o));
  CombineArgs ca;
  ca.y = TensorView(y[static_cast<std::size_t>(r)].data(), DType::kBF16, {d.handle.num_recv_rows(), p.hidden});
  ca.handle = &d.handle;
  expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), ref::combine(p, o, outs, y, nullptr, nullptr, false, r));
  DispatchArgs cached = dispatch_args(views_of(p, r), o);  // the cached path too
  cached.handle = &d.handle;
  expect_dispatch(r, p, o, outs[static_cast<std::size_t>(r)], buffer.dispatch(cached));
}

ref::Problem problem(int P, int hidden, std::vector<std::int64_t> tokens, std::uint64_t seed) {
  ref::FixtureOptions fo;
  fo.num_ranks = P;
  fo.num_experts = 4 * P;
  fo.hidden = hidden;
  fo.tokens_per_rank = std::move(tokens);
  fo.seed = seed;
  return ref::make_problem(fo);
}

void every_flavour(Transport& t, int hidden, std::vector<std::int64_t> tokens) {
  int seed = 60;
  for (Flavour f : {Flavour{Protocol::kExplicit, 1}, Flavour{Protocol::kTail, 2}, Flavour{Protocol::kFlag, 2}})
    for (bool expanded : {false, true}) dispatch_combine(t, problem(t.num_ranks(), hidden, tokens, static_cast<std::uint64_t>(seed++)), expanded, f);
}

// BucketBuffer all_reduce on the world and its sub-groups, bit for bit (bucket_cases.hpp).
void bucket_all_reduce(Transport& t, const std::string& topology) {
  const auto groups = bucket::groups_of(t.num_ranks());
  BucketBuffer b(t, groups, std::size_t{4} << 20, {.topology = topology});
  int n = 0;
  for (const bucket::Case& c0 : bucket::cases_of(static_cast<int>(groups.size()), 11, false)) {
    if (c0.op != bucket::Op::kAllReduce) continue;
    bucket::run_case(b, bucket::fit(c0, static_cast<int>(groups[static_cast<std::size_t>(c0.group)].size())));
    ++n;
  }
  check(n >= 5, t.rank(), "only " + std::to_string(n) + " all_reduce cases ran");
  t.barrier("bucket done");
}

TEST(ConnectUcx, DispatchCombineAndAllReduceMatchTheReference) {
  NothingLeft nothing_left;
  const ucx::Body body = [](Bootstrap& b) {
    auto t = connect_ucx(b);
    every_flavour(*t, 256, {9, 0, 14, 5});
    bucket_all_reduce(*t, "");
  };
  expect_all(run_ranks(4, {}, body), "dispatch/combine/all_reduce");
  expect_all(run_ranks(4, {}, unmapped(body)), "dispatch/combine/all_reduce, peers not mapped");
  nothing_left.check();
}

// The data-plane conformance (tests/multirank/dataplane_conformance_test.cpp) over ucx: every
// schedule x protocol the support table accepts on ucx's caps, queues and aggregation
// varied, each a round trip (fresh dispatch, cached dispatch, combine of wide-range y, a
// second fresh dispatch and its combine) of the shared small cases, compact, expanded
// weighted and FP8, bit for bit. One job runs them all, a buffer (an endpoint) per option set.
struct PlaneCase {
  const char* schedule;
  const char* protocol;
  int queues;
  std::size_t aggregate;
  bool node_first = false;
};

std::vector<PlaneCase> plane_cases(const TransportCaps& caps) {
  std::vector<PlaneCase> v;
  const std::size_t aggregates[] = {0, 1000, std::size_t{1} << 20};
  int i = 0;
  for (const char* schedule : {"flat", "rotated", "grouped:2", "hierarchical"})
    for (const char* protocol : {"explicit", "tail", "flag"})
      for (int queues : {1, 4}) {
        PlaneCase c{schedule, protocol, queues, aggregates[i++ % 3], std::string(schedule) == "hierarchical" && queues == 4};
        BufferConfig config;
        config.dataplane.schedule = parse_schedule(c.schedule);
        config.dataplane.protocol = parse_protocol(c.protocol);
        config.dataplane.queues = c.queues;
        if (c.node_first) config.dataplane.combine_order = CombineOrder::kNodeFirst;
        if (spi::refuse_config(config, caps).empty()) v.push_back(c);
      }
  return v;
}

void round_trip(Buffer& buffer, int r, const Expected& e) {
  const auto ur = static_cast<std::size_t>(r);
  const RankViews v = views_of(e.p, r);
  DispatchResult d = buffer.dispatch(dispatch_args(v, e.d));
  expect_dispatch(r, e.p, e.d, e.out[ur], d);
  DispatchArgs cached = dispatch_args(v, e.d);
  cached.handle = &d.handle;
  expect_dispatch(r, e.p, e.d, e.out[ur], buffer.dispatch(cached));
  CombineArgs ca;
  ca.y = TensorView(e.y[ur].data(), DType::kBF16, {e.out[ur].rows, e.p.hidden});
  ca.handle = &d.handle;
  ca.weighted = e.weighted;
  expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), e.combined[ur]);
  DispatchResult again = buffer.dispatch(dispatch_args(v, e.d));
  expect_dispatch(r, e.p, e.d, e.out[ur], again);
  ca.handle = &again.handle;
  expect_bits(r, "combined_x (second fresh dispatch)", buffer.combine(ca).combined_x.data(), e.combined[ur]);
}

void plane_conformance(Transport& t) {
  static const std::vector<int> two_servers = {0, 0, 1, 1};
  int n = 0;
  for (const PlaneCase& c : plane_cases(t.caps())) {
    const std::vector<int>* nodes = c.node_first ? &two_servers : nullptr;
    const Expected cases[] = {expect(fixture(false, 50), false, false, nodes), expect(fixture(false, 51), true, true, nodes),
                              expect(fixture(true, 52), false, false, nodes)};
    BufferConfig config = config_for(cases[0].p, 2);
    config.max_tokens_per_rank = 16;
    config.dataplane.schedule = parse_schedule(c.schedule);
    if (config.dataplane.schedule.kind == ScheduleKind::kHierarchical) config.dataplane.topology = "builtin:servers:2";
    config.dataplane.protocol = parse_protocol(c.protocol);
    config.dataplane.queues = c.queues;
    config.dataplane.aggregate_bytes = c.aggregate;
    if (c.node_first) config.dataplane.combine_order = CombineOrder::kNodeFirst;
    Buffer buffer(t, config);
    for (const Expected& e : cases) {
      try {
        round_trip(buffer, t.rank(), e);
      } catch (const std::exception& ex) {
        fail(t.rank(), std::string(c.schedule) + " " + c.protocol + " q" + std::to_string(c.queues) + ": " + ex.what());
      }
    }
    ++n;
  }
  check(n >= 20, t.rank(), "only " + std::to_string(n) + " data-plane option sets ran");
  if (t.rank() == 0) std::printf("%d data-plane option sets x 3 cases matched the reference\n", n);
}

TEST(ConnectUcx, DataPlaneConformance) {
  NothingLeft nothing_left;
  const ucx::Body body = [](Bootstrap& b) { plane_conformance(*connect_ucx(b)); };
  expect_all(run_ranks(kCaseRanks, {}, body), "conformance");
  expect_all(run_ranks(kCaseRanks, {}, unmapped(body)), "conformance, peers not mapped");
  nothing_left.check();
}

// Rank 2 dies (SIGKILL) once the buffer exists; ranks 0, 1, 3 are in dispatch and must fail
// with kPeerFailed naming rank 2 and the phase before the timeout (3 s): the same-machine
// liveness check, not the timeout, finds it.
TEST(ConnectUcx, KilledPeerFailsEveryOtherRankNamingIt) {
  NothingLeft nothing_left;
  const ref::Problem p = problem(4, 256, {9, 3, 14, 5}, 77);
  const auto ok = run_ranks(4, {}, [&](Bootstrap& b) {
    auto t = connect_ucx(b, std::chrono::seconds(3));
    Buffer buffer(*t, config_for(p));
    if (b.rank() == 2) ::raise(SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    try {
      buffer.dispatch(dispatch_args(views_of(p, b.rank()), {}));
    } catch (const Error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string m = e.what();
      check(e.code() == ErrorCode::kPeerFailed && e.origin_rank() == 2 && m.find("rank 2 (node 0 '") != std::string::npos &&
                m.find("died") != std::string::npos && m.find("phase '") != std::string::npos && s < 2.5,
            b.rank(), "wrong failure after " + std::to_string(s) + " s: " + m);
      return;
    }
    fail(b.rank(), "dispatch succeeded with rank 2 dead");
  });
  for (int r : {0, 1, 3}) EXPECT_TRUE(ok[static_cast<std::size_t>(r)]) << "rank " << r;
  EXPECT_FALSE(ok[2]);
  nothing_left.check();
}

// A rank whose UCX cannot start (here: UCX_TLS names no transport) fails connect on every
// rank with its message, instead of leaving the others in the bootstrap.
TEST(ConnectUcx, ARankWhoseUcxCannotStartFailsEveryRank) {
  expect_all(run_ranks(3, {}, [](Bootstrap& b) {
               if (b.rank() == 1) ::setenv("UCX_TLS", "no-such-transport", 1);
               try {
                 connect(b, {.kind = ConnectKind::kUcx, .timeout = std::chrono::seconds(10)});
               } catch (const Error& e) {
                 const std::string m = e.what();
                 check(e.code() == ErrorCode::kUnsupported && e.origin_rank() == 1 && m.find("rank 1: ucx: ucp_init failed") != std::string::npos,
                       b.rank(), "wrong failure: " + m);
                 return;
               }
               fail(b.rank(), "connect succeeded with rank 1's UCX unable to start");
             }),
             "a rank without UCX");
}

TEST(ConnectUcx, AutoPicksTheTransportByNodesAndLauncher) {
  EXPECT_EQ(auto_connect_kind(1, false, true), ConnectKind::kShm);
  EXPECT_EQ(auto_connect_kind(1, true, true), ConnectKind::kShm);
  EXPECT_EQ(auto_connect_kind(2, true, true), ConnectKind::kShmem);
  EXPECT_EQ(auto_connect_kind(2, false, true), ConnectKind::kUcx);
  EXPECT_EQ(auto_connect_kind(3, true, false), ConnectKind::kUcx);
  EXPECT_EQ(parse_connect_kind("ucx"), ConnectKind::kUcx);
  EXPECT_STREQ(to_string(ConnectKind::kUcx), "ucx");
  EXPECT_TRUE(ucx_available());
  // Rank 1 seen on another node (its node identity changed in the first all-gather): ucx.
  expect_all(run_ranks(2, {}, [](Bootstrap& real) {
               ::unsetenv("OMPI_COMM_WORLD_SIZE");
               int calls = 0;
               FunctionBootstrap b(real.rank(), real.size(), [&](const void* in, void* out, std::size_t bytes) {
                 real.allgather(in, out, bytes);
                 if (calls++ == 0) static_cast<char*>(out)[bytes] ^= 1;
               });
               auto t = connect(b, {.timeout = std::chrono::seconds(20)});
               check(std::string(t->caps().name) == "ucx", b.rank(), std::string("auto across two nodes gave '") + t->caps().name + "'");
               t->allocate(64, 1);
               t->barrier("auto");
             }),
             "auto");
}

// ---- two "machines" ----

bool can_make_machines(std::string& why) {
  if (::geteuid() != 0) return why = "needs root to make network namespaces", false;
  if (!ucx::run_cmd("ip -V")) return why = "no `ip` (apt-get install iproute2)", false;
  return true;
}

// Rows a dispatch sends from machine `from` to the other machine (compact: one per token and
// destination rank), for the veth's lower bound.
std::uint64_t rows_across(const ref::Problem& p, int from, int per_machine) {
  std::uint64_t rows = 0;
  const int per_rank = p.num_experts / p.num_ranks;
  for (int s = from * per_machine; s < (from + 1) * per_machine; ++s) {
    const ref::RankInput& in = p.ranks[static_cast<std::size_t>(s)];
    for (std::int64_t tkn = 0; tkn < in.num_tokens; ++tkn) {
      std::set<int> dests;
      for (int k = 0; k < p.num_topk; ++k) {
        const std::int64_t e = in.topk_idx[static_cast<std::size_t>(tkn * p.num_topk + k)];
        if (e >= 0 && static_cast<int>(e / per_rank) / per_machine != from) dests.insert(static_cast<int>(e / per_rank));
      }
      rows += dests.size();
    }
  }
  return rows;
}

// quiet_timed across machines charges the peers it waited for: puts to the other machine's
// ranks are complete only when they acknowledge them; this machine's ranks are charged
// nothing. The wait must be real for the laps to show it: on a fast, idle box every
// acknowledgement can arrive before quiet_timed looks (seen in CI: laps of 0). So the first
// rank of each machine shapes its eth1 to 16 Mbit/s (tbf) for this step: each machine sends
// 2 x 2 x 128 KiB = 512 KiB across, ~0.26 s on the wire, and the last acknowledgement comes
// after the puts return by far more than one scheduling slice.
void laps_name_remote_peers(Transport& t) {
  const int P = t.num_ranks(), r = t.rank();
  auto e = t.open_endpoint();
  constexpr std::size_t kBytes = std::size_t{128} << 10;
  e->allocate(kBytes * static_cast<std::size_t>(P), 1);
  const bool shaper = r % 2 == 0;
  std::string out;
  if (shaper)
    check(ucx::run_cmd("tc qdisc add dev eth1 root tbf rate 16mbit burst 16kb latency 2s", &out), r,
          "could not slow eth1 for the laps (tc tbf): " + out);
  e->barrier("laps: link shaped");
  std::vector<std::uint8_t> src(kBytes, static_cast<std::uint8_t>(r + 1));
  std::vector<std::uint64_t> laps(static_cast<std::size_t>(P), 0);
  for (int p = 0; p < P; ++p)
    if (p / 2 != r / 2) e->put(p, static_cast<std::size_t>(r) * kBytes, src.data(), kBytes, 0);
  e->quiet_timed(0, laps.data());
  std::uint64_t remote = 0;
  for (int p = 0; p < P; ++p) {
    if (p / 2 != r / 2) remote += laps[static_cast<std::size_t>(p)];
    else check(laps[static_cast<std::size_t>(p)] == 0, r, "quiet_timed charged rank " + std::to_string(p) + " of this machine");
  }
  check(remote > 0, r, "quiet_timed charged nothing to the other machine's ranks");
  e->barrier("laps");
  for (int p = 0; p < P; ++p) {
    const auto* got = reinterpret_cast<const std::uint8_t*>(e->window()) + static_cast<std::size_t>(p) * kBytes;
    if (p / 2 != r / 2)
      check(std::all_of(got, got + kBytes, [&](std::uint8_t v) { return v == p + 1; }), r, "rank " + std::to_string(p) + "'s laps put arrived wrong");
  }
  if (shaper) check(ucx::run_cmd("tc qdisc del dev eth1 root", &out), r, "could not remove the laps' shaper: " + out);
  e->barrier("laps: link restored");
}

TEST(ConnectUcx, TwoMachinesAutoPicksUcxAndBytesCrossTheVeth) {
  std::string why;
  if (!can_make_machines(why)) GTEST_SKIP() << why;
  NothingLeft nothing_left;
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  constexpr int kHidden = 2048;
  const std::vector<std::int64_t> tokens = {40, 24, 33, 40};
  const ref::Problem big = problem(4, kHidden, tokens, 90);
  const std::uint64_t sent0[2] = {m.sent_bytes(0), m.sent_bytes(1)};
  const std::vector<std::string> hosts = m.names();
  expect_all(run_ranks(4, m.names(), [&](Bootstrap& b) {
               ::unsetenv("OMPI_COMM_WORLD_SIZE");
               auto t = connect(b, {.timeout = std::chrono::seconds(30)});
               check(std::string(t->caps().name) == "ucx", b.rank(), std::string("auto across two machines gave '") + t->caps().name + "'");
               char host[64] = {};
               ::gethostname(host, sizeof host - 1);
               check(host == hosts[static_cast<std::size_t>(b.rank() / 2)], b.rank(), std::string("runs on host ") + host);
               dispatch_combine(*t, big, false, {Protocol::kExplicit, 1});
               every_flavour(*t, 256, {9, 0, 14, 5});
               bucket_all_reduce(*t, "builtin:servers:2");
               plane_conformance(*t);  // hierarchical: servers:2 are the two machines
               laps_name_remote_peers(*t);
             }),
             "two machines");
  for (int i = 0; i < 2; ++i) {
    const std::uint64_t sent = m.sent_bytes(i) - sent0[i];
    const std::uint64_t want = rows_across(big, i, 2) * kHidden * 2;
    EXPECT_GT(want, std::uint64_t{256} << 10) << "the problem moves too little to tell";
    EXPECT_GE(sent, want) << "machine " << i << "'s eth1 sent " << sent << " bytes, less than the rows the dispatch sent across";
    std::printf("machine %d: eth1 sent %llu bytes; the big dispatch's rows to the other machine alone are %llu bytes\n", i,
                static_cast<unsigned long long>(sent), static_cast<unsigned long long>(want));
  }
  m.remove();
  nothing_left.check();
}

// What a rank of the cut-link test saw: when its call failed (ms since the epoch), the error.
struct Outcome {
  int rank = -1;
  long long at_ms = 0;
  std::string code, message;
};

long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<Outcome> read_outcomes(const std::string& path) {
  std::vector<Outcome> v;
  std::ifstream f(path);
  for (Outcome o; f >> o.rank >> o.at_ms >> o.code && std::getline(f, o.message);) v.push_back(o);
  return v;
}

// Each rank calls dispatch + combine in a loop until one fails; rank 0 creates `go` once the
// loop has run a few times, and the test then takes machine 2's eth1 down. Every rank writes
// its error to `outcomes` (one line; O_APPEND) and returns.
void loop_until_cut(Bootstrap& b, const std::string& go, const std::string& outcomes, std::chrono::milliseconds timeout) {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  auto t = connect(b, {.timeout = timeout});
  const ref::Problem p = problem(4, 256, {12, 7, 12, 9}, 95);
  Buffer buffer(*t, config_for(p));
  const auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  try {
    for (int i = 0; std::chrono::steady_clock::now() < stop; ++i) {
      DispatchResult d = buffer.dispatch(dispatch_args(views_of(p, b.rank()), {}));
      std::vector<std::uint16_t> y(static_cast<std::size_t>(d.handle.num_recv_rows() * p.hidden), 0x3f80);
      CombineArgs ca;
      ca.y = TensorView(y.data(), DType::kBF16, {d.handle.num_recv_rows(), p.hidden});
      ca.handle = &d.handle;
      buffer.combine(ca);
      if (i == 5 && b.rank() == 0) std::ofstream(go) << "looping\n";
    }
  } catch (const Error& e) {
    std::string m = e.what();
    std::replace(m.begin(), m.end(), '\n', ' ');
    std::ofstream(outcomes, std::ios::app) << b.rank() << ' ' << now_ms() << ' ' << to_string(e.code()) << ' ' << m << "\n";
    return;
  }
  fail(b.rank(), "the loop ran 60 s without an error: the link was never cut?");
}

TEST(ConnectUcx, CutLinkFailsEveryRankNamingAPeerAndItsMachine) {
  std::string why;
  if (!can_make_machines(why)) GTEST_SKIP() << why;
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const std::string dir = std::filesystem::temp_directory_path() / ("epx-ucx-cut-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string go = dir + "/go", outcomes = dir + "/outcomes";
  constexpr auto kTimeout = std::chrono::milliseconds(4000);
  long long cut_at = 0;
  const auto ok = run_ranks(4, m.names(), [&](Bootstrap& b) { loop_until_cut(b, go, outcomes, kTimeout); }, [&] {
    for (int i = 0; i < 600 && !std::filesystem::exists(go); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cut_at = now_ms();
    ucx::run_cmd("ip -n " + m.names()[1] + " link set eth1 down");
  });
  expect_all(ok, "cut link");
  const std::vector<Outcome> seen = read_outcomes(outcomes);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(seen.size(), 4u) << "every rank should report one error";
  bool across = false;
  for (const Outcome& o : seen) {
    const bool names_host = o.message.find("'" + m.names()[0] + "'") != std::string::npos || o.message.find("'" + m.names()[1] + "'") != std::string::npos;
    EXPECT_TRUE((o.code == "timeout" || o.code == "peer_failed") && names_host && o.message.find("phase '") != std::string::npos)
        << "rank " << o.rank << ": " << o.code << ":" << o.message;
    EXPECT_LE(o.at_ms - cut_at, kTimeout.count() + 3000) << "rank " << o.rank << " took too long: " << o.message;
    across = across || o.message.find("another machine") != std::string::npos;
    std::printf("rank %d after %lld ms: %s:%s\n", o.rank, o.at_ms - cut_at, o.code.c_str(), o.message.c_str());
  }
  EXPECT_TRUE(across) << "no rank named a peer on the other machine";
  m.remove();
}

// Rank 3 (machine 2) dies: its TCP connections close, so the ranks on machine 1 see their
// endpoints fail and rank 2 sees its process gone: every survivor raises kPeerFailed well
// before the 20 s timeout naming a peer and its machine (a rank may name one that failed
// and ended first), and the first failures name rank 3.
TEST(ConnectUcx, KilledRankOnTheOtherMachineFailsTheOthersAtOnce) {
  std::string why;
  if (!can_make_machines(why)) GTEST_SKIP() << why;
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const std::string dir = std::filesystem::temp_directory_path() / ("epx-ucx-kill-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string outcomes = dir + "/outcomes";
  const ref::Problem p = problem(4, 256, {9, 3, 14, 5}, 78);
  const auto start = now_ms();
  const auto ok = run_ranks(4, m.names(), [&](Bootstrap& b) {
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
    auto t = connect(b, {.timeout = std::chrono::seconds(20)});
    Buffer buffer(*t, config_for(p));
    if (b.rank() == 3) ::raise(SIGKILL);
    try {
      for (int i = 0; i < 3; ++i) buffer.dispatch(dispatch_args(views_of(p, b.rank()), {}));
    } catch (const Error& e) {
      std::ofstream(outcomes, std::ios::app) << b.rank() << ' ' << now_ms() << ' ' << to_string(e.code()) << ' ' << e.what() << "\n";
      return;
    }
    fail(b.rank(), "dispatch succeeded with rank 3 dead");
  });
  for (int r : {0, 1, 2}) EXPECT_TRUE(ok[static_cast<std::size_t>(r)]) << "rank " << r;
  EXPECT_FALSE(ok[3]);
  std::vector<Outcome> seen = read_outcomes(outcomes);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(seen.size(), 3u) << "every survivor should report one error";
  std::sort(seen.begin(), seen.end(), [](const Outcome& a, const Outcome& b) { return a.at_ms < b.at_ms; });
  EXPECT_NE(seen.front().message.find("rank 3 (node 1 '" + m.names()[1] + "'"), std::string::npos) << seen.front().message;
  for (const Outcome& o : seen) {
    EXPECT_TRUE(o.code == "peer_failed" && o.message.find("(node ") != std::string::npos && o.message.find("phase '") != std::string::npos)
        << "rank " << o.rank << ": " << o.code << ":" << o.message;
    EXPECT_LT(o.at_ms - start, 15000) << "rank " << o.rank << ": " << o.message;
    std::printf("rank %d: %s:%s\n", o.rank, o.code.c_str(), o.message.c_str());
  }
  m.remove();
}

// ---- rounds across machines with waits outside epx ----

std::uint8_t pair_byte(int src, int dst, int round, std::size_t i) {
  return static_cast<std::uint8_t>(src * 53 + dst * 29 + round * 7 + i * 13 + (i >> 11));
}

// Messages between every pair as epx's PPBuffer moves them to a peer on another machine: two
// slots per ordered pair in the receiver's window; a send waits for a free slot (the
// receiver's released count), puts the bytes, signals the arrived count, then quiets; a
// receive waits for the arrived count, copies the slot out and signals the released count.
class Pairs {
 public:
  static constexpr std::size_t kMsg = std::size_t{1} << 20;
  explicit Pairs(Transport& t) : t_(t), P_(t.num_ranks()), sent_(P_, 0), received_(P_, 0) {
    t_.allocate(2 * kMsg * static_cast<std::size_t>(P_), 2 * static_cast<std::size_t>(P_));
  }
  void send(int dst, const std::uint8_t* data, std::size_t n) {
    std::uint64_t& m = sent_[static_cast<std::size_t>(dst)];
    if (m >= 2) t_.wait_signal(static_cast<std::size_t>(P_ + dst), m - 1, WaitPoint{"pairs: a free slot", dst});
    t_.put(dst, slot(t_.rank(), m), data, n, 0);
    t_.signal(dst, static_cast<std::size_t>(t_.rank()), ++m, 0);
    t_.quiet(0);
  }
  void recv(int src, std::uint8_t* out, std::size_t n) {
    std::uint64_t& m = received_[static_cast<std::size_t>(src)];
    t_.wait_signal(static_cast<std::size_t>(src), m + 1, WaitPoint{"pairs: a message", src});
    std::memcpy(out, t_.window() + slot(src, m), n);
    t_.signal(src, static_cast<std::size_t>(P_ + t_.rank()), ++m, 0);
  }

 private:
  std::size_t slot(int src, std::uint64_t m) const { return (2 * static_cast<std::size_t>(src) + m % 2) * kMsg; }
  Transport& t_;
  int P_;
  std::vector<std::uint64_t> sent_, received_;
};

// epx.distributed's all_to_all_single across machines, then the application's own barrier
// (test_torchrun's mixed rounds): a pairwise exchange of 1 MiB messages (step s sends to
// rank + s and receives from rank - s, a message each way at a time; every peer first gets
// its first message), 2-4 MiB per pair and round, every byte checked; then a barrier of the
// test's own bootstrap (no UCX: only the background progress moves the peers' puts
// meanwhile) that the last rank joins 200 ms late.
void pairwise_rounds(Bootstrap& b, int rounds) {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  auto t = connect_ucx(b, std::chrono::seconds(20));
  const int P = b.size(), me = b.rank();
  constexpr std::size_t kMsg = Pairs::kMsg;
  Pairs pairs(*t);
  const auto bytes = [&](int src, int dst) {
    return kMsg * static_cast<std::size_t>(2 + (src + dst) % 3) - 4096 * static_cast<std::size_t>(src);
  };
  std::vector<std::uint8_t> got;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::vector<std::uint8_t>> out(static_cast<std::size_t>(P));
    for (int d = 0; d < P; ++d) {
      auto& o = out[static_cast<std::size_t>(d)];
      o.resize(bytes(me, d));
      for (std::size_t i = 0; i < o.size(); ++i) o[i] = pair_byte(me, d, round, i);
    }
    const auto send_piece = [&](int dst, std::size_t k) {
      const auto& o = out[static_cast<std::size_t>(dst)];
      pairs.send(dst, o.data() + k * kMsg, std::min(kMsg, o.size() - k * kMsg));
    };
    for (int s = 1; s < P; ++s) send_piece((me + s) % P, 0);
    for (int s = 1; s < P; ++s) {
      const int dst = (me + s) % P, src = (me - s + P) % P;
      const std::size_t ns = (bytes(me, dst) + kMsg - 1) / kMsg, nr = (bytes(src, me) + kMsg - 1) / kMsg;
      got.assign(bytes(src, me), 0);
      for (std::size_t k = 0; k < std::max(ns, nr); ++k) {
        if (k > 0 && k < ns) send_piece(dst, k);
        if (k < nr) pairs.recv(src, got.data() + k * kMsg, std::min(kMsg, got.size() - k * kMsg));
      }
      for (std::size_t i = 0; i < got.size(); ++i)
        if (got[i] != pair_byte(src, me, round, i))
          fail(me, "round " + std::to_string(round) + ": byte " + std::to_string(i) + " from rank " + std::to_string(src) + " differs");
    }
    if (me == P - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    b.barrier();
  }
}

// Rounds of epx.distributed's all-to-all across two machines, each followed by a wait outside
// epx: every byte arrives, no call waits out its timeout.
TEST(ConnectUcx, PairwiseRoundsAcrossMachinesWithWaitsOutsideEpx) {
  std::string why;
  if (!can_make_machines(why)) GTEST_SKIP() << why;
  NothingLeft nothing_left;
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const auto start = now_ms();
  expect_all(run_ranks(4, m.names(), [&](Bootstrap& b) { pairwise_rounds(b, 8); }), "pairwise rounds");
  std::printf("8 rounds in %lld ms\n", now_ms() - start);
  m.remove();
  nothing_left.check();
}

// ---- closing: the goodbye ----

// Rank 1 (machine 2) is done first: it releases its block and closes its group right after
// the barrier, while rank 0 (machine 1), slower, goes on putting and signalling into that
// block and completing those calls for 1.5 s (the last signals of a call that rank 1 no
// longer waits for). Rank 0 writes "rounds N" when its loop ended without an error, then
// waits for a signal rank 1 never sent; rank 1 writes "closed" once its group is gone.
// `kill`: rank 1 is SIGKILLed after the barrier instead.
void late_signals_to_a_closing_rank(Bootstrap& b, bool kill, const std::string& outcomes) {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  auto t = connect_ucx(b, std::chrono::seconds(5));
  constexpr std::size_t kBytes = std::size_t{64} << 10;
  t->allocate(kBytes, 4);
  t->barrier("closing: start");
  if (b.rank() == 1) {
    if (kill) ::raise(SIGKILL);
    t->allocate(0, 0);  // released: rank 0's puts still arrive (into a block kept mapped)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    t.reset();  // the group's end: goodbye, then the connections close
    std::ofstream(outcomes, std::ios::app) << "1 " << now_ms() << " closed\n";
    return;
  }
  const std::vector<std::uint8_t> src(kBytes, 7);
  const long long start = now_ms();
  std::uint64_t rounds = 0;
  const auto report = [&](const Error& e) {
    std::string m = e.what();
    std::replace(m.begin(), m.end(), '\n', ' ');
    std::ofstream(outcomes, std::ios::app) << "0 " << now_ms() << ' ' << to_string(e.code()) << ' ' << m << "\n";
  };
  try {
    while (now_ms() - start < 1500) {
      t->put(1, 0, src.data(), kBytes, 0);
      t->signal(1, 0, ++rounds, 0);
      t->quiet(0);
    }
  } catch (const Error& e) {
    return report(e);
  }
  std::ofstream(outcomes, std::ios::app) << "0 " << now_ms() << " rounds " << rounds << "\n";
  try {
    t->wait_signal(1, 1, WaitPoint{"closing: a signal rank 1 never sent", 1});
    std::ofstream(outcomes, std::ios::app) << "0 " << now_ms() << " waited a signal nobody sent\n";
  } catch (const Error& e) {
    report(e);
  }
}

// A rank that closes right after its last call while a peer on another machine still puts
// and signals into it: the peer's calls all complete (rank 1 said goodbye; what it no longer
// reads is dropped), rank 1 ends cleanly, and a wait for a signal rank 1 never sent fails at
// once naming it, long before the 5 s timeout.
TEST(ConnectUcx, LateSignalsToARankThatClosedComplete) {
  std::string why;
  if (!can_make_machines(why)) GTEST_SKIP() << why;
  NothingLeft nothing_left;
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const std::string dir = std::filesystem::temp_directory_path() / ("epx-ucx-close-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string outcomes = dir + "/outcomes";
  expect_all(run_ranks(2, m.names(), [&](Bootstrap& b) { late_signals_to_a_closing_rank(b, false, outcomes); }), "closing");
  std::vector<Outcome> seen = read_outcomes(outcomes);
  std::filesystem::remove_all(dir);
  for (const Outcome& o : seen) std::printf("rank %d at %lld: %s%s\n", o.rank, o.at_ms, o.code.c_str(), o.message.c_str());
  ASSERT_EQ(seen.size(), 3u) << "rank 1's close, rank 0's loop and its wait";
  std::sort(seen.begin(), seen.end(), [](const Outcome& a, const Outcome& b) { return a.at_ms < b.at_ms; });
  EXPECT_EQ(seen[0].rank, 1) << "rank 1 closed while rank 0 still signalled it";
  EXPECT_EQ(seen[0].code, "closed");
  EXPECT_EQ(seen[1].code, "rounds") << "rank 0's calls to the closed rank failed: " << seen[1].message;
  EXPECT_GE(seen[1].at_ms - seen[0].at_ms, 500) << "rank 0's loop should run well past rank 1's end";
  EXPECT_EQ(seen[2].code, "peer_failed") << seen[2].message;
  EXPECT_NE(seen[2].message.find("rank 1 (node 1 '" + m.names()[1] + "', another machine) closed its group"), std::string::npos) << seen[2].message;
  EXPECT_LT(seen[2].at_ms - seen[1].at_ms, 1000) << "the wait should fail at once: " << seen[2].message;
  m.remove();
  nothing_left.check();
}

// The same with rank 1 SIGKILLed instead of closing: it said no goodbye, so rank 0's calls
// fail, naming rank 1 and its machine, within the timeout.
TEST(ConnectUcx, SignalsToARankKilledWithoutGoodbyeFail) {
  std::string why;
  if (!can_make_machines(why)) GTEST_SKIP() << why;
  NothingLeft nothing_left;
  ucx::Machines m(2);
  ASSERT_TRUE(m.ready()) << m.error();
  const std::string dir = std::filesystem::temp_directory_path() / ("epx-ucx-vanish-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string outcomes = dir + "/outcomes";
  const long long start = now_ms();
  const auto ok = run_ranks(2, m.names(), [&](Bootstrap& b) { late_signals_to_a_closing_rank(b, true, outcomes); });
  EXPECT_TRUE(ok[0]);
  EXPECT_FALSE(ok[1]);
  const std::vector<Outcome> seen = read_outcomes(outcomes);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(seen.size(), 1u) << "rank 0's one error";
  const Outcome& o = seen[0];
  std::printf("rank %d after %lld ms: %s:%s\n", o.rank, o.at_ms - start, o.code.c_str(), o.message.c_str());
  EXPECT_TRUE(o.code == "peer_failed" || o.code == "timeout") << o.code << ":" << o.message;
  EXPECT_NE(o.message.find("rank 1 (node 1 '" + m.names()[1] + "', another machine)"), std::string::npos) << o.message;
  EXPECT_EQ(o.message.find("closed its group"), std::string::npos) << o.message;
  EXPECT_LT(o.at_ms - start, 5000 + 3000) << o.message;
  m.remove();
  nothing_left.check();
}

}  // namespace
}  // namespace epx::testing
