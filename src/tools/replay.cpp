#include "replay.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "epx/error.hpp"
#include "npy.hpp"

namespace fs = std::filesystem;

namespace epx::tools {

ReplayMeta read_replay_meta(const fs::path& in) {
  const fs::path path = in / "meta.json";
  std::ifstream f(path);
  if (!f) throw Error(ErrorCode::kIo, path.string() + ": cannot open (expected SPEC 7's meta.json)");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kIo, path.string() + ": not valid JSON: " + e.what());
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
  } else {
    for (int r = 0; r < m.num_ranks; ++r) {
      const fs::path idx = in / ("rank" + std::to_string(r)) / "topk_idx.npy";
      NpyArray a;
      try {
        a = read_npy(idx);
      } catch (const Error& e) {
        throw Error(e.code(), "rank " + std::to_string(r) + ": " + e.what(), r);
      }
      if (!a.shape.empty()) m.max_tokens_per_rank = std::max(m.max_tokens_per_rank, a.shape[0]);
    }
  }
  return m;
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
