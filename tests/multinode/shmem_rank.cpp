// One rank of a multi-"machine" test: started by oshrun (one process per rank, ranks from
// the launcher), it joins the job through epx::shmem_bootstrap(), connects the shmem
// transport and checks dispatch/combine bit for bit against tests/reference (the same
// fixtures as tests/multirank). Prints one "PASS <case>" line per case on rank 0 and exits
// non-zero (the error on stderr, naming the rank) on any mismatch or error.
//
//   epx_multinode_rank [--cases all|NAME,NAME...] [--timeout-ms N]
//                      [--bytes] [--hierarchical-count]
//                      [--fault kill-rank:R | loop:FILE | heal:R | own-error:R]
//
// --bytes: a larger dispatch+combine; each node's lowest rank reads its eth1 tx_bytes
//   before and after and prints it beside epx's count of payload bytes put to ranks on
//   other nodes (shmem_peer_info), as "BYTES node N tx T epx E".
// --hierarchical-count: the hierarchical schedule on the real node layout; fails unless
//   every put to another node goes to the same-lane rank.
// --fault kill-rank:R: rank R SIGKILLs itself between a dispatch and its combine.
// --fault loop:FILE: dispatch/combine in a loop until an error; rank 0 creates FILE once
//   the loop runs (the script then cuts the link or kills a daemon).
// --fault heal:R: as kill-rank:R in the 4th round trip (each checked bit for bit), then the
//   survivors heal (needs oshrun --mca orte_abort_on_non_zero_status 0, else Open MPI ends
//   them): each prints its error, agrees (epx::agree_survivors: R lost), rebuilds the group
//   over the shmem transport (epx::rebuild_group) and checks the old group refuses calls
//   ("HEAL rank ..." lines with the times); then, on the P-1 survivors, bit for bit: a
//   replica plan's routing masked to the live replicas (the dropped counts summed by
//   epx::sum_over_group) and the --cases (default: all) for P-1 ranks ("PASS heal:<case>" on the new rank 0). The
//   process then ends through epx (the survivors' last barrier, rank 0 ends the job).
// --fault own-error:R: rank R SIGKILLs itself after a barrier; a second later every other
//   rank ends on an error of its own (exit 1, the error on stderr) and its teardown must not
//   wait for the dead PE (with orte_abort_on_non_zero_status 0 the job then ends by itself).
// --join grow:K | heal:R | abandon (a job with spare PEs: EPX_SHMEM_SPARES; the spares wait in
//   connect and run only once admitted, "JOINED ..." then the cases): grow:K, the members
//   check compact on their P, then admit K spares ("ADMIT rank ... in N ms") and run the
//   --cases on P + K ("PASS join:<case>"); heal:R, as --fault heal:R, then the survivors admit
//   one spare and run the cases on the grown group; abandon, the members admit one spare,
//   which dies joining (EPX_FAULT_INJECT="<its PE>:elastic admit:KILL"): admit returns null
//   on every member, which run the cases on their group as it was.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "epx/buffer.hpp"
#include "epx/connect.hpp"
#include "epx/elastic.hpp"
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

using Clock = std::chrono::steady_clock;
long long ms_since(Clock::time_point t0) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
}

/// A replica plan for the first group (P ranks, 2P logical experts, 3 slots per rank, slot s
/// on rank s / 3): slots [0, P) hold a second replica of experts 1, 3, 5, ..., slots [P, 3P)
/// experts 0 .. 2P-1 in order. Rank r's routing masked to the live replicas, written here
/// apart from the library (the rule of epx::map_to_live_replicas, kSpread): replica t mod
/// the live ones, in slot order, renumbered densely over the survivors; a pair whose expert
/// has no live replica becomes -1 and is counted.
struct Masked {
  std::vector<std::int64_t> topk_idx;
  std::int64_t pairs = 0, tokens = 0;
};
Masked mask_to_live(const std::vector<std::int64_t>& topk_idx, int K, int P, const std::vector<int>& lost) {
  auto is_lost = [&](int rank) { return std::find(lost.begin(), lost.end(), rank) != lost.end(); };
  auto expert_of = [&](int slot) { return slot < P ? 2 * slot + 1 : slot - P; };
  Masked m;
  m.topk_idx.assign(topk_idx.size(), -1);
  for (std::size_t t = 0; t < topk_idx.size() / static_cast<std::size_t>(K); ++t) {
    bool dropped = false;
    for (int k = 0; k < K; ++k) {
      const std::size_t i = t * static_cast<std::size_t>(K) + static_cast<std::size_t>(k);
      if (topk_idx[i] < 0) continue;
      std::vector<int> live;
      for (int slot = 0; slot < 3 * P; ++slot)
        if (expert_of(slot) == topk_idx[i] && !is_lost(slot / 3)) live.push_back(slot);
      if (live.empty()) {
        ++m.pairs, dropped = true;
        continue;
      }
      const int slot = live[t % live.size()];
      int below = 0;
      for (int l : lost) below += l < slot / 3;
      m.topk_idx[i] = slot - 3 * below;
    }
    m.tokens += dropped;
  }
  return m;
}

/// The first group's routing masked to the survivors' live replicas (mask_to_live): every
/// survivor masks every survivor's routing, dispatches its own over `group` and combines,
/// bit for bit against the reference over the masked problem; the dropped counts summed by
/// epx::sum_over_group must be the sum of every survivor's.
void masked_pair(Transport& group, int P, const Membership& m, int orig) {
  constexpr int kTopk = 3;
  ref::FixtureOptions f;
  f.num_ranks = P;
  f.num_experts = 2 * P;
  f.num_topk = kTopk;
  f.hidden = 128;
  f.tokens = 24;
  f.zipf = 1.0;
  f.seed = 61;
  const ref::Problem p = ref::make_problem(f);
  ref::Problem q = p;
  q.num_ranks = static_cast<int>(m.survivors.size());
  q.num_experts = 3 * q.num_ranks;
  q.ranks.clear();
  std::int64_t pairs = 0, tokens = 0, my_pairs = 0, my_tokens = 0;
  for (int o : m.survivors) {
    const Masked mr = mask_to_live(p.ranks[static_cast<std::size_t>(o)].topk_idx, kTopk, P, m.lost);
    q.ranks.push_back(p.ranks[static_cast<std::size_t>(o)]);
    q.ranks.back().topk_idx = mr.topk_idx;
    pairs += mr.pairs, tokens += mr.tokens;
    if (o == orig) my_pairs = mr.pairs, my_tokens = mr.tokens;
  }
  const std::vector<std::int64_t> total = sum_over_group(group, {my_pairs, my_tokens});
  if (total != std::vector<std::int64_t>{pairs, tokens})
    fail(orig, "sum_over_group of the dropped counts: " + std::to_string(total[0]) + "/" + std::to_string(total[1]) +
                   ", want " + std::to_string(pairs) + "/" + std::to_string(tokens));
  const int me = group.rank();
  const ref::DispatchOptions o{};
  const auto want = ref::dispatch_all(q, o);
  std::vector<std::vector<std::uint16_t>> y(want.size());
  for (std::size_t r = 0; r < want.size(); ++r) y[r] = ref::expert_fn(q, want[r], o);
  const auto combined = ref::combine(q, o, want, y, nullptr, nullptr, false, me);
  Buffer buffer(group, config_for(q, 2));
  DispatchResult d = buffer.dispatch(dispatch_args(views_of(q, me), o));
  expect_dispatch(me, q, o, want[static_cast<std::size_t>(me)], d);
  CombineArgs ca;
  ca.y = TensorView(y[static_cast<std::size_t>(me)].data(), DType::kBF16, {want[static_cast<std::size_t>(me)].rows, q.hidden});
  ca.handle = &d.handle;
  expect_bits(me, "combined_x (masked routing)", buffer.combine(ca).combined_x.data(), combined);
  if (me == 0)
    std::printf("PASS heal:masked_replicas (P=%d, %lld pairs / %lld tokens without a live replica, summed over the group)\n",
                q.num_ranks, static_cast<long long>(pairs), static_cast<long long>(tokens));
  std::fflush(stdout);
}

/// The --cases on `group` ("PASS <label>:<case>" on its rank 0), then "DONE rank <r>".
void cases_on(Transport& group, const std::string& which, const char* label, int orig) {
  for (const Case& k : cases(group.num_ranks())) {
    if (which != "all" && ("," + which + ",").find("," + k.name + ",") == std::string::npos) continue;
    const auto t0 = Clock::now();
    run_case(group, k);
    group.barrier("case done");
    if (group.rank() == 0) std::printf("PASS %s:%s (P=%d, %lld ms)\n", label, k.name.c_str(), group.num_ranks(), ms_since(t0));
    std::fflush(stdout);
  }
  std::printf("DONE rank %d\n", orig);
  std::fflush(stdout);
}

/// The members' admission of --join: `want` spares (0: it must be abandoned), the time it took.
std::unique_ptr<Transport> admit_spares(Transport& group, int want, int orig) {
  const auto t0 = Clock::now();
  Admission a;
  std::unique_ptr<Transport> bigger = admit(group, {.joiners = want > 0 ? want : 1, .tag = 7}, &a);
  const long long ms = ms_since(t0);
  if ((bigger != nullptr) != (want > 0) || a.joined != want || a.old_num_ranks != group.num_ranks() ||
      (bigger && (bigger->rank() != group.rank() || bigger->num_ranks() != group.num_ranks() + want)))
    fail(orig, "admit: joined " + std::to_string(a.joined) + " of " + std::to_string(want) + (bigger ? " (a group)" : " (null)"));
  if (bigger) std::printf("ADMIT rank %d -> rank %d of %d: %d joined in %lld ms\n", orig, bigger->rank(), bigger->num_ranks(), want, ms);
  else std::printf("ADMIT rank %d -> abandoned, still rank %d of %d, in %lld ms\n", orig, group.rank(), group.num_ranks(), ms);
  std::fflush(stdout);
  return bigger;
}

/// The survivors' part of --fault heal:R: agree, rebuild, go on (see the top); with
/// `joiners`, admit that many spares after the rebuild and go on over them (--join heal:R).
void heal_after(Transport& t, const NodeMap& nodes, int victim, const std::string& which, int completed,
                const std::string& error, Clock::time_point failed_at, int joiners) {
  const int P = t.num_ranks(), r = t.rank();
  const auto ur = static_cast<std::size_t>(r);
  if (completed < 3 || completed > 4) fail(r, "heal: failed after " + std::to_string(completed) + " round trips, not in the victim's");
  std::printf("LOSS rank %d: %s\n", r, error.c_str());
  std::fflush(stdout);
  const Membership m = agree_survivors(t);
  const long long agreed = ms_since(failed_at);
  if (m.lost != std::vector<int>{victim} || m.new_rank != (r < victim ? r : r - 1))
    fail(r, "agree_survivors: lost " + std::to_string(m.lost.size()) + " rank(s), new rank " + std::to_string(m.new_rank));
  std::unique_ptr<Transport> group = rebuild_group(t, m);
  std::printf("HEAL rank %d (node %d) -> rank %d of %d: lost rank %d; agreed %lld ms after its error, rebuilt in %lld ms\n", r,
              nodes.node_of_rank[ur], group->rank(), group->num_ranks(), victim, agreed, ms_since(failed_at) - agreed);
  std::fflush(stdout);
  try {  // the old group is retired: a call on it fails at once naming the rebuild
    t.barrier("old group");
    fail(r, "a barrier on the retired group returned");
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kBadHandle || std::string(e.what()).find("rebuilt") == std::string::npos) throw;
  }
  masked_pair(*group, P, m, r);
  if (joiners == 0) return cases_on(*group, which, "heal", r);
  std::unique_ptr<Transport> bigger = admit_spares(*group, joiners, r);
  cases_on(*bigger, which, "join", r);
}

/// --fault own-error:R: rank R dies after a barrier; every other rank, a second later, ends on
/// an error of its own (no peer loss: nothing it waited for failed), unwinding its transport.
/// Its teardown must not make the collective free, which would wait for the dead PE until
/// the launcher's timeout: a member whose process is seen gone ends the collective calls.
void own_error(Transport& t, int victim) {
  const int r = t.rank();
  t.allocate(4096, 4);  // a symmetric block, freed collectively in a live group's teardown
  t.barrier("own error: ready");
  if (r == victim) raise(SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  throw std::runtime_error("rank " + std::to_string(r) + ": an error of this rank's own, after rank " + std::to_string(victim) +
                           " died");
}

/// --fault heal:R (see the top).
void heal(Transport& t, const NodeMap& nodes, int victim, const std::string& which, int joiners) {
  const int P = t.num_ranks(), r = t.rank();
  Case c{"heal", fx(P, 4, 50), {}};
  const ref::Problem p = ref::make_problem(c.fx);
  const auto want = ref::dispatch_all(p, c.d);
  std::vector<std::vector<std::uint16_t>> y(static_cast<std::size_t>(P));
  for (int s = 0; s < P; ++s) y[static_cast<std::size_t>(s)] = ref::expert_fn(p, want[static_cast<std::size_t>(s)], c.d);
  const auto combined = ref::combine(p, c.d, want, y, nullptr, nullptr, false, r);
  const auto ur = static_cast<std::size_t>(r);
  int completed = 0;
  std::string error;
  Clock::time_point failed_at = Clock::now();
  try {
    Buffer buffer(t, config_of(p, c));
    for (;; ++completed) {
      DispatchResult d = buffer.dispatch(dispatch_args(views_of(p, r), c.d));
      expect_dispatch(r, p, c.d, want[ur], d);
      if (completed == 3 && r == victim) raise(SIGKILL);  // between a dispatch and its combine
      CombineArgs ca;
      ca.y = TensorView(y[ur].data(), DType::kBF16, {want[ur].rows, p.hidden});
      ca.handle = &d.handle;
      expect_bits(r, "combined_x (before the loss)", buffer.combine(ca).combined_x.data(), combined);
      if (completed > 100) fail(r, "heal: the loss of rank " + std::to_string(victim) + " went unnoticed");
    }
  } catch (const Error& e) {
    if (!is_peer_loss(e)) throw;
    error = e.what();
    failed_at = Clock::now();
  }
  try {
    heal_after(t, nodes, victim, which, completed, error, failed_at, joiners);
  } catch (const std::exception& e) {
    // Not rank_main's _Exit: after a loss only exit() lets epx end the job (at once, with a
    // non-zero status); a process that just vanishes leaves Open MPI waiting for the dead PE.
    std::fprintf(stderr, "epx_multinode_rank: %s\n", e.what());
    std::fflush(stderr);
    std::exit(1);
  }
}

/// --join (see the top), in a member; a spare runs joined() once admitted.
void join(Transport& t, const NodeMap& nodes, const std::string& mode, const std::string& which) {
  if (mode.rfind("heal:", 0) == 0) return heal(t, nodes, std::stoi(mode.substr(5)), which, 1);
  const int r = t.rank();
  if (mode == "abandon") {
    admit_spares(t, 0, r);
    return cases_on(t, which, "join", r);
  }
  if (mode.rfind("grow:", 0) != 0) throw std::invalid_argument("unknown --join " + mode);
  run_case(t, cases(t.num_ranks()).front());
  if (r == 0) std::printf("PASS before:compact (P=%d)\n", t.num_ranks());
  std::unique_ptr<Transport> bigger = admit_spares(t, std::stoi(mode.substr(5)), r);
  cases_on(*bigger, which, "join", r);
}

void joined(Transport& t, const Admission& a, const std::string& which) {
  std::printf("JOINED rank %d of %d (round %d, %d joined to %d, tag %llu)\n", t.rank(), t.num_ranks(), a.round, a.joined,
              a.old_num_ranks, static_cast<unsigned long long>(a.tag));
  std::fflush(stdout);
  if (a.new_rank != t.rank() || a.old_num_ranks + a.joined != t.num_ranks() || a.tag != 7) fail(t.rank(), "joined_admission");
  cases_on(t, which, "join", t.rank());
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
  const RankOptions o(argc, argv, {"--cases", "--timeout-ms", "--fault", "--ping", "--join"}, {"--bytes", "--hierarchical-count"});
  const std::string which = o.value("--cases", "all"), fault = o.value("--fault", ""), join_mode = o.value("--join", "");
  const bool bytes = o.has("--bytes"), hier = o.has("--hierarchical-count");
  const int pings = std::stoi(o.value("--ping", "0"));
  auto boot = shmem_bootstrap();
  const NodeMap nodes = discover_nodes(*boot);
  auto t = connect_shmem(*boot, o.timeout());  // a spare PE returns once admitted (or never)
  const int r = t->rank();
  if (const Admission* a = joined_admission()) return joined(*t, *a, which), 0;
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
    else if (fault.rfind("own-error:", 0) == 0) own_error(*t, std::stoi(fault.substr(10)));
    else if (fault.rfind("heal:", 0) == 0) return heal(*t, nodes, std::stoi(fault.substr(5)), which, 0), 0;
    else throw std::invalid_argument("unknown fault " + fault);
  }
  if (!join_mode.empty()) return join(*t, nodes, join_mode, which), 0;
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
