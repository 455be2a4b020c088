// The MPI baseline's input (mpi_baseline_input.hpp): options, meta.json and the ranks'
// .npy files.
#include "mpi_baseline_input.hpp"

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

namespace epx_mpi_baseline::detail {
namespace {

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

// The header dictionary's descr, fortran_order (False only) and shape.
Npy parse_npy_header(const std::string& header, const std::string& path) {
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
  return npy;
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
  Npy npy = parse_npy_header(header, path);

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

// Every expert id is -1 or 0..E-1, and no token names an expert twice.
void check_expert_ids(const RankInput& in, const Meta& m, const std::string& rd) {
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
}

}  // namespace

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
  check_expert_ids(in, m, rd);
  return in;
}

// Every rank passes its own error (empty = none); if any rank has one, the ranks at fault

}  // namespace epx_mpi_baseline::detail
