#include "epx/io/replay.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "epx/error.hpp"
#include "epx/spi/resources.hpp"
#include "epx/io/npy.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

ReplayMeta read_replay_meta(const fs::path& in) {
  bool given = false;
  ReplayMeta m = read_replay_meta_file(in, &given);
  if (!given) {
    for (int r = 0; r < m.num_ranks; ++r) {
      const fs::path idx = in / ("rank" + std::to_string(r)) / "topk_idx.npy";
      NpyArray a;
      try {
        a = read_npy_header(idx);
      } catch (const Error& e) {
        throw Error(e.code(), "rank " + std::to_string(r) + ": " + e.what(), r);
      }
      if (!a.shape.empty()) m.max_tokens_per_rank = std::max(m.max_tokens_per_rank, a.shape[0]);
    }
  }
  return m;
}

ReplayMeta read_replay_meta_file(const fs::path& in, bool* max_tokens_given) {
  const fs::path path = in / "meta.json";
  // Bounded (a huge or endless meta.json is refused) and parsed whole: trailing bytes after
  // the object are an error, not ignored.
  std::string text;
  try {
    text = detail::read_file_bounded(path.string(), kMaxMetaBytes, "meta.json");
  } catch (const Error& e) {
    throw Error(ErrorCode::kIo, std::string(e.what()) + " (expected docs/spec.md §7's meta.json)");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kIo, path.string() + ": not valid JSON (one object and nothing after it): " + e.what());
  }
  if (!j.is_object()) throw Error(ErrorCode::kIo, path.string() + ": expected a JSON object");
  auto positive = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 1 ||
        j[key].get<std::int64_t>() > (1 << 30))
      throw Error(ErrorCode::kInvalidArgument,
                  path.string() + ": \"" + key + "\" must be a positive integer" +
                      (j.contains(key) ? ", got " + j[key].dump() : std::string(" (missing)")));
    return static_cast<int>(j[key].get<std::int64_t>());
  };
  ReplayMeta m;
  m.num_ranks = positive("num_ranks");
  m.num_experts = positive("num_experts");
  m.hidden = positive("hidden");
  m.num_topk = positive("num_topk");
  if (j.contains("num_max_tokens_per_rank")) {
    const auto& c = j["num_max_tokens_per_rank"];
    if (!c.is_number_integer() || c.get<std::int64_t>() < 0)
      throw Error(ErrorCode::kInvalidArgument,
                  path.string() + ": \"num_max_tokens_per_rank\" must be an integer >= 0, got " + c.dump());
    m.max_tokens_per_rank = c.get<std::int64_t>();
    *max_tokens_given = true;
  } else {
    *max_tokens_given = false;
  }
  return m;
}

namespace {

[[noreturn]] void input_error(int r, ErrorCode code, const std::string& what) {
  throw Error(code, "rank " + std::to_string(r) + ": " + what, r);
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The header of IN/rank<r>/<name>, which must be `descr` [d0, d1] (d0 < 0: any S).
NpyArray expect_header(const fs::path& in, int r, const std::string& name, const char* descr, std::int64_t d0,
                       std::int64_t d1) {
  NpyArray a;
  try {
    a = read_npy_header(in / ("rank" + std::to_string(r)) / name);
  } catch (const Error& e) {
    input_error(r, e.code(), e.what());
  }
  if (a.shape.size() != 2 || (d0 >= 0 && a.shape[0] != d0) || a.shape[1] != d1)
    input_error(r, ErrorCode::kShapeMismatch,
                name + " has shape " + shape_str(a.shape) + ", expected [" + (d0 >= 0 ? std::to_string(d0) : "S") +
                    ", " + std::to_string(d1) + "] (from meta.json and topk_idx.npy)");
  if (a.descr != descr)
    input_error(r, ErrorCode::kDtypeMismatch, name + " has dtype '" + a.descr + "', expected '" + descr + "'");
  return a;
}

}  // namespace

std::int64_t check_replay_rank_inputs(const fs::path& in, const ReplayMeta& m, int r, bool fp8, bool x_optional) {
  const fs::path rd = in / ("rank" + std::to_string(r));
  const NpyArray idx = expect_header(in, r, "topk_idx.npy", "<i8", -1, m.num_topk);
  const std::int64_t S = idx.shape[0];
  if (S > m.max_tokens_per_rank)
    input_error(r, ErrorCode::kCapacityExceeded,
                "topk_idx.npy has S = " + std::to_string(S) + " tokens but num_max_tokens_per_rank is " +
                    std::to_string(m.max_tokens_per_rank));
  if (!x_optional || fs::exists(rd / "topk_weights.npy")) expect_header(in, r, "topk_weights.npy", "<f4", S, m.num_topk);
  if (fp8) {
    expect_header(in, r, "x_fp8.npy", "|u1", S, m.hidden);
    if (m.hidden % 128 != 0)
      input_error(r, ErrorCode::kShapeMismatch, "FP8 input needs hidden % 128 == 0, meta.json says " + std::to_string(m.hidden));
    expect_header(in, r, "x_scales.npy", "<f4", S, m.hidden / 128);
  } else if (!x_optional || fs::exists(rd / "x.npy")) {
    expect_header(in, r, "x.npy", "<u2", S, m.hidden);
  }
  return S;
}

std::vector<std::int64_t> check_replay_inputs(const fs::path& in, const ReplayMeta& m, bool x_optional) {
  std::vector<std::int64_t> tokens;
  const bool fp8 = fs::exists(in / "rank0" / "x_fp8.npy");
  for (int r = 0; r < m.num_ranks; ++r) tokens.push_back(check_replay_rank_inputs(in, m, r, fp8, x_optional));
  return tokens;
}

RankFootprint rank_footprint(int P, int H, int K, std::int64_t S, std::int64_t C, std::int64_t W,
                             std::int64_t output_pool_bytes) {
  using detail::add_sat;
  using detail::mul_sat;
  const std::uint64_t row = mul_sat(2, static_cast<std::uint64_t>(H));
  const std::uint64_t recv_rows = mul_sat(static_cast<std::uint64_t>(P), static_cast<std::uint64_t>(C));
  const std::uint64_t reply_rows = mul_sat(static_cast<std::uint64_t>(C), static_cast<std::uint64_t>(std::min(K, P)));
  const std::uint64_t pool = output_pool_bytes < 0 ? mul_sat(recv_rows, row) : static_cast<std::uint64_t>(output_pool_bytes);
  RankFootprint f;
  // The window holds at least a row per receivable (source, token) and a reply per (token,
  // destination), and the output pool.
  f.window = add_sat(mul_sat(add_sat(recv_rows, reply_rows), row), pool);
  // Inputs (x, topk_idx, topk_weights), the expert output y and — without a pool — recv_x
  // (W rows with --worst), combined_x.
  const std::uint64_t out_rows = std::max(recv_rows, static_cast<std::uint64_t>(std::max<std::int64_t>(W, 0)));
  f.inputs = mul_sat(static_cast<std::uint64_t>(S), add_sat(row, mul_sat(12, static_cast<std::uint64_t>(K))));
  const std::uint64_t outputs = mul_sat(mul_sat(pool > 0 ? 1 : 2, out_rows), row);
  f.total = add_sat(add_sat(f.window, f.inputs), add_sat(outputs, mul_sat(static_cast<std::uint64_t>(S), row)));
  return f;
}

void check_footprint(const std::string& who, const RankFootprint& f, int P, bool shm) {
  detail::check_memory_fits(who, "the window", f.window, P, shm);
  detail::check_memory_fits(who, "the window, inputs and outputs", f.total, P, false);
}

Tensor replay_expert(const DispatchResult& d, RecvLayout layout, int hidden, int num_topk) {
  const std::int64_t rows = d.recv_x.shape()[0], H = hidden;
  const bool fp8 = d.recv_x.dtype() == DType::kFP8E4M3;
  Tensor y = Tensor::zeros(DType::kBF16, {rows, H});
  auto* out = y.as<std::uint16_t>();
  const std::int64_t L = static_cast<std::int64_t>(d.num_recv_tokens_per_expert.size());
  for (std::int64_t i = 0; i < rows; ++i) {
    std::int64_t n = -1;  // -1: padding row
    if (layout == RecvLayout::kExpanded) {
      for (std::int64_t j = 0; j < L; ++j)
        if (i >= d.expert_offsets[static_cast<std::size_t>(j)] &&
            i < d.expert_offsets[static_cast<std::size_t>(j)] + d.num_recv_tokens_per_expert[static_cast<std::size_t>(j)])
          n = j;
    } else if (d.recv_src.as<std::int64_t>()[i * 2] >= 0) {
      n = 0;
      for (int k = 0; k < num_topk; ++k) n += std::max<std::int64_t>(0, d.recv_topk_idx.as<std::int64_t>()[i * num_topk + k]);
    }
    if (n < 0) continue;
    const float c = static_cast<float>((n + 1) << (8 * (n % 4)));
    for (std::int64_t h = 0; h < H; ++h) {
      float v;
      if (fp8)
        v = e4m3_to_f32(d.recv_x.as<std::uint8_t>()[i * H + h]) * d.recv_x_scales.as<float>()[i * (H / 128) + h / 128];
      else
        v = bf16_to_f32(d.recv_x.as<std::uint16_t>()[i * H + h]);
      out[i * H + h] = f32_to_bf16(v * c);
    }
  }
  return y;
}

}  // namespace epx::tools
