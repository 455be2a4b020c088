// `epx bench --sweep KEY=V1,V2,...`: the bench once per combination of the swept values
// (the cross product, first --sweep varying slowest), one comparison table at the end.
// Each combination is a full `epx bench` measurement (measure_bench: same warmup, iters,
// interleaved memcpy and payload cross-check), only the report is condensed to one row.
#pragma once

#include <string>
#include <vector>

#include "epx/bench/options.hpp"
#include "epx/bench/report.hpp"

namespace epx::tools {

/// The keys --sweep accepts: the data-plane options (dataplane_option_names()), tokens, workers.
const std::vector<std::string>& sweep_keys();

/// One --sweep KEY=V1,V2,...
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;  ///< canonical text (e.g. aggregate 65536 -> "64K")
};

/// Parses the --sweep arguments. Throws epx::Error(kInvalidArgument) naming --sweep for an
/// unknown or repeated key, an empty value list, or a value that does not parse (e.g.
/// "--sweep schedule=flat,diagonal": "--sweep schedule: --schedule: ...").
std::vector<SweepAxis> parse_sweep_axes(const std::vector<std::string>& specs);

/// Sets `key` of `o` to `value` (the same parsing as the option --key); throws naming --key.
void set_sweep_value(BenchOptions& o, const std::string& key, const std::string& value);

/// One point of the cross product.
struct SweepCombination {
  std::vector<std::string> values;  ///< [axis]
  BenchOptions options;             ///< the base options with the values applied, no sweep
  std::string skip_reason;          ///< why this combination cannot run ("" = it can)
};

/// The cross product of the axes in order (the last axis varies fastest). A combination
/// whose options do not fit together on `ranks` ranks (validate_options, check_dataplane;
/// e.g. queue-split 3:1 with queues 1) gets a skip_reason instead of failing the sweep.
std::vector<SweepCombination> expand_sweep(const BenchOptions& base, const std::vector<SweepAxis>& axes, int ranks);

/// The outcome of one combination: a report, or why there is none.
struct SweepRow {
  std::vector<std::string> values;  ///< [axis]
  BenchOptions options;
  std::string skipped;  ///< "" = measured; else why not (checked up front, or refused by epx at run time)
  BenchReport report;   ///< when measured
};

/// A measured sweep: the axes, one row per combination (in expand_sweep's order), and the
/// ranks every combination ran on.
struct SweepResult {
  std::vector<SweepAxis> axes;
  std::vector<SweepRow> rows;
  int ranks = 0;
};

/// Measures the sweep of `o.sweep` (every value checked before anything runs; each
/// combination a full measure_bench): a progress line per combination on stderr, nothing
/// on stdout. A combination epx refuses with kInvalidArgument becomes a skipped row.
/// Throws epx::Error on a bad --sweep and when a rank fails.
SweepResult measure_sweep(const BenchOptions& o);

}  // namespace epx::tools
