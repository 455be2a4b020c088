// `epx bench --sweep`: the comparison table and the JSON of a measured sweep (epx/bench/sweep.hpp).
#include "bench/sweep_print.hpp"

#include <algorithm>
#include <numeric>

#include "bench/bench_cli.hpp"
#include "bench/output.hpp"
#include "bench/report_print.hpp"
#include "epx/bench/dataplane_options.hpp"

using nlohmann::ordered_json;

namespace epx::tools {

namespace {

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
  SweepResult sweep = measure_sweep(o);
  const std::vector<SweepAxis>& axes = sweep.axes;
  std::vector<SweepRow>& rows = sweep.rows;
  const int ranks = sweep.ranks;
  const std::size_t n = rows.size();
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
