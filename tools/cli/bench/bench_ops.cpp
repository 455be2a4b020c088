#include "bench/bench_ops.hpp"

#include "bench/collective_print.hpp"
#include "bench/p2p_ops.hpp"

#include "bench/run_bench.hpp"
#include "bench/sweep_print.hpp"
#include "epx/error.hpp"

namespace epx::tools {

namespace {

/// --op dispatch: dispatch + combine on one routing (one run, or --sweep's table).
int run_dispatch(const BenchOptions& o, std::FILE* out) { return o.sweep.empty() ? run_bench(o, out) : run_bench_sweep(o, out); }

}  // namespace

const std::vector<BenchOp>& bench_ops() {
  static const std::vector<BenchOp> ops = {
      {"dispatch", "dispatch + combine over a routing (the default; --tokens --hidden --topk --experts ...)", run_dispatch},
      {"all_gather", "BucketBuffer.all_gather of --bytes N (the gathered tensor) in --tensors T tensors", run_collective_bench},
      {"reduce_scatter", "BucketBuffer.reduce_scatter of --bytes N (the input) in --tensors T float32 tensors", run_collective_bench},
      {"all_reduce", "BucketBuffer.all_reduce of --bytes N in --tensors T float32 tensors", run_collective_bench},
      {"pp", "PPBuffer send/recv: 16 KiB .. 64 MiB, 1-3 in flight, per-pair latency, vs MPI_Send/MPI_Recv and gloo (--pp-*)", run_pp_op},
      {"engram", "EngramBuffer fetch: rows/s, bytes vs memcpy, local-row hit rate, vs MPI/gloo request-response (--engram-*)", run_engram_op},
  };
  return ops;
}

const BenchOp& find_bench_op(const std::string& name) {
  for (const BenchOp& op : bench_ops())
    if (name == op.name) return op;
  throw Error(ErrorCode::kInvalidArgument, "--op " + name + ": unknown, expected one of " + bench_op_names());
}

std::string bench_op_names() {
  std::string s;
  for (const BenchOp& op : bench_ops()) s += (s.empty() ? "" : " | ") + std::string(op.name);
  return s;
}

}  // namespace epx::tools
