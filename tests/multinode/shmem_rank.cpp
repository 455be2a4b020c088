// One rank of a multi-"machine" test: started by oshrun (one process per rank, ranks from
// the launcher), it joins the job through epx::shmem_bootstrap(), connects the shmem
// transport and checks dispatch/combine bit for bit against tests/reference (the same
// fixtures as tests/multirank). Prints one "PASS <case>" line per case on rank 0 and exits
// non-zero (the error on stderr, naming the rank) on any mismatch or error.
//
//   epx_multinode_rank [--cases all|NAME,NAME...] [--timeout-ms N]
//                      [--bytes] [--hierarchical-count]
//                      [--fault kill-rank:R | --fault loop:FILE]
//
// --bytes: a larger dispatch+combine; each node's lowest rank reads its eth1 tx_bytes
//   before and after and prints it beside epx's count of payload bytes put to ranks on
//   other nodes (shmem_peer_info), as "BYTES node N tx T epx E".
// --hierarchical-count: the hierarchical schedule on the real node layout; fails unless
//   every put to another node goes to the same-lane rank.
// --fault kill-rank:R: rank R SIGKILLs itself between a dispatch and its combine.
// --fault loop:FILE: dispatch/combine in a loop until an error; rank 0 creates FILE once
//   the loop runs (the script then cuts the link or kills a daemon).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/error.hpp"
#include "epx/shmem.hpp"
#include "../multirank/multirank_support.hpp"
#include "rank_program.hpp"

namespace epx::testing {
namespace {

struct Case {
  std::string name;
  ref::FixtureOptions fx;
  ref::DispatchOptions d;
  bool weighted = false;
  bool bias = false;
  int workers = 2;
  Protocol protocol = Protocol::kExplicit;
  int queues = 1;
  int ring_rows = 0;  // BufferConfig::ring_rows: a bounded receive area, paced by credits
};

ref::FixtureOptions fx(int P, int K, std::uint64_t seed) {
  ref::FixtureOptions f;
  f.num_ranks = P;
  f.num_experts = 4 * P;
  f.num_topk = K;
  f.hidden = 256;
  for (int r = 0; r < P; ++r) f.tokens_per_rank.push_back(r == 1 ? 0 : 5 + 7 * r);  // uneven, rank 1 empty
  f.seed = seed;
  return f;
}

std::vector<Case> cases(int P) {
  std::vector<Case> v;
  Case compact{"compact", fx(P, 4, 10), {}};
  v.push_back(compact);
  Case expanded{"expanded_a4", fx(P, 4, 11), {}};
  expanded.d.expanded = true;
  expanded.d.alignment = 4;
  v.push_back(expanded);
  Case fp8c{"fp8_compact", fx(P, 3, 12), {}};
  fp8c.fx.fp8 = true;
  v.push_back(fp8c);
  Case fp8e{"fp8_expanded_worst", fx(P, 4, 13), {}};
  fp8e.fx.fp8 = true;
  fp8e.d.expanded = true;
  fp8e.d.worst = 64 * P;
  v.push_back(fp8e);
  Case weighted{"weighted_expanded", fx(P, 4, 14), {}};
  weighted.d.expanded = true;
  weighted.weighted = true;
  v.push_back(weighted);
  Case bias_c{"bias_compact_one_worker", fx(P, 2, 15), {}};
  bias_c.bias = true;
  bias_c.workers = 1;
  v.push_back(bias_c);
  Case bias_e{"bias_expanded", fx(P, 3, 16), {}};
  bias_e.d.expanded = true;
  bias_e.bias = true;
  v.push_back(bias_e);
  Case worst_c{"worst_compact", fx(P, 3, 17), {}};
  worst_c.d.worst = P * (P > 2 ? 5 + 7 * (P - 1) : 5);  // P x C rows: the whole receive area
  v.push_back(worst_c);
  Case worst_e{"worst_expanded", fx(P, 3, 18), {}};
  worst_e.d.expanded = true;
  worst_e.d.alignment = 2;
  worst_e.d.worst = 3 * 40 * P + 8 * P;
  v.push_back(worst_e);
  Case zipf{"zipf_expanded_a128", fx(P, 4, 19), {}};
  zipf.fx.zipf = 1.5;
  zipf.d.expanded = true;
  zipf.d.alignment = 128;
  v.push_back(zipf);
  for (Protocol pr : {Protocol::kTail, Protocol::kFlag})
    for (bool exp : {false, true}) {
      Case c{std::string(to_string(pr)) + "_q2_" + (exp ? "expanded" : "compact"), fx(P, 4, 20 + (exp ? 1 : 0)), {}};
      c.protocol = pr;
      c.queues = 2;
      c.d.expanded = exp;
      c.workers = 3;
      v.push_back(c);
    }
  // The ring paths poll their credit and tail signals between puts: over a network transport
  // whose signals need the target's progress, they must still move.
  for (bool exp : {false, true}) {
    Case c{std::string("ring4_") + (exp ? "expanded" : "compact"), fx(P, 3, 22 + (exp ? 1 : 0)), {}};
    c.ring_rows = 4;
    c.d.expanded = exp;
    v.push_back(c);
  }
  return v;
}

BufferConfig config_of(const ref::Problem& p, const Case& c) {
  BufferConfig b = config_for(p, c.workers);
  b.dataplane.protocol = c.protocol;
  b.dataplane.queues = c.queues;
  b.ring_rows = c.ring_rows;
  return b;
}

// Every rank computes the whole reference (cheap at these sizes) and checks its own part.
void run_case(Transport& t, const Case& c) {
  const ref::Problem p = ref::make_problem(c.fx);
  const int P = p.num_ranks, r = t.rank();
  const auto ur = static_cast<std::size_t>(r);
  const auto want = ref::dispatch_all(p, c.d);
  std::vector<std::vector<std::uint16_t>> y(static_cast<std::size_t>(P)), b0, b1, y_wide(static_cast<std::size_t>(P));
  for (int s = 0; s < P; ++s) {
    y[static_cast<std::size_t>(s)] = ref::expert_fn(p, want[static_cast<std::size_t>(s)], c.d);
    y_wide[static_cast<std::size_t>(s)] = wide_bf16(500 + static_cast<std::uint64_t>(s), want[static_cast<std::size_t>(s)].rows * p.hidden);
  }
  if (c.bias)
    for (int s = 0; s < P; ++s) {
      const std::int64_t n = p.ranks[static_cast<std::size_t>(s)].num_tokens * p.hidden;
      b0.push_back(ref::random_bf16(100 + static_cast<std::uint64_t>(s), n));
      b1.push_back(ref::random_bf16(200 + static_cast<std::uint64_t>(s), n));
    }
  const auto combined = ref::combine(p, c.d, want, y, c.bias ? &b0 : nullptr, c.bias ? &b1 : nullptr, c.weighted, r);
  const auto combined_wide = ref::combine(p, c.d, want, y_wide, nullptr, nullptr, c.weighted, r);
  ref::Problem p2 = p;  // the same routing with new x, for the cached dispatch
  for (int s = 0; s < P && !p.fp8; ++s)
    p2.ranks[static_cast<std::size_t>(s)].x =
        ref::random_bf16(300 + static_cast<std::uint64_t>(s), p.ranks[static_cast<std::size_t>(s)].num_tokens * p.hidden);
  const auto want2 = ref::dispatch(p2, r, c.d);

  Buffer buffer(t, config_of(p, c));
  const RankViews v = views_of(p, r);
  DispatchResult d = buffer.dispatch(dispatch_args(v, c.d));
  expect_dispatch(r, p, c.d, want[ur], d);
  CombineArgs ca;
  ca.y = TensorView(y[ur].data(), DType::kBF16, {want[ur].rows, p.hidden});
  ca.handle = &d.handle;
  ca.weighted = c.weighted;
  const std::int64_t S = p.ranks[ur].num_tokens;
  if (c.bias) {
    ca.bias0 = TensorView(b0[ur].data(), DType::kBF16, {S, p.hidden});
    ca.bias1 = TensorView(b1[ur].data(), DType::kBF16, {S, p.hidden});
  }
  expect_bits(r, "combined_x", buffer.combine(ca).combined_x.data(), combined);
  // Cached: the same x, then new x on the same routing; the first handle's combine again.
  DispatchArgs cached = dispatch_args(v, c.d);
  cached.handle = &d.handle;
  expect_dispatch(r, p, c.d, want[ur], buffer.dispatch(cached));
  cached.x = views_of(p2, r).x;
  expect_dispatch(r, p2, c.d, want2, buffer.dispatch(cached));
  expect_bits(r, "combined_x (second combine)", buffer.combine(ca).combined_x.data(), combined);
  CombineArgs wide = ca;
  wide.y = TensorView(y_wide[ur].data(), DType::kBF16, {want[ur].rows, p.hidden});
  wide.bias0 = wide.bias1 = TensorView();
  expect_bits(r, "combined_x (wide-range y)", buffer.combine(wide).combined_x.data(), combined_wide);
  // Zero-copy output and the pull combine (y in place; pulls only where every peer is mapped;
  // not with a ring, which has no slot for every row).
  if (!c.d.expanded && c.protocol != Protocol::kFlag && !p.fp8 && c.ring_rows == 0) {
    DispatchArgs zc = dispatch_args(v, c.d);
    zc.recv_in_window = true;
    DispatchResult dz = buffer.dispatch(zc);
    expect_dispatch(r, p, c.d, want[ur], dz);
    auto* in_place = static_cast<std::uint16_t*>(dz.recv_x.data());
    if (!y[ur].empty()) std::memcpy(in_place, y[ur].data(), y[ur].size() * sizeof(std::uint16_t));
    CombineArgs pull = ca;
    pull.handle = &dz.handle;
    pull.y = TensorView(in_place, DType::kBF16, {want[ur].rows, p.hidden});
    expect_bits(r, "combined_x (y in the window)", buffer.combine(pull).combined_x.data(), combined);
    if (buffer.last_stats().pulled != (buffer.transport().peer_window(r) != nullptr)) fail(r, "pull mode does not follow peer_window");
  }
}

/// Each node's lowest rank reads its eth1 transmit counter (the namespace's veth).
std::uint64_t tx_bytes() {
  std::ifstream f("/sys/class/net/eth1/statistics/tx_bytes");
  std::uint64_t v = 0;
  if (!(f >> v)) throw std::runtime_error("cannot read /sys/class/net/eth1/statistics/tx_bytes (not in a test namespace?)");
  return v;
}

void bytes_case(Bootstrap& boot, Transport& t, const NodeMap& nodes) {
  const int P = t.num_ranks(), r = t.rank();
  ref::FixtureOptions f;
  f.num_ranks = P;
  f.num_experts = 4 * P;
  f.num_topk = 4;
  f.hidden = 2048;
  f.tokens = 128;
  f.seed = 77;
  f.mask_prob = 0.0;
  const ref::Problem p = ref::make_problem(f);
  const ref::DispatchOptions o{};
  const auto want = ref::dispatch(p, r, o);
  const auto y = ref::expert_fn(p, want, o);
  Buffer buffer(t, config_for(p, 2));
  const RankViews v = views_of(p, r);
  const int node = nodes.node_of_rank[static_cast<std::size_t>(r)];
  const bool reader = nodes.ranks_of(node).front() == r;
  auto before = shmem_peer_info(t);
  t.barrier("bytes: start");
  const std::uint64_t tx0 = reader ? tx_bytes() : 0;
  t.barrier("bytes: counters read");
  for (int i = 0; i < 3; ++i) {
    DispatchResult d = buffer.dispatch(dispatch_args(v, o));
    expect_dispatch(r, p, o, want, d);
    CombineArgs ca;
    ca.y = TensorView(y.data(), DType::kBF16, {want.rows, p.hidden});
    ca.handle = &d.handle;
    buffer.combine(ca);
  }
  t.barrier("bytes: done");
  const std::uint64_t tx1 = reader ? tx_bytes() : 0;
  const auto after = shmem_peer_info(t);
  std::uint64_t remote = 0;
  for (int q = 0; q < P; ++q)
    if (after[static_cast<std::size_t>(q)].node != node)
      remote += after[static_cast<std::size_t>(q)].put_bytes - before[static_cast<std::size_t>(q)].put_bytes;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(P));
  boot.allgather(&remote, all.data(), sizeof remote);
  if (reader) {
    std::uint64_t node_remote = 0;
    for (int q : nodes.ranks_of(node)) node_remote += all[static_cast<std::size_t>(q)];
    std::printf("BYTES node %d tx %llu epx %llu\n", node, static_cast<unsigned long long>(tx1 - tx0),
                static_cast<unsigned long long>(node_remote));
    std::fflush(stdout);
  }
}

/// One round trip of `c` on the hierarchical schedule with `order`, bit for bit against the
/// reference in that order; fails if rows went to another node's rank other than my lane's.
/// Returns the bytes of rows this rank put to the other nodes: in the dispatch, in the combine.
std::pair<std::uint64_t, std::uint64_t> hierarchical_round_trip(Transport& t, const NodeMap& nodes, const Case& c,
                                                                CombineOrder order) {
  const int P = t.num_ranks(), r = t.rank(), per = nodes.uniform_ranks_per_node();
  const ref::Problem p = ref::make_problem(c.fx);
  const auto want = ref::dispatch_all(p, c.d);
  std::vector<std::vector<std::uint16_t>> y(static_cast<std::size_t>(P));
  for (int s = 0; s < P; ++s) y[static_cast<std::size_t>(s)] = ref::expert_fn(p, want[static_cast<std::size_t>(s)], c.d);
  const bool node_first = order == CombineOrder::kNodeFirst;
  const auto combined = ref::combine(p, c.d, want, y, nullptr, nullptr, false, r, node_first ? &nodes.node_of_rank : nullptr);
  BufferConfig cfg = config_of(p, c);
  cfg.dataplane.topology = "builtin:servers:" + std::to_string(per);
  cfg.dataplane.schedule = parse_schedule("hierarchical");
  cfg.dataplane.combine_order = order;
  Buffer buffer(t, cfg);
  auto cross = [&](const std::vector<ShmemPeerInfo>& from, const std::vector<ShmemPeerInfo>& to) {
    std::uint64_t bytes = 0;
    for (int q = 0; q < P; ++q) {
      const auto n = to[static_cast<std::size_t>(q)].payload_bytes - from[static_cast<std::size_t>(q)].payload_bytes;
      if (nodes.node_of_rank[static_cast<std::size_t>(q)] == nodes.node_of_rank[static_cast<std::size_t>(r)]) continue;
      if (q % per != r % per && n > 0)
        fail(r, "hierarchical: " + std::to_string(n) + " bytes of rows put to rank " + std::to_string(q) + " on another node, not my lane");
      bytes += n;
    }
    return bytes;
  };
  const auto before = shmem_peer_info(t);
  DispatchResult d = buffer.dispatch(dispatch_args(views_of(p, r), c.d));
  expect_dispatch(r, p, c.d, want[static_cast<std::size_t>(r)], d);
  const auto dispatched = shmem_peer_info(t);
  CombineArgs ca;
  ca.y = TensorView(y[static_cast<std::size_t>(r)].data(), DType::kBF16, {want[static_cast<std::size_t>(r)].rows, p.hidden});
  ca.handle = &d.handle;
  expect_bits(r, std::string("combined_x (hierarchical, ") + to_string(order) + ")", buffer.combine(ca).combined_x.data(), combined);
  t.barrier("hierarchical count");
  return {cross(before, dispatched), cross(dispatched, shmem_peer_info(t))};
}

/// The hierarchical schedule on the real layout, both combine orders: puts to other nodes go
/// to the same lane only, and the node-first combine sends no more bytes across than the
/// flat one (one sum per token and node pair instead of one reply per rank).
void hierarchical_count(Transport& t, const NodeMap& nodes) {
  const int P = t.num_ranks(), r = t.rank();
  const int per = nodes.uniform_ranks_per_node();
  if (per == 0 || nodes.num_nodes < 2) fail(r, "hierarchical count needs >= 2 nodes of equal size");
  for (int q = 0; q < P; ++q)
    if (nodes.node_of_rank[static_cast<std::size_t>(q)] != q / per) fail(r, "hierarchical count expects consecutive ranks per node");
  for (bool exp : {false, true}) {
    Case c{"hierarchical", fx(P, 4, 40), {}};
    c.d.expanded = exp;
    const auto flat = hierarchical_round_trip(t, nodes, c, CombineOrder::kFlat);
    const auto node_first = hierarchical_round_trip(t, nodes, c, CombineOrder::kNodeFirst);
    if (node_first.second > flat.second)
      fail(r, "node-first combine put " + std::to_string(node_first.second) + " bytes across, the flat one " + std::to_string(flat.second));
    std::printf("HIER rank %d %s bytes of rows to the other node %llu (same lane only); combine: flat %llu, node-first %llu\n", r,
                exp ? "expanded" : "compact", static_cast<unsigned long long>(flat.first + flat.second),
                static_cast<unsigned long long>(flat.second), static_cast<unsigned long long>(node_first.second));
  }
}

void fault_loop(Transport& t, const std::string& marker, int kill_rank) {
  const int P = t.num_ranks(), r = t.rank();
  Case c{"fault", fx(P, 4, 50), {}};
  const ref::Problem p = ref::make_problem(c.fx);
  const auto want = ref::dispatch(p, r, c.d);
  const auto y = ref::expert_fn(p, want, c.d);
  Buffer buffer(t, config_of(p, c));
  const RankViews v = views_of(p, r);
  for (long i = 0;; ++i) {
    DispatchResult d = buffer.dispatch(dispatch_args(v, c.d));
    if (r == kill_rank) raise(SIGKILL);  // between a dispatch and its combine
    if (i == 20 && r == 0 && !marker.empty()) ::close(::open(marker.c_str(), O_CREAT | O_WRONLY, 0600));
    CombineArgs ca;
    ca.y = TensorView(y.data(), DType::kBF16, {want.rows, p.hidden});
    ca.handle = &d.handle;
    buffer.combine(ca);
    if (i > 200000) fail(r, "fault loop: no fault happened");
  }
}

// --ping N: rank 0 and the last rank bounce a signal N times (a timing probe, prints us per round trip).
void ping(Transport& t, int n) {
  const int P = t.num_ranks(), r = t.rank(), other = r == 0 ? P - 1 : 0;
  t.allocate(4096, 4);
  t.barrier("ping start");
  static std::vector<char> data(4096, 1);
  const auto t0 = std::chrono::steady_clock::now();
  if (r == 0 || r == P - 1)
    for (int i = 1; i <= n; ++i) {
      if (r == 0) {
        t.put(other, 0, data.data(), 1024, 0);
        t.signal(other, 0, static_cast<std::uint64_t>(i), 0);
        t.wait_signal(1, static_cast<std::uint64_t>(i), {"ping", other});
      } else {
        t.wait_signal(0, static_cast<std::uint64_t>(i), {"ping", other});
        t.put(other, 0, data.data(), 1024, 0);
        t.signal(other, 1, static_cast<std::uint64_t>(i), 0);
      }
    }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  t.quiet(0);
  t.barrier("ping end");
  if (r == 0) std::printf("PING %d round trips: %.1f us each\n", n, static_cast<double>(us) / n);
}

int main_impl(int argc, char** argv) {
  const RankOptions o(argc, argv, {"--cases", "--timeout-ms", "--fault", "--ping"}, {"--bytes", "--hierarchical-count"});
  const std::string which = o.value("--cases", "all"), fault = o.value("--fault", "");
  const bool bytes = o.has("--bytes"), hier = o.has("--hierarchical-count");
  const int pings = std::stoi(o.value("--ping", "0"));
  auto boot = shmem_bootstrap();
  const NodeMap nodes = discover_nodes(*boot);
  auto t = connect_shmem(*boot, o.timeout());
  const int r = t->rank();
  {
    std::ostringstream os;
    os << "rank " << r << " node " << nodes.node_of_rank[static_cast<std::size_t>(r)] << " paths:";
    for (const auto& i : shmem_peer_info(*t)) os << ' ' << i.peer << '=' << (i.mapped ? "mapped" : "shmem");
    std::printf("%s\n", os.str().c_str());
    if (r == 0) {  // what epx set for Open MPI because the launcher had not (epx::ShmemOptions)
      const ShmemRuntimeInfo info = shmem_runtime_info();
      std::printf("RUNTIME heap %zu (%s); set:", info.heap_bytes, info.heap_from.c_str());
      for (const std::string& v : info.set_by_epx) std::printf(" %s", v.c_str());
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  if (!fault.empty()) {
    if (fault.rfind("kill-rank:", 0) == 0) fault_loop(*t, "", std::stoi(fault.substr(10)));
    else if (fault.rfind("loop:", 0) == 0) fault_loop(*t, fault.substr(5), -1);
    else throw std::invalid_argument("unknown fault " + fault);
  }
  if (pings > 0) return ping(*t, pings), 0;
  if (bytes) bytes_case(*boot, *t, nodes);
  if (hier) hierarchical_count(*t, nodes);
  if (!bytes && !hier) {
    for (const Case& c : cases(t->num_ranks())) {
      if (which != "all" && ("," + which + ",").find("," + c.name + ",") == std::string::npos) continue;
      const auto t0 = std::chrono::steady_clock::now();
      run_case(*t, c);
      t->barrier("case done");
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0) std::printf("PASS %s (P=%d, %d nodes, %lld ms)\n", c.name.c_str(), t->num_ranks(), nodes.num_nodes, static_cast<long long>(ms));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace epx::testing

int main(int argc, char** argv) {
  return epx::testing::rank_main("epx_multinode_rank", argc, argv, epx::testing::main_impl);
}
