#include "p2p_peers.hpp"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "epx/launch.hpp"
#include "process.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

namespace {

constexpr const char* kMpiHint = "install with apt-get install libopenmpi-dev openmpi-bin and rebuild";

std::string join(const std::vector<std::uint64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

/// The peer program's command line (empty + why_not when it cannot run).
std::vector<std::string> peer_command(const P2PCommon& c, const std::string& peer, int ranks, PeerRun& run) {
  std::string tried;
  if (peer == "mpi") {
    const std::string mpirun = c.mpirun.empty() ? on_path("mpirun") : c.mpirun;
    const std::string bin = find_program_near_epx("epx_mpi_p2p_baseline", tried);
    if (mpirun.empty() || !executable(mpirun)) run.why_not = std::string("no mpirun; ") + kMpiHint;
    else if (bin.empty()) run.why_not = "epx_mpi_p2p_baseline was not built (looked in " + tried + "); " + kMpiHint;
    if (!run.why_not.empty()) return {};
    std::vector<std::string> argv = {mpirun};
    if (geteuid() == 0) argv.push_back("--allow-run-as-root");
    for (const char* a : {"--oversubscribe", "--mca", "btl", "self,vader", "-np"}) argv.push_back(a);
    argv.push_back(std::to_string(ranks));
    argv.push_back(bin);
    return argv;
  }
  const std::string python = c.python.empty() ? "/usr/bin/python3" : c.python;
  const std::string script = find_program_near_epx("gloo_p2p_baseline.py", tried);
  if (!executable(python)) run.why_not = python + " is not an executable (--peer-python)";
  else if (script.empty()) run.why_not = "gloo_p2p_baseline.py was not found (looked in " + tried + ")";
  if (!run.why_not.empty()) return {};
  return {python, script, "--ranks", std::to_string(ranks)};
}

}  // namespace

nlohmann::json run_peer(const P2PCommon& c, const std::string& peer, int ranks, const std::vector<std::string>& args,
                        const fs::path& dir, PeerRun& run) {
  run.name = peer;
  std::vector<std::string> argv = peer_command(c, peer, ranks, run);
  if (argv.empty()) return nullptr;
  const fs::path json = dir / (peer + "_peer.json"), log = dir / (peer + "_peer.log");
  for (const std::string& a : args) argv.push_back(a);
  for (const std::string& a : {std::string("--iters"), std::to_string(c.iters), std::string("--warmup"),
                               std::to_string(c.warmup), std::string("--json"), json.string()})
    argv.push_back(a);
  for (const std::string& a : argv) run.command += (run.command.empty() ? "" : " ") + shell_quote(a);
  if (c.progress) std::fprintf(stderr, "epx bench: running the %s peer ...\n", peer.c_str());
  const std::string failed = run_process(argv, log, std::chrono::seconds(1800));
  if (!failed.empty()) {
    run.why_not = peer + " peer failed (" + failed + "): " + tail_of(log, 600);
    return nullptr;
  }
  try {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(json));
    run.ran = true;
    return j;
  } catch (const std::exception& e) {
    run.why_not = std::string("cannot read the peer's JSON: ") + e.what();
    return nullptr;
  }
}

namespace {

/// Compares the peer's per-rank hashes ("0x%016x") with epx's.
void verify(PeerRun& run, const nlohmann::json& hashes, const std::vector<std::uint64_t>& epx, const std::string& what) {
  std::string diffs;
  int bad = 0;
  for (std::size_t r = 0; r < epx.size(); ++r) {
    const std::uint64_t h = r < hashes.size() ? std::stoull(hashes[r].get<std::string>(), nullptr, 16) : ~std::uint64_t{0};
    if (h != epx[r] && ++bad <= 3) diffs += (diffs.empty() ? "rank " : ", rank ") + std::to_string(r);
  }
  run.verified = bad == 0;
  run.verify_detail = bad == 0 ? "the same " + what + " as epx on every rank"
                               : std::to_string(bad) + " rank(s) differ from epx: " + diffs;
}

std::vector<double> samples(const nlohmann::json& j) { return j.get<std::vector<double>>(); }

}  // namespace

void merge_samples(nlohmann::json& into, const nlohmann::json& more) {
  if (into.is_null()) {
    into = more;
    return;
  }
  if (into.is_boolean() && more.is_boolean()) {
    into = into.get<bool>() && more.get<bool>();  // "correct" in every round
  } else if (into.is_array() && !into.empty() && into[0].is_number() && more.is_array()) {
    for (const auto& x : more) into.push_back(x);
  } else if (into.is_array() && more.is_array()) {
    for (std::size_t i = 0; i < into.size() && i < more.size(); ++i) merge_samples(into[i], more[i]);
  } else if (into.is_object() && more.is_object()) {
    for (auto it = into.begin(); it != into.end(); ++it)
      if (more.contains(it.key())) merge_samples(it.value(), more[it.key()]);
  }
}

std::vector<PeerRun> run_rounds(const P2PCommon& c, int ranks, const std::vector<std::string>& peer_args,
                                const std::function<std::string(Transport&)>& rank_record, const std::string& no_peers,
                                std::vector<nlohmann::json>& records, std::vector<nlohmann::json>& peer_json) {
  TempDir tmp;
  LaunchOptions lo;
  lo.num_ranks = ranks;
  lo.transport = parse_transport_kind(c.transport);
  lo.timeout = checked_timeout(c.timeout_ms);
  records.assign(static_cast<std::size_t>(ranks), nullptr);
  peer_json.assign(c.peers.size(), nullptr);
  std::vector<PeerRun> runs(c.peers.size());
  auto record_of = [&](int r) { return tmp.path() / ("rank" + std::to_string(r) + ".json"); };
  for (int round = 0; round < c.rounds; ++round) {
    launch(lo, [&](Transport& t) { std::ofstream(record_of(t.rank())) << rank_record(t); });
    for (int r = 0; r < ranks; ++r) {
      std::ifstream in(record_of(r));
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      merge_samples(records[static_cast<std::size_t>(r)], nlohmann::json::parse(text));
    }
    for (std::size_t i = 0; i < c.peers.size(); ++i) {
      if (c.peers[i] == "none" || (round > 0 && !runs[i].ran)) continue;
      PeerRun run;
      if (!no_peers.empty()) run.name = c.peers[i], run.why_not = no_peers;
      else merge_samples(peer_json[i], run_peer(c, c.peers[i], ranks, peer_args, tmp.path(), run));
      if (round == 0 || !run.ran) runs[i] = run;
    }
  }
  return runs;
}

std::vector<std::string> pp_peer_args(const PPBenchOptions& o) {
  return {"--op", "pp", "--sizes", join(o.sizes), "--pattern", o.pattern, "--messages", std::to_string(o.messages)};
}

std::vector<std::string> engram_peer_args(const EngramBenchOptions& o) {
  return {"--op",     "engram", "--layers", std::to_string(o.layers),  "--rows",    std::to_string(o.rows),
          "--hidden", std::to_string(o.hidden), "--tokens", std::to_string(o.tokens), "--entries", std::to_string(o.entries),
          "--seed",   std::to_string(o.seed)};
}

void attach_pp_peer(PeerRun run, const nlohmann::json& j, PPBenchReport& rep) {
  for (std::size_t si = 0; si < rep.sizes.size(); ++si) {
    PPSizeResult& s = rep.sizes[si];
    if (!run.ran) {
      s.peer_stream_us.emplace_back();
      s.peer_pair_latency_us.emplace_back();
      continue;
    }
    const nlohmann::json& r = j.at("results").at(si);
    s.peer_stream_us.push_back(summarize(samples(r.at("stream_us"))));
    std::vector<Summary> lat;
    for (const auto& p : r.at("pair_latency_us")) lat.push_back(summarize(samples(p)));
    s.peer_pair_latency_us.push_back(lat);
  }
  if (run.ran) {
    run.verified = true;
    for (std::size_t si = 0; si < rep.sizes.size() && run.verified; ++si)
      verify(run, j.at("results").at(si).at("hash"), rep.sizes[si].hashes, "last message of every size");
  }
  rep.peers.push_back(std::move(run));
}

void attach_engram_peer(PeerRun run, const nlohmann::json& j, EngramBenchReport& rep) {
  if (run.ran) {
    rep.peer_us.push_back(summarize(samples(j.at("max_rank_us"))));
    verify(run, j.at("hash"), rep.hashes, "rows");
  } else {
    rep.peer_us.emplace_back();
  }
  rep.peers.push_back(std::move(run));
}

}  // namespace epx::tools
