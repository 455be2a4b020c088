#include "bench_sweep.hpp"

#include <algorithm>
#include <charconv>
#include <cstdarg>
#include <numeric>

#include "bench_dataplane.hpp"
#include "bench_output.hpp"
#include "bench_run.hpp"
#include "epx/error.hpp"
#include "replay.hpp"

using nlohmann::ordered_json;

namespace epx::tools {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, what); }

template <class Int>
Int parse_count(const std::string& flag, const std::string& text) {
  Int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n < 0)
    bad("--" + flag + ": '" + text + "' is not an integer >= 0");
  return n;
}

bool is_dataplane_key(const std::string& key) {
  const auto& names = dataplane_option_names();
  return std::find(names.begin(), names.end(), key) != names.end();
}

// The canonical text of `key` in `o` (what the table, the progress line and the JSON show).
std::string sweep_value(const BenchOptions& o, const std::string& key) {
  if (key == "tokens") return std::to_string(o.tokens);
  if (key == "workers") return std::to_string(o.workers);
  if (key == "ring-rows") return std::to_string(o.ring_rows);
  return dataplane_option_value(o.dataplane, key);
}

// Table headers of the swept keys (documented in bench_definitions()).
std::string axis_header(const std::string& key) {
  if (key == "topology") return "topo";
  if (key == "schedule") return "sched";
  if (key == "queues") return "q";
  if (key == "queue-split") return "split";
  if (key == "aggregate") return "aggr";
  if (key == "protocol") return "proto";
  if (key == "tokens") return "S";
  if (key == "workers") return "W";
  if (key == "ring-rows") return "ring";
  return key;
}

std::string combination_text(const std::vector<SweepAxis>& axes, const std::vector<std::string>& values) {
  std::string s;
  for (std::size_t a = 0; a < axes.size(); ++a) s += (a ? " " : "") + axes[a].key + "=" + values[a];
  return s;
}

// Per call of dispatch + combine: the bytes on each queue (all ranks) and the receivers'
// wait summed over the queues (avg over ranks).
std::vector<double> queue_bytes(const BenchReport& r) {
  std::vector<double> q(std::max(r.dispatch.queue_bytes.size(), r.combine.queue_bytes.size()), 0.0);
  for (const OpReport* op : {&r.dispatch, &r.combine})
    for (std::size_t i = 0; i < op->queue_bytes.size(); ++i) q[i] += op->queue_bytes[i];
  return q;
}
double queue_wait_us(const BenchReport& r) {
  double w = 0;
  for (const OpReport* op : {&r.dispatch, &r.combine}) w = std::accumulate(op->queue_wait_us.begin(), op->queue_wait_us.end(), w);
  return w;
}

std::string queue_shares(const std::vector<double>& bytes) {
  const double total = std::accumulate(bytes.begin(), bytes.end(), 0.0);
  std::string s;
  for (double b : bytes) s += (s.empty() ? "" : "/") + fmt("%.0f", total > 0 ? 100 * b / total : 0.0);
  return s;
}

constexpr const char* kOpColumns[] = {"us", "GB/s", "xmc", "puts", "B/put"};

void add_op_cells(std::vector<std::string>& cells, const OpReport& op) {
  cells.push_back(format_us(op.max_rank.avg));
  cells.push_back(fmt("%.2f", op.algbw_gbps));
  cells.push_back(fmt("%.2f", op.ratio_vs_memcpy));
  cells.push_back(op.counters ? fmt("%.0f", op.puts) : "-");
  cells.push_back(op.counters ? fmt("%.0f", op.bytes_per_put) : "-");
}

ordered_json op_row_json(const OpReport& op) {
  ordered_json j;
  j["max_rank_us"] = summary_json(op.max_rank);
  j["algbw_gbps"] = op.algbw_gbps;
  j["memcpy_gbps"] = op.memcpy_gbps;
  j["ratio_vs_memcpy"] = op.ratio_vs_memcpy;
  j["payload_bytes_total"] = op.total_payload;
  if (op.counters) {
    j["puts"] = op.puts;
    j["bytes_per_put"] = op.bytes_per_put;
    j["queue_puts"] = op.queue_puts;
    j["queue_bytes"] = op.queue_bytes;
    j["queue_wait_us"] = op.queue_wait_us;
  } else {
    j["puts"] = nullptr;
    j["bytes_per_put"] = nullptr;
  }
  return j;
}

}  // namespace

const std::vector<std::string>& sweep_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = dataplane_option_names();
    k.push_back("tokens");
    k.push_back("workers");
    k.push_back("ring-rows");  // the bounded receive area (credits) vs 0 = a slot per row
    return k;
  }();
  return keys;
}

void set_sweep_value(BenchOptions& o, const std::string& key, const std::string& value) {
  if (is_dataplane_key(key))
    set_dataplane_option(o.dataplane, key, value);
  else if (key == "tokens")
    o.tokens = parse_count<std::int64_t>(key, value);
  else if (key == "workers")
    o.workers = parse_count<int>(key, value);
  else if (key == "ring-rows")
    o.ring_rows = parse_count<std::int64_t>(key, value);
  else
    bad("--sweep: unknown key '" + key + "'");
}

std::vector<SweepAxis> parse_sweep_axes(const std::vector<std::string>& specs) {
  std::string accepted;
  for (const std::string& k : sweep_keys()) accepted += (accepted.empty() ? "" : ", ") + k;
  std::vector<SweepAxis> axes;
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    SweepAxis axis;
    axis.key = spec.substr(0, eq);
    const auto& keys = sweep_keys();
    if (eq == std::string::npos || std::find(keys.begin(), keys.end(), axis.key) == keys.end())
      bad("--sweep '" + spec + "': expected KEY=V1,V2,... with KEY one of " + accepted);
    for (const SweepAxis& a : axes)
      if (a.key == axis.key) bad("--sweep " + axis.key + " is given twice; list all its values in one --sweep");
    const std::string list = spec.substr(eq + 1);
    std::size_t begin = 0;
    while (true) {
      const std::size_t comma = list.find(',', begin);
      const std::string value = list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
      if (value.empty()) bad("--sweep '" + spec + "': empty value (expected " + axis.key + "=V1,V2,...)");
      BenchOptions probe;
      try {
        set_sweep_value(probe, axis.key, value);
      } catch (const Error& e) {
        throw Error(e.code(), "--sweep " + axis.key + ": " + e.what());
      }
      axis.values.push_back(sweep_value(probe, axis.key));
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
    axes.push_back(std::move(axis));
  }
  return axes;
}

std::vector<SweepCombination> expand_sweep(const BenchOptions& base, const std::vector<SweepAxis>& axes, int ranks) {
  std::size_t total = 1;
  for (const SweepAxis& a : axes) total *= a.values.size();
  std::vector<SweepCombination> out;
  for (std::size_t i = 0; i < total; ++i) {
    SweepCombination c;
    c.options = base;
    c.options.sweep.clear();
    // Mixed radix, the last axis the least significant digit: it varies fastest.
    std::size_t rest = i;
    c.values.resize(axes.size());
    for (std::size_t a = axes.size(); a-- > 0;) {
      c.values[a] = axes[a].values[rest % axes[a].values.size()];
      rest /= axes[a].values.size();
    }
    for (std::size_t a = 0; a < axes.size(); ++a) set_sweep_value(c.options, axes[a].key, c.values[a]);
    try {
      validate_options(c.options);
      check_dataplane(c.options.dataplane, ranks);
    } catch (const Error& e) {
      c.skip_reason = e.what();
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::vector<std::string>> sweep_table_cells(const std::vector<SweepAxis>& axes, const std::vector<SweepRow>& rows) {
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> header = {"#"};
  for (const SweepAxis& a : axes) header.push_back(axis_header(a.key));
  for (const char* op : {"d_", "c_"})
    for (const char* col : kOpColumns) header.push_back(std::string(op) + col);
  for (const char* col : {"q_bytes%", "wait_us", "chk"}) header.push_back(col);
  table.push_back(std::move(header));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const SweepRow& row = rows[i];
    std::vector<std::string> cells = {std::to_string(i + 1)};
    cells.insert(cells.end(), row.values.begin(), row.values.end());
    if (!row.skipped.empty()) {
      cells.push_back("skipped");
    } else {
      const BenchReport& r = row.report;
      add_op_cells(cells, r.dispatch);
      add_op_cells(cells, r.combine);
      const bool counters = r.dispatch.counters && r.combine.counters;
      cells.push_back(counters ? queue_shares(queue_bytes(r)) : "-");
      cells.push_back(counters ? format_us(queue_wait_us(r)) : "-");
      cells.push_back(r.warnings.empty() ? "ok" : "WARN");
    }
    table.push_back(std::move(cells));
  }
  return table;
}

void print_sweep_table(std::FILE* out, const std::vector<SweepAxis>& axes, const std::vector<SweepRow>& rows) {
  const auto table = sweep_table_cells(axes, rows);
  const std::size_t columns = table.front().size();
  const std::size_t first_number = 1 + axes.size();
  // A skipped row's "skipped" runs into the empty columns after it: it sets no width.
  auto overflows = [&](const std::vector<std::string>& line) { return line.size() == first_number + 1; };
  std::vector<std::size_t> width(columns, 0);
  for (const auto& line : table)
    for (std::size_t c = 0; c < line.size(); ++c)
      if (!(overflows(line) && c == first_number)) width[c] = std::max(width[c], line[c].size());
  for (const auto& line : table) {
    std::string text = " ";
    for (std::size_t c = 0; c < line.size(); ++c) {
      // Swept values read as labels (left-aligned), numbers are right-aligned.
      const bool left = (c > 0 && c < first_number) || (overflows(line) && c == first_number);
      text += fmt(left ? " %-*s" : " %*s", static_cast<int>(width[c]), line[c].c_str());
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    std::fprintf(out, "%s\n", text.c_str());
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].skipped.empty()) std::fprintf(out, "  #%zu skipped: %s\n", i + 1, rows[i].skipped.c_str());
    for (const std::string& w : rows[i].report.warnings) std::fprintf(out, "  #%zu WARNING: %s\n", i + 1, w.c_str());
  }
}

ordered_json sweep_json(const std::vector<SweepAxis>& axes, const std::vector<SweepRow>& rows) {
  ordered_json j;
  const auto measured = std::find_if(rows.begin(), rows.end(), [](const SweepRow& r) { return r.skipped.empty(); });
  if (measured != rows.end()) {
    j = bench_config_json(measured->report);
    // These can differ between combinations: each sweep entry has its own.
    for (const char* per_combination : {"tokens", "tokens_per_rank", "workers", "dataplane"}) j.erase(per_combination);
  }
  j["tool"] = "epx bench --sweep";
  ordered_json axes_json = ordered_json::array();
  for (const SweepAxis& a : axes) axes_json.push_back({{"key", a.key}, {"values", a.values}});
  j["axes"] = axes_json;
  ordered_json entries = ordered_json::array();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const SweepRow& row = rows[i];
    ordered_json e;
    e["index"] = i + 1;
    ordered_json values;
    for (std::size_t a = 0; a < axes.size(); ++a) values[axes[a].key] = row.values[a];
    e["values"] = values;
    const bool ran = row.skipped.empty();
    e["config"] = {{"tokens", ran ? row.report.max_tokens : row.options.tokens},
                   {"workers", ran ? row.report.workers : row.options.workers},
                   {"ring_rows", row.options.ring_rows},
                   {"window_bytes", ran ? row.report.window_bytes : 0},
                   {"dataplane", dataplane_json(row.options.dataplane)}};
    if (!ran) {
      e["skipped"] = row.skipped;
    } else {
      e["skipped"] = nullptr;
      e["dispatch"] = op_row_json(row.report.dispatch);
      e["combine"] = op_row_json(row.report.combine);
      e["queue_bytes"] = queue_bytes(row.report);
      e["queue_wait_us"] = queue_wait_us(row.report);
      e["memcpy_gbps"] = row.report.memcpy_gbps;
      e["verified"] = row.report.warnings.empty();
      e["warnings"] = row.report.warnings;
      e["wall_s"] = row.report.wall_s;
    }
    entries.push_back(std::move(e));
  }
  j["sweep"] = entries;
  j["definitions"] = bench_definitions();
  return j;
}

int run_bench_sweep(const BenchOptions& o, std::FILE* out, std::vector<SweepRow>* rows_out) {
  const std::vector<SweepAxis> axes = parse_sweep_axes(o.sweep);
  // Everything but the data plane must be valid on its own (an error, not a skip); the data
  // plane is checked per combination, since the base may only be valid with swept values.
  BenchOptions base_check = o;
  base_check.dataplane = DataPlaneOptions{};
  validate_options(base_check);
  for (const SweepAxis& a : axes)
    if (a.key == "tokens" && !o.routing.empty()) bad("--sweep tokens needs a generated routing (--routing brings its own tokens)");
  const int ranks = o.routing.empty() ? o.ranks : read_replay_meta(o.routing).num_ranks;
  std::vector<SweepCombination> combinations = expand_sweep(o, axes, ranks);

  std::vector<SweepRow> rows;
  const std::size_t n = combinations.size();
  for (std::size_t i = 0; i < n; ++i) {
    SweepCombination& c = combinations[i];
    SweepRow row{c.values, c.options, c.skip_reason, {}};
    const std::string label = fmt("epx bench: sweep %zu/%zu: ", i + 1, n) + combination_text(axes, c.values);
    if (row.skipped.empty()) {
      if (o.progress) std::fprintf(stderr, "%s ...\n", label.c_str());
      row.options.progress = false;  // one line per combination, not per iteration
      try {
        row.report = measure_bench(row.options).report;
      } catch (const Error& e) {
        // Refused by epx itself (e.g. a topology file that does not fit): skip, like the
        // combinations refused up front. Any other failure ends the sweep.
        if (e.code() != ErrorCode::kInvalidArgument) throw;
        row.skipped = std::string("refused by epx: ") + e.what();
      }
    }
    if (o.progress && !row.skipped.empty()) std::fprintf(stderr, "%s: skipped: %s\n", label.c_str(), row.skipped.c_str());
    rows.push_back(std::move(row));
  }

  std::size_t skipped = 0;
  for (const SweepRow& r : rows) skipped += r.skipped.empty() ? 0 : 1;
  std::string shape;
  for (const SweepRow& r : rows)
    if (r.skipped.empty()) {
      shape = fmt("H=%d K=%d E=%d, ", r.report.hidden, r.report.topk, r.report.experts);
      break;
    }
  std::fprintf(out, "epx bench --sweep: %zu combinations, %zu skipped; P=%d (%s), %s%d iterations after %d warmup each\n", n,
               skipped, ranks, o.transport.c_str(), shape.c_str(), o.iters, o.warmup);
  std::fprintf(out, "  base data plane: %s\n", describe_dataplane(o.dataplane).c_str());
  print_sweep_table(out, axes, rows);
  if (!o.json.empty()) {
    write_json_file(o.json, sweep_json(axes, rows));
    std::fprintf(out, "\nwrote %s\n", o.json.c_str());
  }
  std::fflush(out);
  if (rows_out) *rows_out = std::move(rows);
  return 0;
}

}  // namespace epx::tools
