// epx_mpi_p2p_baseline: what a user writes WITHOUT epx for `epx bench --op pp|engram`.
//
//   mpirun -np P epx_mpi_p2p_baseline --op pp --sizes 16384,58720256 [--pattern pairs|ring]
//          [--messages 4] --iters N --warmup W --json OUT
//   mpirun -np P epx_mpi_p2p_baseline --op engram --layers 2 --rows 131072 --hidden 256
//          --tokens 512 --entries 24 [--seed 1] --iters N --warmup W --json OUT
//
// pp: pairs = rank 2k sends to 2k+1 (pipelines of two), ring = r sends to r+1 mod P (even
// ranks send first). Per size: a stream (every iteration: a barrier, then `messages`
// MPI_Send / MPI_Recv of the size on each link, from a 0-byte "go" each receiver sends its
// sender; the time per message at the receiver, max over receivers) and a ping-pong between
// 2k and 2k+1 after one untimed round trip (one-way = round trip / 2, per pair). The receivers hash the last message (p2p_data.hpp: check_hash). The JSON has the
// samples (us, one per timed iteration); epx bench summarises them as its own.
// engram: the request/response gather: every rank counts its remote rows per owner
// (MPI_Alltoall), sends (layer, local row) requests to the owners (MPI_Alltoallv), the
// owners gather the rows in request order and MPI_Alltoallv them back, and the requester
// puts them in place; its own rows it copies. Per iteration the slowest rank's time; each
// rank hashes its outputs, layer after layer. Data: p2p_data.hpp. Only MPI, the C++
// standard library and nlohmann-json; no epx header. This file is the library
// (epx_mpi_p2p_baseline::run, also called inside an oshrun job by the multi-machine tests);
// mpi_p2p_baseline_main.cpp is the program.
#include "mpi_p2p_baseline.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "p2p_data.hpp"

namespace {

using epx_p2p_data::check_hash;

struct Args {
  std::string op, pattern = "pairs", json;
  std::vector<std::size_t> sizes;
  int messages = 4, iters = 10, warmup = 2, layers = 2, hidden = 256, entries = 24;
  std::int64_t rows = 131072, tokens = 512;
  std::uint64_t seed = 1;
};

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "epx_mpi_p2p_baseline: %s\n", why.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) die("missing the value of " + k);
    const std::string v = argv[++i];
    if (k == "--op") a.op = v;
    else if (k == "--pattern") a.pattern = v;
    else if (k == "--json") a.json = v;
    else if (k == "--sizes") {
      std::stringstream ss(v);
      for (std::string s; std::getline(ss, s, ',');) a.sizes.push_back(std::stoull(s));
    } else if (k == "--messages") a.messages = std::stoi(v);
    else if (k == "--iters") a.iters = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--layers") a.layers = std::stoi(v);
    else if (k == "--hidden") a.hidden = std::stoi(v);
    else if (k == "--entries") a.entries = std::stoi(v);
    else if (k == "--rows") a.rows = std::stoll(v);
    else if (k == "--tokens") a.tokens = std::stoll(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else die("unknown option " + k);
  }
  if (a.op != "pp" && a.op != "engram") die("--op pp|engram");
  if (a.pattern != "pairs" && a.pattern != "ring") die("--pattern pairs|ring");
  if (a.iters < 1 || a.warmup < 0 || a.messages < 1) die("bad --iters / --warmup / --messages");
  return a;
}

double max_over_ranks(double x) {
  double m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

std::string hex(std::uint64_t h) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(h));
  return b;
}

/// One stream iteration: `messages` sends on every link; the receiver's time per message (us),
/// from a 0-byte "go" it sends its sender after the barrier (as epx bench times its own).
double pp_stream(const Args& a, int me, int P, std::vector<unsigned char>& out, const std::vector<unsigned char>& in,
                 std::size_t n) {
  const bool ring = a.pattern == "ring";
  const int dst = ring ? (me + 1) % P : (me % 2 == 0 && me + 1 < P ? me + 1 : -1);
  const int src = ring ? (me + P - 1) % P : (me % 2 == 1 ? me - 1 : -1);
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  MPI_Request go = MPI_REQUEST_NULL;
  if (src >= 0) MPI_Isend(nullptr, 0, MPI_BYTE, src, 2, MPI_COMM_WORLD, &go);
  if (dst >= 0) MPI_Recv(nullptr, 0, MPI_BYTE, dst, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Wait(&go, MPI_STATUS_IGNORE);
  for (int m = 0; m < a.messages; ++m) {
    if (ring && me % 2 == 1) MPI_Recv(out.data(), static_cast<int>(n), MPI_BYTE, src, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (dst >= 0) MPI_Send(in.data(), static_cast<int>(n), MPI_BYTE, dst, 0, MPI_COMM_WORLD);
    if (src >= 0 && !(ring && me % 2 == 1))
      MPI_Recv(out.data(), static_cast<int>(n), MPI_BYTE, src, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  const double us = src >= 0 ? (MPI_Wtime() - t0) * 1e6 / a.messages : 0.0;
  return max_over_ranks(us);
}

/// One ping-pong iteration between 2k and 2k+1 after one untimed round trip: this pair's
/// one-way time (us) on 2k, else 0.
double pp_pingpong(int me, int P, std::vector<unsigned char>& out, const std::vector<unsigned char>& in, std::size_t n) {
  const int peer = me % 2 == 0 ? me + 1 : me - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (peer >= P) return 0;
  constexpr int kRounds = 8;
  auto round = [&] {
    if (me % 2 == 0) {
      MPI_Send(in.data(), static_cast<int>(n), MPI_BYTE, peer, 1, MPI_COMM_WORLD);
      MPI_Recv(out.data(), static_cast<int>(n), MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(out.data(), static_cast<int>(n), MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(in.data(), static_cast<int>(n), MPI_BYTE, peer, 1, MPI_COMM_WORLD);
    }
  };
  round();
  const double t0 = MPI_Wtime();
  for (int k = 0; k < kRounds; ++k) round();
  return me % 2 == 0 ? (MPI_Wtime() - t0) * 1e6 / (2 * kRounds) : 0.0;
}

nlohmann::json run_pp(const Args& a, int me, int P) {
  nlohmann::json results = nlohmann::json::array();
  for (std::size_t n : a.sizes) {
    std::vector<unsigned char> in(n), out(n);
    epx_p2p_data::fill_message(me, n, in.data());
    std::vector<double> stream, pairs;
    std::vector<std::vector<double>> lat;
    for (int i = 0; i < a.warmup + a.iters; ++i) {
      const double s = pp_stream(a, me, P, out, in, n);
      const double l = pp_pingpong(me, P, out, in, n);
      if (i < a.warmup) continue;
      stream.push_back(s);
      std::vector<double> all(static_cast<std::size_t>(P));
      MPI_Gather(&l, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      lat.push_back(all);
    }
    pp_stream(a, me, P, out, in, n);  // the hashed message: the last of a stream
    const bool receiver = a.pattern == "ring" || me % 2 == 1;
    const unsigned long long h = receiver ? check_hash(out.data(), n) : 0;
    std::vector<unsigned long long> hashes(static_cast<std::size_t>(P));
    MPI_Gather(&h, 1, MPI_UNSIGNED_LONG_LONG, hashes.data(), 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    nlohmann::json r = {{"bytes", n}, {"stream_us", stream}};
    nlohmann::json per_pair = nlohmann::json::array(), hs = nlohmann::json::array();
    for (int p = 0; p + 1 < P; p += 2) {
      std::vector<double> v;
      for (const auto& it : lat) v.push_back(it[static_cast<std::size_t>(p)]);
      per_pair.push_back(v);
    }
    for (auto x : hashes) hs.push_back(hex(x));
    r["pair_latency_us"] = per_pair;
    r["hash"] = hs;
    results.push_back(r);
  }
  return {{"op", "pp"}, {"ranks", P}, {"pattern", a.pattern}, {"messages", a.messages}, {"results", results}};
}

/// The request/response gather of one rank: tables [L][N * row], indices [L][T * E].
struct Gather {
  int me = 0, P = 1, L = 0;
  std::int64_t N = 0, count = 0;  // rows per rank per layer, rows asked per layer
  std::size_t row = 0;
  std::vector<std::vector<unsigned char>> tables, out;
  std::vector<std::vector<std::int32_t>> idx;
  // per iteration
  std::vector<int> send_counts, recv_counts, send_displs, recv_displs;
  std::vector<std::int32_t> requests, asked;  // (layer, local row) pairs out / in
  std::vector<std::int64_t> places;            // layer * count + i of each request, in order
  std::vector<unsigned char> replies_out, replies_in;

  void run() {
    send_counts.assign(static_cast<std::size_t>(P), 0);
    requests.clear();
    places.clear();
    for (int p = 0; p < P; ++p)  // requests grouped by owner, then layer, then position
      for (int l = 0; l < L; ++l)
        for (std::int64_t i = 0; i < count; ++i) {
          const std::int32_t g = idx[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)];
          if (g / N != p) continue;
          if (p == me) {
            std::memcpy(out[static_cast<std::size_t>(l)].data() + static_cast<std::size_t>(i) * row,
                        tables[static_cast<std::size_t>(l)].data() + static_cast<std::size_t>(g % N) * row, row);
            continue;
          }
          requests.push_back(l);
          requests.push_back(static_cast<std::int32_t>(g % N));
          places.push_back(l * count + i);
          send_counts[static_cast<std::size_t>(p)] += 2;
        }
    recv_counts.assign(static_cast<std::size_t>(P), 0);
    MPI_Alltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
    displs(send_counts, send_displs);
    const int asked_n = displs(recv_counts, recv_displs);
    asked.resize(static_cast<std::size_t>(asked_n));
    MPI_Alltoallv(requests.data(), send_counts.data(), send_displs.data(), MPI_INT32_T, asked.data(), recv_counts.data(),
                  recv_displs.data(), MPI_INT32_T, MPI_COMM_WORLD);
    replies_out.resize(static_cast<std::size_t>(asked_n / 2) * row);
    for (int k = 0; k < asked_n / 2; ++k)
      std::memcpy(replies_out.data() + static_cast<std::size_t>(k) * row,
                  tables[static_cast<std::size_t>(asked[2 * static_cast<std::size_t>(k)])].data() +
                      static_cast<std::size_t>(asked[2 * static_cast<std::size_t>(k) + 1]) * row,
                  row);
    // rows back, the reverse direction: an owner sends what it was asked, in request order
    std::vector<int> out_bytes(static_cast<std::size_t>(P)), in_bytes(static_cast<std::size_t>(P));
    for (std::size_t p = 0; p < static_cast<std::size_t>(P); ++p) {
      out_bytes[p] = recv_counts[p] / 2 * static_cast<int>(row);
      in_bytes[p] = send_counts[p] / 2 * static_cast<int>(row);
    }
    send_counts = out_bytes;
    recv_counts = in_bytes;
    displs(send_counts, send_displs);
    displs(recv_counts, recv_displs);
    replies_in.resize(places.size() * row);
    MPI_Alltoallv(replies_out.data(), send_counts.data(), send_displs.data(), MPI_BYTE, replies_in.data(),
                  recv_counts.data(), recv_displs.data(), MPI_BYTE, MPI_COMM_WORLD);
    for (std::size_t k = 0; k < places.size(); ++k)
      std::memcpy(out[static_cast<std::size_t>(places[k] / count)].data() + static_cast<std::size_t>(places[k] % count) * row,
                  replies_in.data() + k * row, row);
  }

  static int displs(const std::vector<int>& counts, std::vector<int>& d) {
    d.assign(counts.size(), 0);
    int at = 0;
    for (std::size_t p = 0; p < counts.size(); ++p) d[p] = at, at += counts[p];
    return at;
  }
};

nlohmann::json run_engram(const Args& a, int me, int P) {
  Gather g;
  g.me = me, g.P = P, g.L = a.layers, g.N = a.rows, g.count = a.tokens * a.entries;
  g.row = static_cast<std::size_t>(a.hidden) * 2;
  for (int l = 0; l < a.layers; ++l) {
    g.tables.emplace_back(static_cast<std::size_t>(a.rows) * g.row);
    epx_p2p_data::fill_table_rows(a.seed, l, me * a.rows, a.rows, g.row, g.tables.back().data());
    g.idx.emplace_back(static_cast<std::size_t>(g.count));
    epx_p2p_data::fill_indices(a.seed, me, l, g.count, P * a.rows, g.idx.back().data());
    g.out.emplace_back(static_cast<std::size_t>(g.count) * g.row);
  }
  std::vector<double> times;
  for (int i = 0; i < a.warmup + a.iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    g.run();
    const double us = max_over_ranks((MPI_Wtime() - t0) * 1e6);
    if (i >= a.warmup) times.push_back(us);
  }
  unsigned long long h = 0;
  for (const auto& o : g.out) h += check_hash(o.data(), o.size());
  std::vector<unsigned long long> hashes(static_cast<std::size_t>(P));
  MPI_Gather(&h, 1, MPI_UNSIGNED_LONG_LONG, hashes.data(), 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  nlohmann::json hs = nlohmann::json::array();
  for (auto x : hashes) hs.push_back(hex(x));
  return {{"op", "engram"}, {"ranks", P}, {"max_rank_us", times}, {"hash", hs},
          {"rows_per_rank", static_cast<std::int64_t>(a.layers) * g.count}};
}

}  // namespace

namespace epx_mpi_p2p_baseline {

int run(int argc, char** argv) {
  int me = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const Args a = parse(argc, argv);
  if (a.op == "pp" && P % 2 != 0) die("--op pp needs an even number of ranks");
  const nlohmann::json j = a.op == "pp" ? run_pp(a, me, P) : run_engram(a, me, P);
  int rc = 0;
  if (me == 0 && !a.json.empty()) {
    std::ofstream f(a.json);
    f << j.dump(2) << "\n";
    rc = f ? 0 : 1;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}

}  // namespace epx_mpi_p2p_baseline
