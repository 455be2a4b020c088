// epx_mpi_collective: the bucket collectives as Open MPI users call them, one MPI call per
// tensor (MPI_Allgather of bytes, MPI_Reduce_scatter_block and in-place MPI_Allreduce of
// float32 sums), on the inputs of epx bench --op (collective_data.hpp), each iteration:
// inputs restored (untimed), MPI_Barrier, then the T calls timed on every rank. Rank 0
// writes max-rank and per-rank latencies (us) and, per rank, the FNV-1a hash of its
// outputs and the values at collective_data.hpp's sample indices (for the comparison with
// epx's results: bitwise for all_gather, within float32 tolerance for the sums, whose
// order Open MPI picks itself).
#include "mpi_collective.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collective_data.hpp"

namespace epx_mpi_collective {

namespace {

struct Options {
  std::string op = "all_reduce", json;
  std::size_t bytes = 1 << 20;
  int tensors = 1, iters = 20, warmup = 3;
  std::uint64_t seed = 1;
};

[[noreturn]] void usage(const std::string& why) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::fprintf(stderr, "epx_mpi_collective: %s\nusage: mpirun -np P epx_mpi_collective --op all_gather|reduce_scatter|"
                 "all_reduce --bytes N [--tensors T] [--iters I] [--warmup W] [--seed S] --json OUT\n", why.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--op") o.op = v;
    else if (a == "--bytes") o.bytes = std::stoull(v);
    else if (a == "--tensors") o.tensors = std::stoi(v);
    else if (a == "--iters") o.iters = std::stoi(v);
    else if (a == "--warmup") o.warmup = std::stoi(v);
    else if (a == "--seed") o.seed = std::stoull(v);
    else if (a == "--json") o.json = v;
    else usage("unknown option " + a);
  }
  if (o.op != "all_gather" && o.op != "reduce_scatter" && o.op != "all_reduce") usage("--op " + o.op);
  if (o.json.empty() || o.tensors < 1 || o.iters < 1 || o.warmup < 0 || o.bytes == 0) usage("bad options");
  return o;
}

double now_us() { return MPI_Wtime() * 1e6; }

nlohmann::json stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) {
    std::size_t k = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size()) + 0.999999);
    return v[std::min(v.size(), std::max<std::size_t>(k, 1)) - 1];
  };
  double sum = 0;
  for (double x : v) sum += x;
  return {{"avg", sum / static_cast<double>(v.size())}, {"p50", pct(50)}, {"p95", pct(95)}, {"max", v.back()}};
}

/// One rank's tensors: inputs kept pristine, the buffers the MPI calls use.
struct Tensors {
  std::vector<std::vector<float>> pristine, in, out;
};

Tensors make_tensors(const Options& o, int rank, int P, std::size_t each) {
  Tensors t;
  for (int k = 0; k < o.tensors; ++k) {
    const std::size_t in_bytes = o.op == "all_gather" ? each / static_cast<std::size_t>(P) : each;
    std::vector<float> v(in_bytes / 4);
    epx_collective::fill_bytes(v.data(), in_bytes, o.seed, rank, k);
    t.pristine.push_back(v);
    t.in.push_back(v);
    const std::size_t out_bytes = o.op == "reduce_scatter" ? each / static_cast<std::size_t>(P) : o.op == "all_gather" ? each : 0;
    t.out.emplace_back(out_bytes / 4);
  }
  return t;
}

void call(const Options& o, Tensors& t, int P) {
  for (std::size_t k = 0; k < t.in.size(); ++k) {
    const int count = static_cast<int>(t.in[k].size());
    if (o.op == "all_gather")
      MPI_Allgather(t.in[k].data(), count * 4, MPI_BYTE, t.out[k].data(), count * 4, MPI_BYTE, MPI_COMM_WORLD);
    else if (o.op == "reduce_scatter")
      MPI_Reduce_scatter_block(t.in[k].data(), t.out[k].data(), count / P, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else
      MPI_Allreduce(MPI_IN_PLACE, t.in[k].data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
}

// The timed loop: each iteration starts from the pristine inputs; latencies in us.
std::vector<double> time_calls(const Options& o, Tensors& t, int P) {
  std::vector<double> lat;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    for (std::size_t k = 0; k < t.in.size(); ++k) std::copy(t.pristine[k].begin(), t.pristine[k].end(), t.in[k].begin());
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_us();
    call(o, t, P);
    const double t1 = now_us();
    if (it >= o.warmup) lat.push_back(t1 - t0);
  }
  return lat;
}

// Rank 0's JSON: every rank's latencies (gathered as [P][iters]), hashes and samples.
nlohmann::json report(const Options& o, int P, std::size_t each, const std::vector<double>& all, std::size_t iters,
                      const std::vector<unsigned long long>& hashes, const std::vector<float>& all_samples) {
  const std::size_t per_rank_samples = all_samples.size() / static_cast<std::size_t>(P);
  nlohmann::json j;
  j["op"] = o.op;
  j["ranks"] = P;
  j["tensor_bytes"] = each;
  j["tensors"] = o.tensors;
  std::vector<double> mx(iters, 0);
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < P; ++r) {
    double sum = 0;
    for (std::size_t i = 0; i < iters; ++i) {
      const double v = all[static_cast<std::size_t>(r) * iters + i];
      mx[i] = std::max(mx[i], v);
      sum += v;
    }
    char hex[24];
    std::snprintf(hex, sizeof hex, "0x%016llx", hashes[static_cast<std::size_t>(r)]);
    const auto first = all_samples.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * per_rank_samples);
    ranks.push_back({{"avg_us", sum / static_cast<double>(iters)}, {"hash", hex},
                     {"samples", std::vector<float>(first, first + static_cast<std::ptrdiff_t>(per_rank_samples))}});
  }
  j["max_rank_us"] = stats(mx);
  j["max_rank_series_us"] = mx;
  j["ranks_detail"] = ranks;
  return j;
}

}  // namespace

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const std::size_t each = epx_collective::tensor_bytes(o.bytes, o.tensors, P);
  Tensors t = make_tensors(o, rank, P, each);
  const std::vector<double> lat = time_calls(o, t, P);
  // The outputs of the last iteration: hash and samples.
  std::uint64_t h = 1469598103934665603ull;
  std::vector<float> samples;
  for (std::size_t k = 0; k < t.in.size(); ++k) {
    const std::vector<float>& out = o.op == "all_reduce" ? t.in[k] : t.out[k];
    h = epx_collective::fnv1a(out.data(), out.size() * 4, h);
    for (std::size_t i : epx_collective::sample_indices(out.size())) samples.push_back(out[i]);
  }
  std::vector<double> all(static_cast<std::size_t>(P) * lat.size());
  MPI_Gather(lat.data(), static_cast<int>(lat.size()), MPI_DOUBLE, all.data(), static_cast<int>(lat.size()), MPI_DOUBLE, 0,
             MPI_COMM_WORLD);
  std::vector<unsigned long long> hashes(static_cast<std::size_t>(P));
  unsigned long long mine = h;
  MPI_Gather(&mine, 1, MPI_UNSIGNED_LONG_LONG, hashes.data(), 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  std::vector<float> all_samples(static_cast<std::size_t>(P) * samples.size());
  MPI_Gather(samples.data(), static_cast<int>(samples.size()), MPI_FLOAT, all_samples.data(), static_cast<int>(samples.size()),
             MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (rank != 0) return 0;
  std::ofstream f(o.json);
  f << report(o, P, each, all, lat.size(), hashes, all_samples).dump(1) << "\n";
  return f.good() ? 0 : 1;
}

}  // namespace epx_mpi_collective
