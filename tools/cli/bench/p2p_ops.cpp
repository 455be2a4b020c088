#include "bench/p2p_ops.hpp"

#include <string>

#include "bench/output.hpp"
#include "epx/bench/p2p.hpp"

namespace epx::tools {

void add_p2p_options(CLI::App* sub, BenchOptions& o) {
  sub->add_option("--pp-pattern", o.pp_pattern, "--op pp: pairs (rank 2k sends to 2k+1) | ring (r to r+1)")->capture_default_str();
  sub->add_option("--pp-sizes", o.pp_sizes, "--op pp: message bytes (default 16384 262144 4194304 58720256 67108864)")
      ->delimiter(',');
  sub->add_option("--pp-inflight", o.pp_inflight, "--op pp: slots per pair to time (default 1,2,3)")->delimiter(',');
  sub->add_option("--pp-messages", o.pp_messages, "--op pp: messages per link per timed iteration")->capture_default_str();
  sub->add_option("--engram-layers", o.engram_layers, "--op engram: layers L")->capture_default_str();
  sub->add_option("--engram-rows", o.engram_rows, "--op engram: rows per rank per layer N_l")->capture_default_str();
  sub->add_option("--engram-hidden", o.engram_hidden, "--op engram: H of a row")->capture_default_str();
  sub->add_option("--engram-entries", o.engram_entries, "--op engram: rows per token E' (--tokens T tokens)")->capture_default_str();
  sub->add_flag("--engram-fp8", o.engram_fp8, "--op engram: FP8 rows with float32 scales (the peers then do not run)");
  sub->add_option("--peers", o.peers, "--op pp|engram: peers run in the same invocation: mpi,gloo | mpi | gloo | none")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--peer-rounds", o.peer_rounds,
                  "--op pp|engram: run epx and the peers this many times in turns, their samples pooled")
      ->capture_default_str();
  sub->add_option("--peer-python", o.peer_python, "--op pp|engram: python3 of the gloo peer (default /usr/bin/python3)")
      ->type_name("PATH");
}

namespace {

P2PCommon common_of(const BenchOptions& o) {
  P2PCommon c;
  c.ranks = o.ranks;
  c.transport = o.transport;
  c.warmup = o.warmup;
  c.iters = o.iters;
  c.timeout_ms = o.timeout_ms;
  c.progress = o.progress;
  c.peers = o.peers;
  c.mpirun = o.mpirun;
  c.python = o.peer_python;
  c.rounds = o.peer_rounds;
  return c;
}

std::string size_text(std::uint64_t b) {
  char buf[32];
  if (b >= (1u << 20) && b % (1u << 20) == 0) std::snprintf(buf, sizeof buf, "%llu MiB", static_cast<unsigned long long>(b >> 20));
  else if (b >= 1024 && b % 1024 == 0) std::snprintf(buf, sizeof buf, "%llu KiB", static_cast<unsigned long long>(b >> 10));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

void print_peers(const std::vector<PeerRun>& peers, std::FILE* out) {
  for (const PeerRun& p : peers) {
    if (!p.ran) std::fprintf(out, "  %s: did not run: %s\n", p.name.c_str(), p.why_not.c_str());
    else std::fprintf(out, "  %s: %s: %s\n    %s\n", p.name.c_str(), p.verified ? "checked" : "DIFFERS", p.verify_detail.c_str(), p.command.c_str());
  }
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// The one-way latency lines of --op pp: epx's per pair, each peer's and their ratios.
void print_pp_latency(const PPBenchReport& r, std::FILE* out) {
  std::fprintf(out, "latency, one-way (ping-pong / 2), p50 us per pair (2k, 2k+1):\n");
  for (const PPSizeResult& s : r.sizes) {
    std::fprintf(out, "  %-9s epx", size_text(s.bytes).c_str());
    for (const Summary& l : s.pair_latency_us) std::fprintf(out, " %.1f", l.p50);
    for (std::size_t i = 0; i < r.peers.size(); ++i) {
      if (!r.peers[i].ran) continue;
      std::fprintf(out, " | %s", r.peers[i].name.c_str());
      double sum_ratio = 0;
      for (std::size_t p = 0; p < s.peer_pair_latency_us[i].size(); ++p) {
        std::fprintf(out, " %.1f", s.peer_pair_latency_us[i][p].p50);
        sum_ratio += ratio(s.peer_pair_latency_us[i][p].p50, s.pair_latency_us[p].p50);
      }
      if (!s.peer_pair_latency_us[i].empty())
        std::fprintf(out, " (%.2fx epx)", sum_ratio / static_cast<double>(s.peer_pair_latency_us[i].size()));
    }
    std::fprintf(out, "\n  %-9s epx planned", size_text(s.bytes).c_str());
    for (const Summary& l : s.pair_latency_planned_us) std::fprintf(out, " %.1f", l.p50);
    for (std::size_t i = 0; i < r.peers.size(); ++i) {
      if (!r.peers[i].ran || s.peer_pair_latency_us[i].empty()) continue;
      double sum_ratio = 0;
      for (std::size_t p = 0; p < s.peer_pair_latency_us[i].size(); ++p)
        sum_ratio += ratio(s.peer_pair_latency_us[i][p].p50, s.pair_latency_planned_us[p].p50);
      std::fprintf(out, " | %s %.2fx", r.peers[i].name.c_str(), sum_ratio / static_cast<double>(s.peer_pair_latency_us[i].size()));
    }
    std::fprintf(out, "\n");
  }
}

void print_pp(const PPBenchReport& r, std::FILE* out) {
  const PPBenchOptions& o = r.options;
  std::fprintf(out, "epx bench --op pp: %d %s ranks, %s, %d messages per link per iteration, %d timed iterations x %d "
               "round(s) (p50, us per message)\n", r.ranks, o.common.transport.c_str(),
               o.pattern == "ring" ? "one ring" : "pipelines of 2 (2k -> 2k+1)", o.messages, o.common.iters, o.common.rounds);
  std::fprintf(out, "%-9s %3s %11s %11s %11s %11s", "size", "k", "epx recv", "epx view", "epx planned", "copy");
  for (const PeerRun& p : r.peers) std::fprintf(out, " %11s", p.name.c_str());
  for (const PeerRun& p : r.peers) std::fprintf(out, " %9s", (p.name + "/epx").c_str());
  std::fprintf(out, " %9s\n", "copy/epx");
  for (const PPSizeResult& s : r.sizes)
    for (std::size_t k = 0; k < s.inflight.size(); ++k) {
      const double e = s.stream_us[k].p50;
      std::fprintf(out, "%-9s %3d %11.1f %11.1f %11.1f %11.1f", size_text(s.bytes).c_str(), s.inflight[k], e, s.view_us[k].p50,
                   s.planned_us[k].p50, s.copy_us.p50);
      for (std::size_t i = 0; i < r.peers.size(); ++i)
        if (r.peers[i].ran) std::fprintf(out, " %11.1f", s.peer_stream_us[i].p50);
        else std::fprintf(out, " %11s", "-");
      for (std::size_t i = 0; i < r.peers.size(); ++i)
        if (r.peers[i].ran) std::fprintf(out, " %8.2fx", ratio(s.peer_stream_us[i].p50, e));
        else std::fprintf(out, " %9s", "-");
      std::fprintf(out, " %8.2fx\n", ratio(s.copy_us.p50, e));
    }
  std::fprintf(out, "(peer/epx: to epx recv into the rank's own tensor; to epx view and planned:");
  for (const PPSizeResult& s : r.sizes)
    for (std::size_t k = 0; k < s.inflight.size(); ++k)
      for (std::size_t i = 0; i < r.peers.size(); ++i)
        if (r.peers[i].ran)
          std::fprintf(out, " %s k%d %s %.2fx / %.2fx;", size_text(s.bytes).c_str(), s.inflight[k], r.peers[i].name.c_str(),
                       ratio(s.peer_stream_us[i].p50, s.view_us[k].p50), ratio(s.peer_stream_us[i].p50, s.planned_us[k].p50));
  std::fprintf(out, ")\n");
  print_pp_latency(r, out);
  bool ok = true;
  for (const PPSizeResult& s : r.sizes) ok = ok && s.correct;
  std::fprintf(out, "check: epx %s\n", ok ? "delivered every receiver's last message of every size bit for bit" : "DELIVERED WRONG BYTES");
  print_peers(r.peers, out);
  std::fprintf(out, "wall %.1f s\n", r.wall_s);
}

nlohmann::ordered_json peers_json(const std::vector<PeerRun>& peers) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const PeerRun& p : peers)
    a.push_back({{"name", p.name}, {"ran", p.ran}, {"why_not", p.why_not}, {"command", p.command},
                 {"verified", p.verified}, {"verify_detail", p.verify_detail}});
  return a;
}

nlohmann::ordered_json pp_json(const PPBenchReport& r) {
  nlohmann::ordered_json j = {{"op", "pp"}, {"ranks", r.ranks}, {"transport", r.options.common.transport},
                              {"pattern", r.options.pattern}, {"messages", r.options.messages}, {"iters", r.options.common.iters}};
  for (const PPSizeResult& s : r.sizes) {
    nlohmann::ordered_json e = {{"bytes", s.bytes}, {"correct", s.correct}, {"copy_us", summary_json(s.copy_us)}};
    for (std::size_t k = 0; k < s.inflight.size(); ++k)
      e["epx"].push_back({{"inflight", s.inflight[k]}, {"recv_us", summary_json(s.stream_us[k])}, {"view_us", summary_json(s.view_us[k])},
                          {"planned_us", summary_json(s.planned_us[k])}});
    for (const Summary& l : s.pair_latency_us) e["pair_latency_us"].push_back(summary_json(l));
    for (const Summary& l : s.pair_latency_planned_us) e["pair_latency_planned_us"].push_back(summary_json(l));
    for (std::size_t i = 0; i < r.peers.size(); ++i) {
      nlohmann::ordered_json p = {{"name", r.peers[i].name}, {"stream_us", summary_json(s.peer_stream_us[i])}};
      for (const Summary& l : s.peer_pair_latency_us[i]) p["pair_latency_us"].push_back(summary_json(l));
      e["peers"].push_back(p);
    }
    j["sizes"].push_back(e);
  }
  j["peers"] = peers_json(r.peers);
  j["wall_s"] = r.wall_s;
  return j;
}

void print_engram(const EngramBenchReport& r, std::FILE* out) {
  const EngramBenchOptions& o = r.options;
  const double total_rows = static_cast<double>(r.rows_per_rank) * r.ranks;
  std::fprintf(out, "epx bench --op engram: %d %s ranks, %d layers x %lld rows per rank, H = %d %s, %lld tokens x %d entries, "
               "uniform random rows; %d timed iterations x %d round(s) (p50 of the slowest rank)\n", r.ranks,
               o.common.transport.c_str(), o.layers, static_cast<long long>(o.rows), o.hidden, o.fp8 ? "fp8" : "bf16",
               static_cast<long long>(o.tokens), o.entries, o.common.iters, o.common.rounds);
  std::fprintf(out, "  epx (%s): fetch + hooks %.1f us, %.3g rows/s, %.2f GB/s per rank; local-row hit rate %.3f\n",
               r.path.c_str(), r.fetch_us.p50, ratio(total_rows, r.fetch_us.p50 * 1e-6),
               ratio(static_cast<double>(r.bytes_per_rank), r.fetch_us.p50 * 1e3), r.local_hit_rate);
  std::fprintf(out, "  copy (a memcpy of the same %.1f MiB on every rank at once): %.1f us, %.2f GB/s per rank; epx/copy bandwidth %.2fx\n",
               static_cast<double>(r.bytes_per_rank) / (1 << 20), r.copy_us.p50,
               ratio(static_cast<double>(r.bytes_per_rank), r.copy_us.p50 * 1e3), ratio(r.copy_us.p50, r.fetch_us.p50));
  for (std::size_t i = 0; i < r.peers.size(); ++i)
    if (r.peers[i].ran)
      std::fprintf(out, "  %s: %.1f us, %.3g rows/s; epx rows/s %.2fx %s's\n", r.peers[i].name.c_str(), r.peer_us[i].p50,
                   ratio(total_rows, r.peer_us[i].p50 * 1e-6), ratio(r.peer_us[i].p50, r.fetch_us.p50), r.peers[i].name.c_str());
  std::fprintf(out, "check: epx %s\n", r.correct ? "fetched every row of every rank bit for bit" : "FETCHED WRONG ROWS");
  print_peers(r.peers, out);
  std::fprintf(out, "wall %.1f s\n", r.wall_s);
}

nlohmann::ordered_json engram_json(const EngramBenchReport& r) {
  const EngramBenchOptions& o = r.options;
  nlohmann::ordered_json j = {{"op", "engram"}, {"ranks", r.ranks}, {"transport", o.common.transport}, {"layers", o.layers},
                              {"rows", o.rows}, {"hidden", o.hidden}, {"fp8", o.fp8}, {"tokens", o.tokens},
                              {"entries", o.entries}, {"path", r.path}, {"rows_per_rank", r.rows_per_rank},
                              {"bytes_per_rank", r.bytes_per_rank}, {"local_hit_rate", r.local_hit_rate},
                              {"correct", r.correct}, {"fetch_us", summary_json(r.fetch_us)}, {"copy_us", summary_json(r.copy_us)}};
  for (std::size_t i = 0; i < r.peers.size(); ++i) j["peer_us"][r.peers[i].name] = summary_json(r.peer_us[i]);
  j["peers"] = peers_json(r.peers);
  j["wall_s"] = r.wall_s;
  return j;
}

}  // namespace

int run_pp_op(const BenchOptions& o, std::FILE* out) {
  PPBenchOptions p;
  p.common = common_of(o);
  p.pattern = o.pp_pattern;
  if (!o.pp_sizes.empty()) p.sizes = o.pp_sizes;
  if (!o.pp_inflight.empty()) p.inflight = o.pp_inflight;
  p.messages = o.pp_messages;
  PPBenchReport r;
  if (o.transport == "shmem") {
    auto m = measure_pp_shmem(p);
    if (!m.root) return 0;
    std::fprintf(out, "%s\n", m.node_layout.c_str());
    r = std::move(m.report);
  } else {
    r = measure_pp(p);
  }
  print_pp(r, out);
  if (!o.json.empty()) write_json_file(o.json, pp_json(r));
  bool ok = true;
  for (const PPSizeResult& s : r.sizes) ok = ok && s.correct;
  return p2p_status(r.peers, ok);
}

int run_engram_op(const BenchOptions& o, std::FILE* out) {
  EngramBenchOptions e;
  e.common = common_of(o);
  e.layers = o.engram_layers;
  e.rows = o.engram_rows;
  e.hidden = o.engram_hidden;
  e.fp8 = o.engram_fp8;
  e.tokens = o.tokens;
  e.entries = o.engram_entries;
  e.seed = o.seed;
  EngramBenchReport r;
  if (o.transport == "shmem") {
    auto m = measure_engram_shmem(e);
    if (!m.root) return 0;
    std::fprintf(out, "%s\n", m.node_layout.c_str());
    r = std::move(m.report);
  } else {
    r = measure_engram(e);
  }
  print_engram(r, out);
  if (!o.json.empty()) write_json_file(o.json, engram_json(r));
  return p2p_status(r.peers, r.correct);
}

}  // namespace epx::tools
