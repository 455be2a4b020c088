#include "epx/sim/runner/ledger.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "epx/bench/progress.hpp"
#include "epx/error.hpp"

namespace epx::tools {

double expected_unique_ranks(int ranks, int topk) {
  const double R = ranks;
  return R * (1 - std::pow(1 - 1 / R, topk));
}

double expected_unique_ranks_distinct(int ranks, int experts, int topk) {
  const double E = experts, L = static_cast<double>(experts) / ranks;
  double miss = 1;  // none of the k distinct experts on a given rank
  for (int i = 0; i < topk; ++i) miss *= (E - L - i) / (E - i);
  return ranks * (1 - miss);
}

double dispatch_row_bytes(int hidden, int topk, bool fp8) {
  const double H = hidden, K = topk;
  return (fp8 ? H + H / 128 * 4 : 2 * H) + K * 8 + K * 4;
}

double combine_row_bytes(int hidden) { return 2.0 * hidden; }

namespace {

// The measured columns: what the engine's counters saw, per token and per rank.
void measure_bytes(LedgerRow& row, const SimRun& run, int P, double S) {
  const double R = P;
  double recv = 0, d_remote = 0, d_local = 0, c_remote = 0, c_local = 0;
  for (int r = 0; r < P; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    recv += static_cast<double>(run.engine_recv_rows[ur]);
    d_remote += static_cast<double>(run.dispatch_counters[ur].bytes);
    d_local += static_cast<double>(run.dispatch_counters[ur].local_bytes);
    c_remote += static_cast<double>(run.combine_counters[ur].bytes);
    c_local += static_cast<double>(run.combine_counters[ur].local_bytes);
  }
  const double all_tokens = S * R;
  row.unique_measured = recv / all_tokens;
  row.local_fraction_measured = d_local / (d_local + d_remote);
  row.dispatch_token_bytes_measured = (d_remote + d_local) / all_tokens;
  row.combine_token_bytes_measured = (c_remote + c_local) / all_tokens;
  row.layer_rank_bytes_measured = (d_remote + c_remote) / R;
}

// Bytes per rank that crossed servers in the run's dispatch and combine puts (flat schedule).
double cross_server_put_bytes(const SimRun& run, int P) {
  auto server_of = [&](int r) { return run.topology.ranks[static_cast<std::size_t>(r)].server; };
  double cross = 0;
  for (int call : {run.dispatch_call, run.combine_call}) {
    const sim::PutTable t = sim::summarize_puts(run.trace, call);
    for (int r = 0; r < P; ++r)
      for (int p = 0; p < P; ++p)
        if (server_of(r) != server_of(p))
          for (const sim::PutSummary& q : t[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)])
            cross += static_cast<double>(q.bytes);
  }
  return cross / P;
}

// Hierarchical: (token, other server) pairs counted on the routing the engine ran.
double cross_server_pairs(const SimOptions& o, const SimRun& run, int P) {
  auto server_of = [&](int r) { return run.topology.ranks[static_cast<std::size_t>(r)].server; };
  const BenchProblem problem = sim_problem(o, P);
  const int L = o.experts / P;
  double crossings = 0;
  std::vector<std::int64_t> seen(static_cast<std::size_t>(P), -1);
  for (int s = 0; s < P; ++s) {
    const BenchRankInput& rk = problem.rank[static_cast<std::size_t>(s)];
    for (std::int64_t t = 0; t < rk.tokens; ++t)
      for (int k = 0; k < o.topk; ++k) {
        const std::int64_t e = rk.topk_idx[static_cast<std::size_t>(t * o.topk + k)];
        if (e < 0) continue;
        const int sv = server_of(static_cast<int>(e / L));
        if (sv == server_of(s) || seen[static_cast<std::size_t>(sv)] == t + s * o.tokens) continue;
        seen[static_cast<std::size_t>(sv)] = t + s * o.tokens;
        crossings += 1;
      }
  }
  return crossings;
}

// The server columns: layout of the topology, the expected and measured cross-server bytes.
void server_columns(LedgerRow& row, const SimOptions& o, const SimRun& run, int P, double rd, double rc) {
  std::map<int, int> members;  // server -> ranks
  for (const RankPlace& p : run.topology.ranks) ++members[p.server];
  row.servers = static_cast<int>(members.size());
  row.server_size = row.servers > 0 ? P / row.servers : P;
  if (row.servers <= 1) return;
  for (const auto& [server, n] : members)
    if (n != row.server_size)
      throw Error(ErrorCode::kInvalidArgument, "epx sim ledger: topology '" + run.topology.name + "' has servers of unequal size (server " +
                                                   std::to_string(server) + ": " + std::to_string(n) + " ranks, expected " +
                                                   std::to_string(row.server_size) + ")");
  const double S = static_cast<double>(o.tokens), R = P, K = o.topk;
  const double G = row.server_size, N = row.servers;
  row.cross_flat = S * (R - G) * (1 - std::pow(1 - 1 / R, K)) * (rd + rc);
  row.cross_hier = S * (N - 1) * (1 - std::pow(1 - 1 / N, K)) * (rd + rc);
  row.cross_flat_measured = cross_server_put_bytes(run, P);
  row.cross_hier_routing = cross_server_pairs(o, run, P) * (rd + rc) / R;
}

}  // namespace

std::vector<LedgerRow> ledger(const SimOptions& in) {
  SimOptions o = in;
  o.layout = "compact";  // the layout does not change what travels; compact rows count (token, rank) pairs
  o.collect_stats = true;
  o.steady = o.cached = false;
  o.run_hidden = 0;
  std::vector<LedgerRow> out;
  const double rd = dispatch_row_bytes(o.hidden, o.topk, o.fp8), rc = combine_row_bytes(o.hidden);
  double total = 0, done = 0;  // an EP size's work taken as proportional to its ranks
  for (int P : o.ep) total += P;
  ProgressLine progress("[epx sim ledger]", total, o.progress);
  for (int P : o.ep) {
    progress.update(done, "EP" + std::to_string(P) + ": running the engine on " + std::to_string(P) + " sim ranks");
    const SimRun run = collect_run(o, P);
    done += P;
    if (!run.model_only)  // copy mode runs at a reduced hidden size: its counters would not be this shape's bytes
      throw Error(ErrorCode::kUnsupported, "epx sim ledger: the engine did not announce its payload region on the sim transport "
                                           "(model-only mode); the counters would be of a reduced hidden size");
    const double S = static_cast<double>(o.tokens), R = P;
    LedgerRow row;
    row.ep = P;
    row.tokens = o.tokens;
    row.unique = expected_unique_ranks(P, o.topk);
    row.unique_distinct = expected_unique_ranks_distinct(P, o.experts, o.topk);
    row.local_fraction = 1 / R;
    row.dispatch_token_bytes = row.unique * rd;
    row.combine_token_bytes = row.unique * rc;
    row.layer_rank_bytes = S * row.unique * (1 - 1 / R) * (rd + rc);
    measure_bytes(row, run, P, S);
    server_columns(row, o, run, P, rd, rc);
    out.push_back(row);
  }
  return out;
}

std::string ledger_table(const std::vector<LedgerRow>& rows, const SimOptions& o) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line,
                "epx sim ledger: %lld tokens/rank, H=%d, top-%d of %d, %s dispatch (%.0f B/row: x%s + metadata), bf16 combine "
                "(%.0f B/row)\n",
                static_cast<long long>(o.tokens), o.hidden, o.topk, o.experts, o.fp8 ? "fp8" : "bf16",
                dispatch_row_bytes(o.hidden, o.topk, o.fp8), o.fp8 ? " + scales" : "", combine_row_bytes(o.hidden));
  os << line;
  os << "closed form (uniform routing) | measured (engine counters on the routing it ran, sim transport)\n";
  os << "  EP | unique ranks/token  closed distinct measured | local frac closed measured | dispatch B/token closed measured | "
        "combine B/token closed measured | MB/layer/rank closed measured\n";
  for (const LedgerRow& r : rows) {
    std::snprintf(line, sizeof line, "%4d | %24.3f %8.3f %8.3f | %17.4f %8.4f | %23.0f %8.0f | %22.0f %8.0f | %20.1f %8.1f\n", r.ep,
                  r.unique, r.unique_distinct, r.unique_measured, r.local_fraction, r.local_fraction_measured,
                  r.dispatch_token_bytes, r.dispatch_token_bytes_measured, r.combine_token_bytes, r.combine_token_bytes_measured,
                  r.layer_rank_bytes / 1e6, r.layer_rank_bytes_measured / 1e6);
    os << line;
  }
  bool any = false;
  for (const LedgerRow& r : rows) any = any || r.servers > 1;
  if (any) {
    os << "cross-server MB/layer/rank (dispatch + combine): flat = every row to another server's rank; hierarchical = once per "
          "(token, other server)\n";
    os << "  EP | servers x ranks | flat closed  measured | hierarchical closed  routing | hierarchical / flat\n";
    for (const LedgerRow& r : rows) {
      if (r.servers <= 1) {
        std::snprintf(line, sizeof line, "%4d | %7d x %-5d | one server: nothing crosses\n", r.ep, r.servers, r.server_size);
      } else {
        std::snprintf(line, sizeof line, "%4d | %7d x %-5d | %11.1f %9.1f | %19.1f %8.1f | %19.3f\n", r.ep, r.servers, r.server_size,
                      r.cross_flat / 1e6, r.cross_flat_measured / 1e6, r.cross_hier / 1e6, r.cross_hier_routing / 1e6,
                      r.cross_hier / r.cross_flat);
      }
      os << line;
    }
  }
  return os.str();
}

std::string ledger_json(const std::vector<LedgerRow>& rows) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const LedgerRow& r : rows) {
    nlohmann::ordered_json j = {{"ep", r.ep},
                                {"tokens", r.tokens},
                                {"unique_ranks_per_token", r.unique},
                                {"unique_ranks_per_token_distinct", r.unique_distinct},
                                {"unique_ranks_per_token_measured", r.unique_measured},
                                {"local_fraction", r.local_fraction},
                                {"local_fraction_measured", r.local_fraction_measured},
                                {"dispatch_bytes_per_token", r.dispatch_token_bytes},
                                {"dispatch_bytes_per_token_measured", r.dispatch_token_bytes_measured},
                                {"combine_bytes_per_token", r.combine_token_bytes},
                                {"combine_bytes_per_token_measured", r.combine_token_bytes_measured},
                                {"bytes_per_layer_per_rank", r.layer_rank_bytes},
                                {"bytes_per_layer_per_rank_measured", r.layer_rank_bytes_measured},
                                {"servers", r.servers},
                                {"server_size", r.server_size}};
    if (r.servers > 1) {
      j["cross_server_bytes_flat"] = r.cross_flat;
      j["cross_server_bytes_flat_measured"] = r.cross_flat_measured;
      j["cross_server_bytes_hierarchical"] = r.cross_hier;
      j["cross_server_bytes_hierarchical_routing"] = r.cross_hier_routing;
    }
    list.push_back(j);
  }
  return list.dump(2) + "\n";
}

std::string ledger_svg(const std::vector<LedgerRow>& rows) {
  const double W = 640, Hh = 400, left = 70, right = 20, top = 30, bottom = 50;
  double ymax = 0;
  for (const LedgerRow& r : rows) ymax = std::max({ymax, r.layer_rank_bytes, r.layer_rank_bytes_measured, r.cross_flat, r.cross_flat_measured});
  ymax = ymax * 1.15 / 1e6;
  if (ymax <= 0) ymax = 1;
  const std::size_t n = rows.size();
  auto x = [&](std::size_t i) { return left + (n <= 1 ? 0.5 : static_cast<double>(i) / static_cast<double>(n - 1)) * (W - left - right); };
  auto y = [&](double mb) { return top + (1 - mb / ymax) * (Hh - top - bottom); };
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << Hh << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<text x=\"" << left << "\" y=\"18\">epx sim ledger: MB per layer per rank (dispatch + combine) vs EP size</text>\n";
  os << "<line x1=\"" << left << "\" y1=\"" << y(0) << "\" x2=\"" << W - right << "\" y2=\"" << y(0) << "\" stroke=\"black\"/>\n";
  os << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << y(0) << "\" stroke=\"black\"/>\n";
  const double step = std::pow(10, std::floor(std::log10(ymax))) / (ymax / std::pow(10, std::floor(std::log10(ymax))) < 3 ? 2 : 1);
  for (double v = 0; v <= ymax; v += step) os << "<text x=\"" << left - 45 << "\" y=\"" << y(v) + 4 << "\">" << v << "</text>\n";
  auto line = [&](const char* color, const char* dash, auto get) {
    os << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\"" << dash << " points=\"";
    for (std::size_t i = 0; i < n; ++i) os << x(i) << "," << y(get(rows[i]) / 1e6) << " ";
    os << "\"/>\n";
  };
  auto dots = [&](const char* color, auto get) {
    for (std::size_t i = 0; i < n; ++i)
      os << "<circle cx=\"" << x(i) << "\" cy=\"" << y(get(rows[i]) / 1e6) << "\" r=\"4\" fill=\"" << color << "\"/>\n";
  };
  line("#1f77b4", "", [](const LedgerRow& r) { return r.layer_rank_bytes; });
  dots("#1f77b4", [](const LedgerRow& r) { return r.layer_rank_bytes_measured; });
  line("#d62728", "", [](const LedgerRow& r) { return r.cross_flat; });
  dots("#d62728", [](const LedgerRow& r) { return r.cross_flat_measured; });
  line("#2ca02c", " stroke-dasharray=\"6,4\"", [](const LedgerRow& r) { return r.cross_hier; });
  dots("#2ca02c", [](const LedgerRow& r) { return r.cross_hier_routing; });
  for (std::size_t i = 0; i < n; ++i) os << "<text x=\"" << x(i) - 12 << "\" y=\"" << Hh - bottom + 18 << "\">EP" << rows[i].ep << "</text>\n";
  os << "<text x=\"" << left + 10 << "\" y=\"" << top + 12 << "\" fill=\"#1f77b4\">to other ranks (line: closed form, dots: engine counters)</text>\n";
  os << "<text x=\"" << left + 10 << "\" y=\"" << top + 28 << "\" fill=\"#d62728\">cross-server, flat (dots: sim transport per-peer bytes)</text>\n";
  os << "<text x=\"" << left + 10 << "\" y=\"" << top + 44 << "\" fill=\"#2ca02c\">cross-server, hierarchical (dots: counted on the routing)</text>\n";
  os << "</svg>\n";
  return os.str();
}

}  // namespace epx::tools
