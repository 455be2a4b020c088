// epx_mpi_baseline: what a user writes WITHOUT epx.
//
// The Megatron-style all-to-all token dispatcher over plain MPI, as a baseline to time
// epx against.  It reads an `epx replay` input directory (docs/spec.md §7) and, on
// every iteration:
//
//   dispatch  (1) count the rows for each destination rank (a token goes once to each
//                 unique destination rank of its valid experts), MPI_Alltoall the counts;
//             (2) permute the rows into a send buffer grouped by destination rank
//                 (token ascending inside a destination), with the token's topk_idx and
//                 topk_weights rows as metadata;
//             (3) MPI_Alltoallv the rows and the metadata;
//             (4) restore the requested layout: compact = what alltoallv delivered
//                 (source rank, then token) plus the local recv_topk_idx / weights;
//                 expanded = one row per (token, local slot), grouped by local expert in
//                 (source, token) order, each expert padded to a multiple of A (zero rows).
//   combine   the reverse, with docs/spec.md §4's fixed float32 order: the expert rank
//             reduces each received token's slots to one partial (expanded: f32 sum from
//             0.0f in ascending k, rounded to bf16; a single slot passes unchanged),
//             MPI_Alltoallv back, and the source adds the partials in f32 from 0.0f
//             (compact: ascending destination rank; expanded: ascending largest k of each
//             destination's group) and rounds to bf16 — or, with --node-of-rank, in docs/spec.md
//             section 4's node-first order (each node's partials summed and rounded first,
//             ascending rank; then the nodes' sums in ascending node order), the order of
//             epx's hierarchical node-first combine.  The expert is the identity: y is
//             the dispatch output itself.
//
// It depends only on MPI, the C++ standard library and nlohmann-json: no epx header.
// This file is the library (epx_mpi_baseline::run, bench/mpi_baseline.hpp: `epx bench
// --transport shmem --baseline mpi` calls it inside the oshrun job); mpi_baseline_main.cpp
// is the program:
//
//   mpirun -np P epx_mpi_baseline --routing DIR --iters N --warmup M --json OUT.json
//          [--layout compact|expanded] [--alignment A] [--verify-expert identity|replay]
//          [--node-of-rank N0,N1,...]
//
// After the timed loop every rank hashes (FNV-1a 64) its dispatch output in the requested
// layout and its combine output.  The combine that is hashed uses y = the dispatch output
// (identity expert, as timed), or with --verify-expert replay the fixed expert function of
// `epx replay` (docs/spec.md §7), so the hash equals that of replay's combined_x.npy and
// a wrong float32 addition order shows on order-probe inputs.

#include "mpi_baseline.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

constexpr const char* kProg = "epx_mpi_baseline";

// An input or option error.  `global` errors are seen identically by every rank (options,
// meta.json): only rank 0 reports them.
struct InputError : std::runtime_error {
  InputError(const std::string& msg, bool global_error)
      : std::runtime_error(msg), global(global_error) {}
  bool global;
};

// ---------------------------------------------------------------------------------------
// bf16 and hashing
// ---------------------------------------------------------------------------------------

inline float bf16_to_f32(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffU) > 0x7f800000U) {  // NaN: keep it NaN (quiet)
    return static_cast<std::uint16_t>((u >> 16) | 0x0040U);
  }
  u += 0x7fffU + ((u >> 16) & 1U);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

std::uint64_t fnv1a64(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// ---------------------------------------------------------------------------------------
// Minimal .npy reader (format 1.0 / 2.0 / 3.0, C order, little-endian)
// ---------------------------------------------------------------------------------------

struct Npy {
  std::string descr;
  std::vector<std::int64_t> shape;
  std::vector<char> data;
};

std::string header_value(const std::string& header, const std::string& key,
                         const std::string& path) {
  const std::string k1 = "'" + key + "'";
  auto pos = header.find(k1);
  if (pos == std::string::npos) {
    throw InputError(path + ": .npy header has no '" + key + "' entry", false);
  }
  pos = header.find(':', pos + k1.size());
  if (pos == std::string::npos) {
    throw InputError(path + ": malformed .npy header", false);
  }
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  return header.substr(pos);
}

Npy read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open (missing file?)", false);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(raw[i]); };
  if (raw.size() < 10 || byte(0) != 0x93 || std::memcmp(raw.data() + 1, "NUMPY", 5) != 0) {
    throw InputError(path + ": not a .npy file (bad magic)", false);
  }
  const unsigned major = byte(6);
  std::size_t header_len = 0;
  std::size_t header_start = 0;
  if (major == 1) {
    header_len = byte(8) | (static_cast<std::size_t>(byte(9)) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (raw.size() < 12) throw InputError(path + ": truncated .npy header", false);
    header_len = byte(8) | (static_cast<std::size_t>(byte(9)) << 8) |
                 (static_cast<std::size_t>(byte(10)) << 16) |
                 (static_cast<std::size_t>(byte(11)) << 24);
    header_start = 12;
  } else {
    throw InputError(path + ": unsupported .npy format version " + std::to_string(major),
                     false);
  }
  if (raw.size() < header_start + header_len) {
    throw InputError(path + ": truncated .npy header", false);
  }
  const std::string header(raw.data() + header_start, header_len);
  Npy npy;

  // 'descr': '<i8'
  std::string v = header_value(header, "descr", path);
  if (v.empty() || (v[0] != '\'' && v[0] != '"')) {
    throw InputError(path + ": .npy descr is not a simple dtype string", false);
  }
  const auto close = v.find(v[0], 1);
  if (close == std::string::npos) throw InputError(path + ": malformed .npy descr", false);
  npy.descr = v.substr(1, close - 1);

  v = header_value(header, "fortran_order", path);
  if (v.rfind("False", 0) != 0) {
    throw InputError(path + ": Fortran-order .npy arrays are not supported", false);
  }

  // 'shape': (S, K)  or (N,)  or ()
  v = header_value(header, "shape", path);
  if (v.empty() || v[0] != '(') throw InputError(path + ": malformed .npy shape", false);
  const auto rpar = v.find(')');
  if (rpar == std::string::npos) throw InputError(path + ": malformed .npy shape", false);
  std::string dims = v.substr(1, rpar - 1);
  std::size_t p = 0;
  while (p < dims.size()) {
    while (p < dims.size() && (dims[p] == ' ' || dims[p] == ',')) ++p;
    if (p >= dims.size()) break;
    std::size_t q = p;
    while (q < dims.size() && dims[q] >= '0' && dims[q] <= '9') ++q;
    if (q == p) throw InputError(path + ": malformed .npy shape '" + dims + "'", false);
    npy.shape.push_back(std::stoll(dims.substr(p, q - p)));
    p = q;
    while (p < dims.size() && dims[p] == 'L') ++p;  // old Python 2 longs
  }

  std::size_t itemsize = 0;
  if (npy.descr.size() >= 3) {
    try {
      itemsize = static_cast<std::size_t>(std::stoul(npy.descr.substr(2)));
    } catch (const std::exception&) {
      itemsize = 0;
    }
  }
  if (itemsize == 0) throw InputError(path + ": unsupported .npy dtype " + npy.descr, false);
  std::size_t count = 1;
  for (auto d : npy.shape) count *= static_cast<std::size_t>(d);
  const std::size_t data_start = header_start + header_len;
  const std::size_t bytes = count * itemsize;
  if (raw.size() - data_start != bytes) {
    throw InputError(path + ": .npy data is " + std::to_string(raw.size() - data_start) +
                         " bytes, the header promises " + std::to_string(bytes),
                     false);
  }
  npy.data.assign(raw.begin() + static_cast<std::ptrdiff_t>(data_start), raw.end());
  return npy;
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The array at `path` must have dtype `descr` ('<' or '=' byte order) and 2 dimensions;
// a dimension given as >= 0 must match.
Npy load_2d(const std::string& path, const std::string& descr, std::int64_t rows,
            std::int64_t cols, const std::string& what) {
  Npy a = read_npy(path);
  const bool dtype_ok =
      a.descr == descr || (a.descr.size() == descr.size() && a.descr[0] == '=' &&
                           a.descr.substr(1) == descr.substr(1));
  if (!dtype_ok) {
    throw InputError(path + ": dtype " + a.descr + ", expected " + descr + " (" + what + ")",
                     false);
  }
  if (a.shape.size() != 2 || (rows >= 0 && a.shape[0] != rows) ||
      (cols >= 0 && a.shape[1] != cols)) {
    throw InputError(path + ": shape " + shape_str(a.shape) + ", expected [" +
                         (rows >= 0 ? std::to_string(rows) : std::string("S")) + ", " +
                         std::to_string(cols) + "] (" + what + ")",
                     false);
  }
  return a;
}

// ---------------------------------------------------------------------------------------
// Options and input
// ---------------------------------------------------------------------------------------

struct Options {
  std::string routing;
  std::string json_out;
  std::string layout = "compact";
  int iters = 20;
  int warmup = 5;
  int alignment = 1;
  bool replay_expert = false;
  bool quiet = false;  // no summary line on stdout (the JSON only)
  std::vector<int> node_of_rank;  // --node-of-rank: combine in the node-first order; empty = flat
};

const char* kUsage =
    "usage: mpirun -np P epx_mpi_baseline --routing DIR --iters N --warmup M --json OUT.json\n"
    "                                     [--layout compact|expanded] [--alignment A]\n"
    "                                     [--verify-expert identity|replay] [--quiet]\n"
    "                                     [--node-of-rank N0,N1,... (one node per rank: node-first combine)]";

int parse_int(const std::string& flag, const std::string& v, int lo) {
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || n < lo || n > std::numeric_limits<int>::max()) {
    throw InputError(flag + " wants an integer >= " + std::to_string(lo) + ", got '" + v + "'",
                     true);
  }
  return static_cast<int>(n);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") throw InputError(kUsage, true);
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InputError(a + " needs a value\n" + kUsage, true);
      return argv[++i];
    };
    if (a == "--routing") {
      o.routing = value();
    } else if (a == "--json") {
      o.json_out = value();
    } else if (a == "--layout") {
      o.layout = value();
      if (o.layout != "compact" && o.layout != "expanded") {
        throw InputError("--layout must be compact or expanded, got '" + o.layout + "'", true);
      }
    } else if (a == "--iters") {
      o.iters = parse_int(a, value(), 1);
    } else if (a == "--warmup") {
      o.warmup = parse_int(a, value(), 0);
    } else if (a == "--verify-expert") {
      const std::string v = value();
      if (v != "identity" && v != "replay") {
        throw InputError("--verify-expert must be identity or replay, got '" + v + "'", true);
      }
      o.replay_expert = v == "replay";
    } else if (a == "--quiet") {
      o.quiet = true;
    } else if (a == "--alignment") {
      o.alignment = parse_int(a, value(), 1);
    } else if (a == "--node-of-rank") {
      std::stringstream list(value());
      for (std::string n; std::getline(list, n, ',');) o.node_of_rank.push_back(parse_int(a, n, 0));
    } else {
      throw InputError("unknown option '" + a + "'\n" + kUsage, true);
    }
  }
  if (o.routing.empty()) throw InputError(std::string("--routing DIR is required\n") + kUsage, true);
  if (o.json_out.empty()) throw InputError(std::string("--json OUT.json is required\n") + kUsage, true);
  return o;
}

struct Meta {
  int P = 0, E = 0, H = 0, K = 0, L = 0;
};

Meta read_meta(const std::string& dir, int world) {
  const std::string path = dir + "/meta.json";
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open (missing file?)", true);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what(), true);
  }
  auto get = [&](const char* key, int lo) {
    if (!j.is_object() || !j.contains(key)) {
      throw InputError(path + ": missing key \"" + key + "\"", true);
    }
    const auto& v = j.at(key);
    if (!v.is_number_integer() || v.get<long long>() < lo ||
        v.get<long long>() > std::numeric_limits<int>::max()) {
      throw InputError(path + ": \"" + key + "\" must be an integer >= " + std::to_string(lo) +
                           ", got " + v.dump(),
                       true);
    }
    return static_cast<int>(v.get<long long>());
  };
  Meta m;
  m.P = get("num_ranks", 1);
  m.E = get("num_experts", 1);
  m.H = get("hidden", 1);
  m.K = get("num_topk", 1);
  if (m.P != world) {
    throw InputError(path + ": num_ranks is " + std::to_string(m.P) + " but mpirun started " +
                         std::to_string(world) + " ranks (use -np " + std::to_string(m.P) + ")",
                     true);
  }
  if (m.E % m.P != 0) {
    throw InputError(path + ": num_experts " + std::to_string(m.E) +
                         " is not divisible by num_ranks " + std::to_string(m.P),
                     true);
  }
  m.L = m.E / m.P;
  return m;
}

struct RankInput {
  int S = 0;
  std::vector<std::uint16_t> x;      // [S, H] bf16 bits
  std::vector<std::int64_t> idx;     // [S, K]
  std::vector<float> w;              // [S, K]
};

RankInput read_rank(const std::string& dir, int rank, const Meta& m) {
  const std::string rd = dir + "/rank" + std::to_string(rank);
  RankInput in;
  Npy idx = load_2d(rd + "/topk_idx.npy", "<i8", -1, m.K, "topk_idx [S, K] int64");
  const std::int64_t S = idx.shape[0];
  if (S > std::numeric_limits<int>::max() / std::max(1, m.P)) {
    throw InputError(rd + "/topk_idx.npy: too many tokens (" + std::to_string(S) + ")", false);
  }
  Npy w = load_2d(rd + "/topk_weights.npy", "<f4", S, m.K, "topk_weights [S, K] float32");
  Npy x = load_2d(rd + "/x.npy", "<u2", S, m.H, "x [S, H] bf16 bits");
  in.S = static_cast<int>(S);
  in.idx.resize(static_cast<std::size_t>(S) * m.K);
  in.w.resize(static_cast<std::size_t>(S) * m.K);
  in.x.resize(static_cast<std::size_t>(S) * m.H);
  std::memcpy(in.idx.data(), idx.data.data(), idx.data.size());
  std::memcpy(in.w.data(), w.data.data(), w.data.size());
  std::memcpy(in.x.data(), x.data.data(), x.data.size());
  for (int t = 0; t < in.S; ++t) {
    for (int k = 0; k < m.K; ++k) {
      const std::int64_t e = in.idx[static_cast<std::size_t>(t) * m.K + k];
      if (e < -1 || e >= m.E) {
        throw InputError(rd + "/topk_idx.npy: token " + std::to_string(t) + " slot " +
                             std::to_string(k) + " has expert " + std::to_string(e) +
                             ", expected -1 or 0.." + std::to_string(m.E - 1),
                         false);
      }
      for (int k2 = 0; k2 < k && e >= 0; ++k2) {
        if (in.idx[static_cast<std::size_t>(t) * m.K + k2] == e) {
          throw InputError(rd + "/topk_idx.npy: token " + std::to_string(t) + " names expert " +
                               std::to_string(e) + " twice (slots " + std::to_string(k2) +
                               " and " + std::to_string(k) + ")",
                           false);
        }
      }
    }
  }
  return in;
}

// Every rank passes its own error (empty = none); if any rank has one, the ranks at fault
// report it (a global error only by rank 0) and the job is aborted with exit code 2.
void agree_or_abort(int rank, const std::string& err, bool global_error) {
  int mine = err.empty() ? 0 : 1;
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any == 0) return;
  if (mine != 0 && (!global_error || rank == 0)) {
    std::fprintf(stderr, "%s: error on rank %d: %s\n", kProg, rank, err.c_str());
    std::fflush(stderr);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // One rank aborts the job (several ranks aborting at once make Open MPI's help
  // aggregation log spurious ORTE_ERROR_LOG lines); the others wait to be killed.
  if (rank != 0) MPI_Barrier(MPI_COMM_WORLD);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

template <class T>
T* ptr(std::vector<T>& v) {
  static T dummy{};
  return v.empty() ? &dummy : v.data();
}

// ---------------------------------------------------------------------------------------
// The dispatcher
// ---------------------------------------------------------------------------------------

class Dispatcher {
 public:
  // `node_of_rank`: [P] the node of each rank for the node-first combine order; empty = flat.
  Dispatcher(const Meta& m, int rank, const RankInput& in, bool expanded, int alignment, std::vector<int> node_of_rank = {})
      : m_(m), rank_(rank), in_(in), expanded_(expanded), A_(alignment),
        H_(static_cast<std::size_t>(m.H)), K_(static_cast<std::size_t>(m.K)), node_of_(std::move(node_of_rank)) {
    MPI_Type_contiguous(m.H * 2, MPI_BYTE, &row_t_);
    MPI_Type_commit(&row_t_);
    MPI_Type_contiguous(m.K * 12, MPI_BYTE, &meta_t_);
    MPI_Type_commit(&meta_t_);
    const auto P = static_cast<std::size_t>(m.P);
    send_counts_.assign(P, 0);
    recv_counts_.assign(P, 0);
    sdispl_.assign(P, 0);
    rdispl_.assign(P, 0);
    out_.assign(static_cast<std::size_t>(in.S) * H_, 0);
    acc_.assign(H_, 0.0f);
    node_acc_.assign(H_, 0.0f);
  }
  ~Dispatcher() {
    MPI_Type_free(&row_t_);
    MPI_Type_free(&meta_t_);
  }
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  void dispatch() {
    const int P = m_.P, L = m_.L, S = in_.S;
    const auto K = K_;
    // (1) rows per destination rank, then the counts exchange.
    dest_mark_.assign(static_cast<std::size_t>(S) * P, 0);
    std::fill(send_counts_.begin(), send_counts_.end(), 0);
    for (int t = 0; t < S; ++t) {
      std::uint8_t* mark = &dest_mark_[static_cast<std::size_t>(t) * P];
      for (std::size_t k = 0; k < K; ++k) {
        const std::int64_t e = in_.idx[t * K + k];
        if (e >= 0) {
          const auto d = static_cast<int>(e / L);
          if (!mark[d]) {
            mark[d] = 1;
            ++send_counts_[static_cast<std::size_t>(d)];
          }
        }
      }
    }
    MPI_Alltoall(send_counts_.data(), 1, MPI_INT, recv_counts_.data(), 1, MPI_INT,
                 MPI_COMM_WORLD);
    int ns = 0, nr = 0;
    for (int d = 0; d < P; ++d) {
      sdispl_[static_cast<std::size_t>(d)] = ns;
      rdispl_[static_cast<std::size_t>(d)] = nr;
      ns += send_counts_[static_cast<std::size_t>(d)];
      nr += recv_counts_[static_cast<std::size_t>(d)];
    }
    n_send_ = ns;
    n_recv_ = nr;

    // (2) permute into the send buffer, grouped by destination, token ascending.  Also
    // note, per token, the send-buffer rows in the order combine must add them.
    send_x_.resize(static_cast<std::size_t>(ns) * H_);
    send_meta_.resize(static_cast<std::size_t>(ns) * K * 12);
    comb_rows_.resize(static_cast<std::size_t>(S) * K);
    comb_node_.resize(static_cast<std::size_t>(S) * K);
    comb_n_.assign(static_cast<std::size_t>(S), 0);
    cursor_.assign(sdispl_.begin(), sdispl_.end());
    std::vector<int>& pos = pos_;
    pos.assign(static_cast<std::size_t>(P), -1);
    for (int t = 0; t < S; ++t) {
      const std::uint8_t* mark = &dest_mark_[static_cast<std::size_t>(t) * P];
      const std::size_t tk = static_cast<std::size_t>(t) * K;
      int* rows = &comb_rows_[tk];
      int n = 0;
      for (int d = 0; d < P; ++d) {
        if (!mark[d]) continue;
        const int r = cursor_[static_cast<std::size_t>(d)]++;
        pos[static_cast<std::size_t>(d)] = r;
        std::memcpy(&send_x_[static_cast<std::size_t>(r) * H_], &in_.x[t * H_], H_ * 2);
        char* meta = &send_meta_[static_cast<std::size_t>(r) * K * 12];
        std::memcpy(meta, &in_.idx[tk], K * 8);
        std::memcpy(meta + K * 8, &in_.w[tk], K * 4);
        if (!expanded_) rows[n++] = r;  // compact: ascending destination
      }
      if (expanded_) {  // groups in ascending order of their largest k
        for (std::size_t k = 0; k < K; ++k) {
          const std::int64_t e = in_.idx[tk + k];
          if (e < 0) continue;
          const std::int64_t d = e / L;
          bool last = true;
          for (std::size_t k2 = k + 1; k2 < K; ++k2) {
            if (in_.idx[tk + k2] >= 0 && in_.idx[tk + k2] / L == d) last = false;
          }
          if (last) rows[n++] = pos[static_cast<std::size_t>(d)];
        }
      }
      if (!node_of_.empty()) n = node_first_rows(mark, pos, rows, &comb_node_[tk]);
      comb_n_[static_cast<std::size_t>(t)] = n;
    }

    // (3) the all-to-all of the rows and of the routing metadata.
    recv_x_.resize(static_cast<std::size_t>(nr) * H_);
    recv_meta_.resize(static_cast<std::size_t>(nr) * K * 12);
    MPI_Alltoallv(ptr(send_x_), send_counts_.data(), sdispl_.data(), row_t_, ptr(recv_x_),
                  recv_counts_.data(), rdispl_.data(), row_t_, MPI_COMM_WORLD);
    MPI_Alltoallv(ptr(send_meta_), send_counts_.data(), sdispl_.data(), meta_t_,
                  ptr(recv_meta_), recv_counts_.data(), rdispl_.data(), meta_t_,
                  MPI_COMM_WORLD);

    // (4) restore the layout.
    const std::int64_t base = static_cast<std::int64_t>(rank_) * L;
    num_recv_per_expert_.assign(static_cast<std::size_t>(L), 0);
    if (!expanded_) {
      // DeepEP compact: recv_x is the alltoallv output; local topk ids and weights.
      recv_topk_idx_.resize(static_cast<std::size_t>(nr) * K);
      recv_topk_w_.resize(static_cast<std::size_t>(nr) * K);
      for (int i = 0; i < nr; ++i) {
        const char* meta = &recv_meta_[static_cast<std::size_t>(i) * K * 12];
        for (std::size_t k = 0; k < K; ++k) {
          std::int64_t e;
          float wt;
          std::memcpy(&e, meta + k * 8, 8);
          std::memcpy(&wt, meta + K * 8 + k * 4, 4);
          const bool local = e >= base && e < base + L;
          recv_topk_idx_[i * K + k] = local ? e - base : -1;
          recv_topk_w_[i * K + k] = local ? wt : 0.0f;
          if (local) ++num_recv_per_expert_[static_cast<std::size_t>(e - base)];
        }
      }
      return;
    }
    // Expanded: one row per (token, local slot), grouped by local expert, (source, token)
    // order inside an expert, each expert padded to a multiple of A with zero rows.
    slot_row_.assign(static_cast<std::size_t>(nr) * K, -1);
    for (int i = 0; i < nr; ++i) {
      const char* meta = &recv_meta_[static_cast<std::size_t>(i) * K * 12];
      for (std::size_t k = 0; k < K; ++k) {
        std::int64_t e;
        std::memcpy(&e, meta + k * 8, 8);
        if (e >= base && e < base + L) ++num_recv_per_expert_[static_cast<std::size_t>(e - base)];
      }
    }
    offsets_.assign(static_cast<std::size_t>(L) + 1, 0);
    for (int j = 0; j < L; ++j) {
      const int n = num_recv_per_expert_[static_cast<std::size_t>(j)];
      offsets_[static_cast<std::size_t>(j) + 1] =
          offsets_[static_cast<std::size_t>(j)] + (n + A_ - 1) / A_ * A_;
    }
    n_exp_ = offsets_[static_cast<std::size_t>(L)];
    exp_x_.resize(static_cast<std::size_t>(n_exp_) * H_);
    exp_w_.resize(static_cast<std::size_t>(n_exp_));
    exp_cursor_.assign(offsets_.begin(), offsets_.end() - 1);
    for (int i = 0; i < nr; ++i) {
      const char* meta = &recv_meta_[static_cast<std::size_t>(i) * K * 12];
      for (std::size_t k = 0; k < K; ++k) {
        std::int64_t e;
        std::memcpy(&e, meta + k * 8, 8);
        if (e < base || e >= base + L) continue;
        const int r = exp_cursor_[static_cast<std::size_t>(e - base)]++;
        slot_row_[i * K + k] = r;
        std::memcpy(&exp_x_[static_cast<std::size_t>(r) * H_],
                    &recv_x_[static_cast<std::size_t>(i) * H_], H_ * 2);
        std::memcpy(&exp_w_[static_cast<std::size_t>(r)], meta + K * 8 + k * 4, 4);
      }
    }
    for (int j = 0; j < L; ++j) {  // zero padding rows
      const int from = exp_cursor_[static_cast<std::size_t>(j)];
      const int to = offsets_[static_cast<std::size_t>(j) + 1];
      if (to > from) {
        std::memset(&exp_x_[static_cast<std::size_t>(from) * H_], 0,
                    static_cast<std::size_t>(to - from) * H_ * 2);
        std::fill(exp_w_.begin() + from, exp_w_.begin() + to, 0.0f);
      }
    }
  }

  // The dispatch output in the requested layout: [rows, H] bf16.
  const std::uint16_t* recv_rows_data() const {
    return expanded_ ? exp_x_.data() : recv_x_.data();
  }
  int recv_rows() const { return expanded_ ? n_exp_ : n_recv_; }
  int recv_tokens() const { return n_recv_; }
  int sent_rows() const { return n_send_; }
  int sent_rows_remote() const {
    return n_send_ - send_counts_[static_cast<std::size_t>(rank_)];
  }

  // Combine of y (rows of the dispatch output, same layout) back to [S, H] bf16 in out().
  void combine(const std::uint16_t* y) {
    const auto K = K_;
    const std::uint16_t* partial = y;  // compact: a received token's row is its partial
    if (expanded_) {
      partial_.resize(static_cast<std::size_t>(n_recv_) * H_);
      float* acc = acc_.data();
      for (int i = 0; i < n_recv_; ++i) {
        const int* rows = &slot_row_[static_cast<std::size_t>(i) * K];
        std::uint16_t* dst = &partial_[static_cast<std::size_t>(i) * H_];
        int n = 0, only = -1;
        for (std::size_t k = 0; k < K; ++k) {
          if (rows[k] >= 0) {
            ++n;
            only = rows[k];
          }
        }
        if (n == 1) {  // a single slot passes unchanged
          std::memcpy(dst, y + static_cast<std::size_t>(only) * H_, H_ * 2);
          continue;
        }
        std::fill(acc, acc + H_, 0.0f);
        for (std::size_t k = 0; k < K; ++k) {  // ascending k
          if (rows[k] < 0) continue;
          const std::uint16_t* src = y + static_cast<std::size_t>(rows[k]) * H_;
          for (std::size_t h = 0; h < H_; ++h) acc[h] += bf16_to_f32(src[h]);
        }
        for (std::size_t h = 0; h < H_; ++h) dst[h] = f32_to_bf16(acc[h]);
      }
      partial = partial_.data();
    }
    comb_recv_.resize(static_cast<std::size_t>(n_send_) * H_);
    MPI_Alltoallv(const_cast<std::uint16_t*>(n_recv_ ? partial : &dummy_row_), recv_counts_.data(),
                  rdispl_.data(), row_t_, ptr(comb_recv_), send_counts_.data(), sdispl_.data(),
                  row_t_, MPI_COMM_WORLD);
    // Source side: out[t] = bf16(0.0f + sum of the partials in the fixed order); node
    // first: a node's partials (consecutive in comb_rows_) summed and rounded first, a
    // node with one partial passing it unchanged.
    float* acc = acc_.data();
    float* node_acc = node_acc_.data();
    for (int t = 0; t < in_.S; ++t) {
      std::fill(acc, acc + H_, 0.0f);
      const int* rows = &comb_rows_[static_cast<std::size_t>(t) * K];
      const int* nodes = &comb_node_[static_cast<std::size_t>(t) * K];
      const int n = comb_n_[static_cast<std::size_t>(t)];
      for (int g = 0; g < n;) {
        int end = g + 1;
        while (!node_of_.empty() && end < n && nodes[end] == nodes[g]) ++end;
        const std::uint16_t* src = &comb_recv_[static_cast<std::size_t>(rows[g]) * H_];
        if (end == g + 1) {
          for (std::size_t h = 0; h < H_; ++h) acc[h] += bf16_to_f32(src[h]);
        } else {
          std::fill(node_acc, node_acc + H_, 0.0f);
          for (int i = g; i < end; ++i) {
            const std::uint16_t* row = &comb_recv_[static_cast<std::size_t>(rows[i]) * H_];
            for (std::size_t h = 0; h < H_; ++h) node_acc[h] += bf16_to_f32(row[h]);
          }
          for (std::size_t h = 0; h < H_; ++h) acc[h] += bf16_to_f32(f32_to_bf16(node_acc[h]));
        }
        g = end;
      }
      std::uint16_t* dst = &out_[static_cast<std::size_t>(t) * H_];
      for (std::size_t h = 0; h < H_; ++h) dst[h] = f32_to_bf16(acc[h]);
    }
  }
  const std::vector<std::uint16_t>& out() const { return out_; }

  // The expert function of `epx replay` (docs/spec.md §7) over the dispatch output:
  // y = bf16(f32(row) * g(n)), g(n) = float((n + 1) * 256^(n mod 4)), n = the local expert
  // (expanded) or the sum of the row's local recv_topk_idx (compact); padding rows zero.
  std::vector<std::uint16_t> replay_expert_y() const {
    const int rows = recv_rows();
    const std::uint16_t* x = recv_rows_data();
    std::vector<std::uint16_t> y(static_cast<std::size_t>(rows) * H_, 0);
    auto scale = [&](int row, std::int64_t n) {
      const auto c = static_cast<float>(static_cast<double>(n + 1) *
                                        std::pow(256.0, static_cast<double>(n % 4)));
      for (std::size_t h = 0; h < H_; ++h) {
        y[static_cast<std::size_t>(row) * H_ + h] =
            f32_to_bf16(bf16_to_f32(x[static_cast<std::size_t>(row) * H_ + h]) * c);
      }
    };
    if (expanded_) {
      for (int j = 0; j < m_.L; ++j) {
        const auto ju = static_cast<std::size_t>(j);
        for (int r = offsets_[ju]; r < offsets_[ju] + num_recv_per_expert_[ju]; ++r) scale(r, j);
      }
    } else {
      for (int i = 0; i < rows; ++i) {
        std::int64_t n = 0;
        for (std::size_t k = 0; k < K_; ++k) n += std::max<std::int64_t>(0, recv_topk_idx_[i * K_ + k]);
        scale(i, n);
      }
    }
    return y;
  }


 private:
  // Node first: a token's partials by (node of the destination, destination) ascending;
  // fills rows / nodes, returns their number.
  int node_first_rows(const std::uint8_t* mark, const std::vector<int>& pos, int* rows, int* nodes) const {
    int n = 0, last = 0;
    for (int node : node_of_) last = std::max(last, node);
    for (int node = 0; node <= last; ++node)
      for (int d = 0; d < m_.P; ++d)
        if (mark[d] && node_of_[static_cast<std::size_t>(d)] == node) {
          rows[n] = pos[static_cast<std::size_t>(d)];
          nodes[n++] = node;
        }
    return n;
  }

  Meta m_;
  int rank_;
  const RankInput& in_;
  bool expanded_;
  int A_;
  std::size_t H_, K_;
  std::vector<int> node_of_;
  MPI_Datatype row_t_{}, meta_t_{};
  std::uint16_t dummy_row_ = 0;

  std::vector<int> send_counts_, recv_counts_, sdispl_, rdispl_, cursor_, pos_;
  int n_send_ = 0, n_recv_ = 0, n_exp_ = 0;
  std::vector<std::uint8_t> dest_mark_;
  std::vector<int> comb_rows_, comb_node_, comb_n_;
  std::vector<std::uint16_t> send_x_, recv_x_;
  std::vector<char> send_meta_, recv_meta_;
  std::vector<std::int64_t> recv_topk_idx_;
  std::vector<float> recv_topk_w_;
  std::vector<int> num_recv_per_expert_, offsets_, exp_cursor_, slot_row_;
  std::vector<std::uint16_t> exp_x_;
  std::vector<float> exp_w_;
  std::vector<std::uint16_t> partial_, comb_recv_, out_;
  std::vector<float> acc_, node_acc_;
};

// ---------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------

nlohmann::ordered_json stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  auto pct = [&](double q) {  // nearest rank
    auto r = static_cast<std::size_t>(std::ceil(q * static_cast<double>(n)));
    return v[std::min(n - 1, r == 0 ? 0 : r - 1)];
  };
  nlohmann::ordered_json j;
  j["avg"] = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(n);
  j["p50"] = pct(0.50);
  j["p95"] = pct(0.95);
  j["max"] = v.back();
  return j;
}

}  // namespace

namespace epx_mpi_baseline {

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  Options opt;
  Meta meta;
  {
    std::string err;
    try {
      opt = parse_options(argc, argv);
      meta = read_meta(opt.routing, world);
      if (!opt.node_of_rank.empty() && static_cast<int>(opt.node_of_rank.size()) != meta.P)
        throw InputError("--node-of-rank names " + std::to_string(opt.node_of_rank.size()) + " ranks, the job has " +
                             std::to_string(meta.P),
                         true);
    } catch (const std::exception& e) {
      err = e.what();
    }
    agree_or_abort(rank, err, true);
  }
  RankInput in;
  {
    std::string err;
    try {
      in = read_rank(opt.routing, rank, meta);
    } catch (const std::exception& e) {
      err = e.what();
    }
    agree_or_abort(rank, err, false);
  }

  const bool expanded = opt.layout == "expanded";
  Dispatcher disp(meta, rank, in, expanded, opt.alignment, opt.node_of_rank);

  std::vector<double> d_us, c_us;
  d_us.reserve(static_cast<std::size_t>(opt.iters));
  c_us.reserve(static_cast<std::size_t>(opt.iters));
  for (int it = 0; it < opt.warmup + opt.iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    disp.dispatch();
    const double t1 = MPI_Wtime();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t2 = MPI_Wtime();
    disp.combine(disp.recv_rows_data());  // identity expert: y = the dispatch output
    const double t3 = MPI_Wtime();
    if (it >= opt.warmup) {
      d_us.push_back((t1 - t0) * 1e6);
      c_us.push_back((t3 - t2) * 1e6);
    }
  }

  // Verification of the last iteration's outputs.
  const std::uint64_t dh = fnv1a64(disp.recv_rows_data(),
                                   static_cast<std::size_t>(disp.recv_rows()) * meta.H * 2);
  if (opt.replay_expert) {
    const std::vector<std::uint16_t> y = disp.replay_expert_y();
    disp.combine(y.empty() ? nullptr : y.data());
  }
  const std::uint64_t ch = fnv1a64(disp.out().data(), disp.out().size() * 2);

  // Per-iteration max over ranks, per-rank averages and per-rank facts to rank 0.
  const auto N = static_cast<int>(d_us.size());
  std::vector<double> d_max(d_us.size()), c_max(c_us.size());
  MPI_Reduce(d_us.data(), d_max.data(), N, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(c_us.data(), c_max.data(), N, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  double avgs[2] = {std::accumulate(d_us.begin(), d_us.end(), 0.0) / N,
                    std::accumulate(c_us.begin(), c_us.end(), 0.0) / N};
  std::vector<double> all_avgs(static_cast<std::size_t>(world) * 2);
  MPI_Gather(avgs, 2, MPI_DOUBLE, all_avgs.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const std::size_t row_bytes = static_cast<std::size_t>(meta.H) * 2;
  unsigned long long facts[7] = {
      static_cast<unsigned long long>(in.S),
      static_cast<unsigned long long>(disp.recv_rows()),
      static_cast<unsigned long long>(disp.recv_tokens()),
      static_cast<unsigned long long>(disp.sent_rows()) * row_bytes,
      static_cast<unsigned long long>(disp.sent_rows_remote()) * row_bytes,
      static_cast<unsigned long long>(dh),
      static_cast<unsigned long long>(ch)};
  std::vector<unsigned long long> all_facts(static_cast<std::size_t>(world) * 7);
  MPI_Gather(facts, 7, MPI_UNSIGNED_LONG_LONG, all_facts.data(), 7, MPI_UNSIGNED_LONG_LONG, 0,
             MPI_COMM_WORLD);

  int write_failed = 0;
  if (rank == 0) {
    using J = nlohmann::ordered_json;
    auto col = [&](int c) {
      J a = J::array();
      for (int r = 0; r < world; ++r) a.push_back(all_facts[static_cast<std::size_t>(r) * 7 + c]);
      return a;
    };
    auto hashes = [&](int c) {
      J a = J::array();
      for (int r = 0; r < world; ++r) a.push_back(hex64(all_facts[static_cast<std::size_t>(r) * 7 + c]));
      return a;
    };
    auto phase = [&](const std::vector<double>& mx, int c) {
      J p;
      p["max_rank_us"] = stats(mx);
      J a = J::array();
      for (int r = 0; r < world; ++r) a.push_back(all_avgs[static_cast<std::size_t>(r) * 2 + c]);
      p["rank_us"] = a;
      return p;
    };
    J j;
    j["tool"] = kProg;
    j["ranks"] = world;
    j["tokens_per_rank"] = col(0);
    j["hidden"] = meta.H;
    j["topk"] = meta.K;
    j["experts"] = meta.E;
    j["layout"] = opt.layout;
    j["alignment"] = opt.alignment;
    j["iters"] = opt.iters;
    j["warmup"] = opt.warmup;
    j["verify_expert"] = opt.replay_expert ? "replay" : "identity";
    j["dispatch"] = phase(d_max, 0);
    j["combine"] = phase(c_max, 1);
    j["recv_rows"] = col(1);
    j["recv_tokens"] = col(2);
    j["dispatch_hash"] = hashes(5);
    j["combine_hash"] = hashes(6);
    j["payload_bytes_per_rank"] = col(3);
    j["remote_payload_bytes_per_rank"] = col(4);
    std::ofstream f(opt.json_out);
    f << j.dump(2) << "\n";
    f.close();
    if (!f) {
      std::fprintf(stderr, "%s: error on rank 0: cannot write %s\n", kProg, opt.json_out.c_str());
      write_failed = 1;
    } else if (!opt.quiet) {
      std::printf("%s: P=%d E=%d H=%d K=%d layout=%s iters=%d  dispatch avg %.1f us p50 %.1f "
                  "p95 %.1f | combine avg %.1f us p50 %.1f p95 %.1f  -> %s\n",
                  kProg, world, meta.E, meta.H, meta.K, opt.layout.c_str(), opt.iters,
                  j["dispatch"]["max_rank_us"]["avg"].get<double>(),
                  j["dispatch"]["max_rank_us"]["p50"].get<double>(),
                  j["dispatch"]["max_rank_us"]["p95"].get<double>(),
                  j["combine"]["max_rank_us"]["avg"].get<double>(),
                  j["combine"]["max_rank_us"]["p50"].get<double>(),
                  j["combine"]["max_rank_us"]["p95"].get<double>(), opt.json_out.c_str());
    }
  }
  MPI_Bcast(&write_failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return write_failed ? 1 : 0;
}

}  // namespace epx_mpi_baseline
