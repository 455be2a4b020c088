// epx bench --op pp: the ranks' timed loops (epx/bench/p2p.hpp says what is timed), then the
// peers (p2p_peers.cpp) and the aggregation.
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "epx/bench/p2p.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/pp.hpp"
#include "p2p_data.hpp"
#include "p2p_peers.hpp"

namespace epx::tools {

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

/// This rank's peers in the stream: the one it sends to and the one it receives from (-1: none).
struct StreamPeers {
  int dst = -1, src = -1;
};

StreamPeers stream_peers(const std::string& pattern, int me, int P) {
  if (pattern == "ring") return {(me + 1) % P, (me + P - 1) % P};
  return me % 2 == 0 ? StreamPeers{me + 1, -1} : StreamPeers{-1, me - 1};
}

struct RankLoop {
  Transport& t;
  const PPBenchOptions& o;
  StreamPeers peers;
  std::vector<std::uint8_t> msg, out;

  TensorView send_view(std::uint64_t n) const { return TensorView(msg.data(), DType::kFP8E4M3, {static_cast<std::int64_t>(n)}); }

  /// A 0-byte "go" from each receiver to its sender, after the barrier: a rank leaving the
  /// barrier late does not count against the stream (the go's own trip does, once).
  void go(PPBuffer& pp) {
    const TensorView none(msg.data(), DType::kFP8E4M3, {0});
    const MutableView into{out.data(), DType::kFP8E4M3, {0}};
    if (peers.src >= 0) pp.send(none, peers.src);
    if (peers.dst >= 0) pp.recv(into, peers.dst);
  }

  /// How a receiver takes its messages: into its own tensor (recv), as slot views
  /// (recv_view + release), into a tensor planned in the buffer's window (recv, one copy).
  enum class Into { kTensor, kView, kPlanned };

  /// The receive tensor of n bytes: `out`, or the start of the planned tensor "recv".
  MutableView into_of(PPBuffer& pp, std::uint64_t n, bool planned) {
    void* at = planned ? pp.tensor("recv").data : out.data();
    return MutableView{at, DType::kFP8E4M3, {static_cast<std::int64_t>(n)}};
  }

  /// One stream iteration: this rank's time per message as a receiver (0 if it receives none),
  /// from its go to the last message.
  double stream(PPBuffer& pp, std::uint64_t n, Into how) {
    t.barrier("pp bench stream");
    const auto t0 = Clock::now();
    go(pp);
    for (int m = 0; m < o.messages; ++m) {
      if (peers.dst >= 0) pp.send(send_view(n), peers.dst);
      if (peers.src < 0) continue;
      if (how == Into::kView) {
        PPView v = pp.recv_view(peers.src);
        pp.release(v);
      } else {
        pp.recv(into_of(pp, n, how == Into::kPlanned), peers.src);
      }
    }
    return peers.src >= 0 ? us_since(t0) / o.messages : 0.0;
  }

  /// One ping-pong iteration between 2k and 2k+1, after one untimed round trip: the one-way
  /// time on 2k (0 elsewhere).
  double pingpong(PPBuffer& pp, std::uint64_t n, bool planned) {
    constexpr int kRounds = 8;
    const int me = t.rank(), peer = me % 2 == 0 ? me + 1 : me - 1;
    const MutableView into = into_of(pp, n, planned);
    auto round = [&] {
      if (me % 2 == 0) pp.send(send_view(n), peer), pp.recv(into, peer);
      else pp.recv(into, peer), pp.send(send_view(n), peer);
    };
    t.barrier("pp bench ping-pong");
    round();
    const auto t0 = Clock::now();
    for (int k = 0; k < kRounds; ++k) round();
    return me % 2 == 0 ? us_since(t0) / (2 * kRounds) : 0.0;
  }

  /// The measurement plane: `messages` copies of n bytes, per copy.
  double copy(std::uint64_t n) {
    t.barrier("pp bench copy");
    const auto t0 = Clock::now();
    for (int m = 0; m < o.messages; ++m) std::memcpy(out.data(), msg.data(), n);
    return us_since(t0) / o.messages;
  }
};

std::vector<std::pair<int, int>> links_of(const std::string& pattern, int P) {
  return pattern == "ring" ? pp_ring_links(P) : pp_chain_links(P, 2);
}

}  // namespace

std::string run_pp_rank(Transport& t, const PPBenchOptions& o) {
  const int me = t.rank(), P = t.num_ranks();
  std::uint64_t largest = 0;
  for (auto s : o.sizes) largest = std::max(largest, s);
  RankLoop loop{t, o, stream_peers(o.pattern, me, P), std::vector<std::uint8_t>(largest), std::vector<std::uint8_t>(largest)};
  nlohmann::json rec = nlohmann::json::array();
  for (std::uint64_t n : o.sizes) rec.push_back({{"bytes", n}});
  using Into = RankLoop::Into;
  BufferAllocator plan;  // the planned receive tensor
  plan.allocate("recv", {static_cast<std::int64_t>(largest)}, DType::kFP8E4M3);
  for (std::size_t ki = 0; ki < o.inflight.size(); ++ki) {
    PPBuffer pp(t, {.num_max_tensor_bytes = largest, .num_max_inflight_tensors = o.inflight[ki], .links = links_of(o.pattern, P)},
                plan);
    for (std::size_t si = 0; si < o.sizes.size(); ++si) {
      const std::uint64_t n = o.sizes[si];
      epx_p2p_data::fill_message(me, n, loop.msg.data());
      std::vector<double> stream, view, planned, copy, lat, lat_planned;
      for (int i = 0; i < o.common.warmup + o.common.iters; ++i) {
        const double s = loop.stream(pp, n, Into::kTensor), v = loop.stream(pp, n, Into::kView);
        const double d = loop.stream(pp, n, Into::kPlanned);
        const double c = ki == 0 ? loop.copy(n) : 0.0, l = ki == 0 ? loop.pingpong(pp, n, false) : 0.0;
        const double lp = ki == 0 ? loop.pingpong(pp, n, true) : 0.0;
        if (i < o.common.warmup) continue;
        stream.push_back(s), view.push_back(v), planned.push_back(d), copy.push_back(c), lat.push_back(l);
        lat_planned.push_back(lp);
      }
      nlohmann::json& r = rec[si];
      r["stream"][std::to_string(o.inflight[ki])] = stream;
      r["view"][std::to_string(o.inflight[ki])] = view;
      r["planned"][std::to_string(o.inflight[ki])] = planned;
      if (ki > 0) continue;
      r["copy"] = copy;
      r["latency"] = lat;
      r["latency_planned"] = lat_planned;
      std::vector<std::uint8_t> want(n);
      if (loop.peers.src >= 0) epx_p2p_data::fill_message(loop.peers.src, n, want.data());
      loop.stream(pp, n, Into::kPlanned);  // the checked messages: the last of a stream, planned ...
      const bool planned_ok = loop.peers.src < 0 || std::memcmp(want.data(), pp.tensor("recv").data, n) == 0;
      loop.stream(pp, n, Into::kTensor);  // ... and into the rank's own tensor
      if (loop.peers.src < 0) continue;
      r["hash"] = epx_p2p_data::check_hash(loop.out.data(), n);
      r["correct"] = planned_ok && std::memcmp(want.data(), loop.out.data(), n) == 0;
    }
    pp.destroy();
  }
  return rec.dump();
}

namespace {

/// Per iteration, the max over ranks of rec[r][key] (a sample list or a map of them).
Summary max_rank(const std::vector<nlohmann::json>& recs, std::size_t si, const std::string& key, const std::string& sub = "") {
  std::vector<std::vector<double>> series;
  for (const auto& r : recs) {
    const nlohmann::json& v = sub.empty() ? r[si][key] : r[si][key][sub];
    series.push_back(v.get<std::vector<double>>());
  }
  return summarize(max_over(series));
}

}  // namespace

PPBenchReport aggregate_pp(const PPBenchOptions& o, const std::vector<std::string>& records) {
  PPBenchReport rep;
  rep.options = o;
  rep.ranks = static_cast<int>(records.size());
  std::vector<nlohmann::json> recs;
  for (const std::string& r : records) recs.push_back(nlohmann::json::parse(r));
  for (std::size_t si = 0; si < o.sizes.size(); ++si) {
    PPSizeResult s;
    s.bytes = o.sizes[si];
    for (int k : o.inflight) {
      s.inflight.push_back(k);
      s.stream_us.push_back(max_rank(recs, si, "stream", std::to_string(k)));
      s.view_us.push_back(max_rank(recs, si, "view", std::to_string(k)));
      s.planned_us.push_back(max_rank(recs, si, "planned", std::to_string(k)));
    }
    s.copy_us = max_rank(recs, si, "copy");
    for (int p = 0; p + 1 < rep.ranks; p += 2) {
      const nlohmann::json& r = recs[static_cast<std::size_t>(p)][si];
      s.pair_latency_us.push_back(summarize(r["latency"].get<std::vector<double>>()));
      s.pair_latency_planned_us.push_back(summarize(r["latency_planned"].get<std::vector<double>>()));
    }
    s.correct = true;
    for (const auto& r : recs) {
      s.hashes.push_back(r[si].value("hash", std::uint64_t{0}));
      if (r[si].contains("correct")) s.correct = s.correct && r[si]["correct"].get<bool>();
    }
    rep.sizes.push_back(std::move(s));
  }
  return rep;
}

void check_pp_options(const PPBenchOptions& o, int ranks) {
  if (o.pattern != "pairs" && o.pattern != "ring")
    throw Error(ErrorCode::kInvalidArgument, "--pp-pattern " + o.pattern + ": expected pairs or ring");
  if (ranks < 2 || ranks % 2 != 0)
    throw Error(ErrorCode::kInvalidArgument, "--op pp needs an even number of ranks >= 2, got " + std::to_string(ranks));
  if (o.sizes.empty() || o.inflight.empty() || o.messages < 1 || o.common.iters < 1 || o.common.warmup < 0 ||
      o.common.rounds < 1)
    throw Error(ErrorCode::kInvalidArgument, "--op pp: --pp-sizes, --pp-inflight, --pp-messages and --iters need values >= 1");
  for (auto s : o.sizes)
    if (s < 1 || s > (std::uint64_t{1} << 31) - 1)
      throw Error(ErrorCode::kInvalidArgument, "--pp-sizes: " + std::to_string(s) + " is outside 1 .. 2^31-1 bytes");
  for (int k : o.inflight)
    if (k < 1 || k > kMaxPPInflight)
      throw Error(ErrorCode::kInvalidArgument, "--pp-inflight: " + std::to_string(k) + " is outside 1..64");
}

PPBenchReport measure_pp(const PPBenchOptions& o) {
  const auto wall0 = Clock::now();
  const int ranks = o.common.ranks > 0 ? o.common.ranks : 8;
  check_pp_options(o, ranks);
  if (o.common.progress)
    std::fprintf(stderr, "epx bench: pp on %d %s ranks, %d round(s) ...\n", ranks, o.common.transport.c_str(), o.common.rounds);
  std::vector<nlohmann::json> records, peer_json;
  const std::vector<PeerRun> peer_runs = run_rounds(o.common, ranks, pp_peer_args(o), [&](Transport& t) { return run_pp_rank(t, o); },
                                                    "", records, peer_json);
  std::vector<std::string> texts;
  for (const auto& r : records) texts.push_back(r.dump());
  PPBenchReport rep = aggregate_pp(o, texts);
  for (std::size_t i = 0; i < o.common.peers.size(); ++i)
    if (o.common.peers[i] != "none") attach_pp_peer(peer_runs[i], peer_json[i], rep);
  rep.wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
  return rep;
}

int p2p_status(const std::vector<PeerRun>& peers, bool epx_correct) {
  if (!epx_correct) return 3;
  for (const PeerRun& p : peers)
    if (p.ran && !p.verified) return 3;
  return 0;
}

}  // namespace epx::tools
