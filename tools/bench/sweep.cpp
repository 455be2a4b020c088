#include "epx/bench/sweep.hpp"

#include <algorithm>
#include <charconv>
#include <cstdarg>

#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/progress.hpp"
#include "epx/bench/run.hpp"
#include "epx/error.hpp"
#include "epx/io/replay.hpp"

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

std::string combination_text(const std::vector<SweepAxis>& axes, const std::vector<std::string>& values) {
  std::string s;
  for (std::size_t a = 0; a < axes.size(); ++a) s += (a ? " " : "") + axes[a].key + "=" + values[a];
  return s;
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

SweepResult measure_sweep(const BenchOptions& o) {
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
  ProgressLine progress("epx bench sweep", static_cast<double>(n), o.progress);
  for (std::size_t i = 0; i < n; ++i) {
    SweepCombination& c = combinations[i];
    SweepRow row{c.values, c.options, c.skip_reason, {}};
    const std::string label = fmt("%zu/%zu ", i + 1, n) + combination_text(axes, c.values);
    if (row.skipped.empty()) {
      progress.update(static_cast<double>(i), label);
      row.options.progress = false;  // one line for the sweep, not one per iteration
      try {
        row.report = measure_bench(row.options).report;
      } catch (const Error& e) {
        // Refused by epx itself (e.g. a topology file that does not fit): skip, like the
        // combinations refused up front. Any other failure ends the sweep.
        if (e.code() != ErrorCode::kInvalidArgument) throw;
        row.skipped = std::string("refused by epx: ") + e.what();
      }
    }
    if (!row.skipped.empty()) progress.note(label + ": skipped: " + row.skipped);
    rows.push_back(std::move(row));
  }
  progress.finish();

  return {axes, std::move(rows), ranks};
}

}  // namespace epx::tools
