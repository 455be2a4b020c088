// epx bench --op all_gather | reduce_scatter | all_reduce on one rank: the timed loop over a
// BucketBuffer, interleaved with the copy limit (every rank copying N bytes at once), and
// the rank's record.
#include "epx/bench/collective.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "collective_data.hpp"
#include "epx/bench/dataplane_options.hpp"
#include "epx/bench/runner.hpp"
#include "epx/bucket.hpp"
#include "epx/error.hpp"
#include "epx/launch.hpp"
#include "epx/spi/copy.hpp"

namespace epx::tools {

bool is_collective_op(const std::string& op) noexcept {
  return op == "all_gather" || op == "reduce_scatter" || op == "all_reduce";
}

double busbw_factor(const std::string& op, int ranks) noexcept {
  if (ranks < 1) return 0;
  const double f = static_cast<double>(ranks - 1) / static_cast<double>(ranks);
  return op == "all_reduce" ? 2 * f : f;
}

void validate_collective_options(const BenchOptions& o) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, "epx bench --op: " + m); };
  if (!is_collective_op(o.op)) bad(o.op + " is not a collective");
  if (o.tensors < 1 || o.tensors > kBucketMaxTensors)
    bad("--tensors must be in [1, " + std::to_string(kBucketMaxTensors) + "], got " + std::to_string(o.tensors));
  if (o.dtype != "float32" && o.dtype != "bf16") bad("--dtype must be float32 or bf16, got " + o.dtype);
  if (o.dtype != "float32" && o.op != "all_gather") bad("--dtype " + o.dtype + ": " + o.op + " reduces float32 only");
  const std::size_t n = parse_byte_size(o.bytes);
  const std::size_t unit = static_cast<std::size_t>(std::max(o.ranks, 1)) * 64;
  if (n < unit * static_cast<std::size_t>(o.tensors))
    bad("--bytes " + o.bytes + ": at least " + std::to_string(unit) + " bytes per tensor (P x 64) are needed");
  if (!o.baseline.empty() && o.baseline != "mpi" && o.baseline != "gloo")
    bad("--baseline must be mpi or gloo, got " + o.baseline);
  if (o.iters < 1 || o.warmup < 0) bad("--iters >= 1 and --warmup >= 0");
  if (!o.sweep.empty()) bad("--sweep times dispatch and combine only");
  parse_bucket_algorithm(o.algorithm);
  const std::size_t chunk = parse_byte_size(o.chunk_bytes);
  if (chunk != 0 && (chunk < 256 || chunk % 64 != 0)) bad("--chunk-bytes: 0 (auto) or a multiple of 64 >= 256");
}

namespace {

/// The rank's tensors in the buffer's storage, and what it restores before each iteration.
class CollectiveRank {
 public:
  CollectiveRank(Transport& t, const BenchOptions& o)
      : t_(t), o_(o), P_(t.num_ranks()),
        each_(epx_collective::tensor_bytes(parse_byte_size(o.bytes), o.tensors, t.num_ranks())),
        buffer_(t, {world_ranks(t.num_ranks())}, each_ * static_cast<std::size_t>(o.tensors),
                {.topology = o.dataplane.topology == DataPlaneOptions{}.topology ? "" : o.dataplane.topology,
                 .chunk_bytes = parse_byte_size(o.chunk_bytes), .algorithm = parse_bucket_algorithm(o.algorithm)}) {
    const bool gather = o.op == "all_gather";
    const std::size_t in_bytes = gather ? each_ / static_cast<std::size_t>(P_) : each_;
    for (int k = 0; k < o.tensors; ++k) {
      std::vector<std::byte> v(in_bytes);
      epx_collective::fill_bytes(v.data(), in_bytes, o.seed, t.rank(), k);
      pristine_.push_back(std::move(v));
      std::byte* base = buffer_.storage() + static_cast<std::size_t>(k) * each_;
      in_.push_back(gather ? base + static_cast<std::size_t>(t.rank()) * in_bytes : base);
      out_.push_back(base);
    }
    // The copy limit: N bytes per rank between private buffers (pre-faulted).
    copy_src_.assign(each_ * static_cast<std::size_t>(o.tensors), std::byte{1});
    copy_dst_.assign(copy_src_.size(), std::byte{2});
  }

  CollectiveRankRecord run() {
    CollectiveRankRecord rec;
    rec.rank = t_.rank();
    for (int it = 0; it < o_.warmup + o_.iters; ++it) {
      if (o_.progress && t_.rank() == 0 && (it == o_.warmup || it + 1 == o_.warmup + o_.iters))
        std::fprintf(stderr, "epx bench: %s %s x%d on %d ranks: iteration %d/%d\n", o_.op.c_str(), o_.bytes.c_str(),
                     o_.tensors, P_, it + 1, o_.warmup + o_.iters);
      restore();
      t_.barrier("bench: bucket");
      const double t0 = bench_now_us();
      call();
      const double t1 = bench_now_us();
      const BucketStats& s = buffer_.last_stats();
      t_.barrier("bench: memcpy");
      const double m0 = bench_now_us();
      std::memcpy(copy_dst_.data(), copy_src_.data(), copy_src_.size());
      const double m1 = bench_now_us();
      t_.barrier("bench: streaming copy");
      const double s0 = bench_now_us();
      stream_copy(copy_dst_.data(), copy_src_.data(), copy_src_.size());
      const double s1 = bench_now_us();
      if (it < o_.warmup) continue;
      rec.start_us.push_back(t0), rec.lat_us.push_back(t1 - t0);
      rec.exchange_us.push_back(s.exchange_us), rec.data_us.push_back(s.data_us), rec.done_us.push_back(s.done_us);
      rec.memcpy_us.push_back(m1 - m0), rec.stream_us.push_back(s1 - s0);
    }
    rec.algorithm = to_string(buffer_.last_algorithm());
    rec.window_bytes = buffer_.window_bytes();
    outputs(rec);
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) == 0) rec.peak_rss_bytes = static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
    return rec;
  }

 private:
  void restore() {
    for (std::size_t k = 0; k < pristine_.size(); ++k) std::memcpy(in_[k], pristine_[k].data(), pristine_[k].size());
  }

  void call() {
    if (o_.op == "all_gather") {
      std::vector<TensorView> srcs;
      for (std::size_t k = 0; k < in_.size(); ++k)
        srcs.emplace_back(in_[k], DType::kF32, Shape{static_cast<std::int64_t>(pristine_[k].size() / 4)});
      buffer_.all_gather(srcs);
      return;
    }
    std::vector<MutableView> xs;
    for (std::byte* x : out_) xs.push_back({x, DType::kF32, Shape{static_cast<std::int64_t>(each_ / 4)}});
    if (o_.op == "all_reduce") buffer_.all_reduce(xs);
    else buffer_.reduce_scatter(xs);
  }

  /// The output of tensor k on this rank as float32 (reduce_scatter: its shard).
  std::pair<const float*, std::size_t> output(std::size_t k) const {
    const std::size_t n = each_ / 4;
    if (o_.op == "reduce_scatter")
      return {reinterpret_cast<const float*>(out_[k]) + static_cast<std::size_t>(t_.rank()) * (n / static_cast<std::size_t>(P_)),
              n / static_cast<std::size_t>(P_)};
    return {reinterpret_cast<const float*>(out_[k]), n};
  }

  /// docs/spec.md §8's value of element i of output k on this rank, from the generator.
  float expected(std::size_t k, std::size_t i) const {
    const int t = static_cast<int>(k);
    const std::size_t n = each_ / 4, shard = n / static_cast<std::size_t>(P_);
    if (o_.op == "all_gather") return epx_collective::value(o_.seed, static_cast<int>(i / shard), t, i % shard);
    const std::size_t e = o_.op == "reduce_scatter" ? static_cast<std::size_t>(t_.rank()) * shard + i : i;
    float acc = epx_collective::value(o_.seed, 0, t, e);
    for (int j = 1; j < P_; ++j) acc = acc + epx_collective::value(o_.seed, j, t, e);
    return acc;
  }

  void outputs(CollectiveRankRecord& rec) const {
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t k = 0; k < out_.size(); ++k) {
      const auto [data, count] = output(k);
      h = epx_collective::fnv1a(data, count * 4, h);
      for (std::size_t i : epx_collective::sample_indices(count)) {
        rec.samples.push_back(data[i]);
        const float want = expected(k, i);
        if (rec.check.empty() && std::memcmp(&want, &data[i], 4) != 0)
          rec.check = "tensor " + std::to_string(k) + " element " + std::to_string(i) + ": " + std::to_string(data[i]) +
                      ", docs/spec.md §8 gives " + std::to_string(want);
      }
    }
    char hex[24];
    std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(h));
    rec.hash = hex;
  }

  Transport& t_;
  const BenchOptions& o_;
  int P_;
  std::size_t each_;
  BucketBuffer buffer_;
  std::vector<std::vector<std::byte>> pristine_;
  std::vector<std::byte*> in_, out_;
  std::vector<std::byte> copy_src_, copy_dst_;
};

}  // namespace

CollectiveRankRecord run_collective_rank(Transport& t, const BenchOptions& o) { return CollectiveRank(t, o).run(); }

std::string collective_record_json(const CollectiveRankRecord& r) {
  nlohmann::json j = {{"rank", r.rank}, {"algorithm", r.algorithm}, {"start_us", r.start_us}, {"lat_us", r.lat_us},
                      {"exchange_us", r.exchange_us}, {"data_us", r.data_us}, {"done_us", r.done_us},
                      {"memcpy_us", r.memcpy_us}, {"stream_us", r.stream_us}, {"window_bytes", r.window_bytes},
                      {"peak_rss_bytes", r.peak_rss_bytes}, {"hash", r.hash}, {"samples", r.samples}, {"check", r.check}};
  return j.dump();
}

CollectiveRankRecord collective_record_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  CollectiveRankRecord r;
  r.rank = j.at("rank");
  r.algorithm = j.at("algorithm");
  r.start_us = j.at("start_us").get<std::vector<double>>();
  r.lat_us = j.at("lat_us").get<std::vector<double>>();
  r.exchange_us = j.at("exchange_us").get<std::vector<double>>();
  r.data_us = j.at("data_us").get<std::vector<double>>();
  r.done_us = j.at("done_us").get<std::vector<double>>();
  r.memcpy_us = j.at("memcpy_us").get<std::vector<double>>();
  r.stream_us = j.at("stream_us").get<std::vector<double>>();
  r.window_bytes = j.at("window_bytes");
  r.peak_rss_bytes = j.at("peak_rss_bytes");
  r.hash = j.at("hash");
  r.samples = j.at("samples").get<std::vector<float>>();
  r.check = j.at("check");
  return r;
}

}  // namespace epx::tools
