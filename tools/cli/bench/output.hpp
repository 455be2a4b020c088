// `epx bench` files: --json (every number of the report) and --trace (Chrome trace events).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "epx/bench/report.hpp"
#include "epx/bench/runner.hpp"

namespace epx::tools {

/// {"avg", "p50", "p95", "max"}
nlohmann::ordered_json summary_json(const Summary& s);

/// What was measured: tool, ranks, tokens, hidden, topk, experts, fp8, layout, alignment,
/// cached, transport, workers, cores, warmup, iters, counters, routing, dataplane.
nlohmann::ordered_json bench_config_json(const BenchReport& r);

/// The report as JSON (bench_config_json, then the results): top level ranks, tokens, hidden, topk, experts, fp8, layout,
/// memcpy_gbps, ...; per op ("dispatch", "combine") max_rank_us {avg,p50,p95,max},
/// rank_us, payload_bytes_per_rank, local_bytes_per_rank, algbw_gbps, ratio_vs_memcpy,
/// puts, phases_us {phase: [per rank]}, queues {puts, bytes, wait_us, ..._per_rank}, ...; "route", "worker_counters", "baseline".
nlohmann::ordered_json bench_json(const BenchReport& r);

/// Writes `j` indented to `path` (kIo on failure).
void write_json_file(const std::filesystem::path& path, const nlohmann::ordered_json& j);

/// Writes bench_json(r) to `path` (kIo on failure).
void write_bench_json(const std::filesystem::path& path, const BenchReport& r);

/// Chrome trace-event JSON ({"traceEvents": [...]}, "ph":"X" slices, ts/dur in us from
/// the first call's start): pid = rank, tid = worker (plus one track for the memcpy
/// reference); per timed iteration a slice per call and, with counters, per phase, laid
/// out in phase order from the call's start (the engine records durations, not times).
nlohmann::json bench_trace(const std::vector<BenchRankRecord>& records);
void write_bench_trace(const std::filesystem::path& path, const std::vector<BenchRankRecord>& records);

}  // namespace epx::tools
