// eplb_command.cpp — `epx eplb`: plan redundant experts from a measured expert-load matrix.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "epx/eplb.hpp"
#include "epx/error.hpp"
#include "epx/io/file_io.hpp"
#include "epx/io/npy.hpp"

namespace epx::tools {

namespace {

struct EplbOptions {
  std::string weights;
  int replicas = 0;  // 0 = default, see the help text
  int groups = 1;
  int nodes = 1;
  int gpus = 8;
  std::string json;
  CLI::Option* replicas_option = nullptr;
};

struct Weights {
  std::vector<float> values;
  int layers = 0;
  int experts = 0;
};

Weights load_weights(const std::string& file) {
  const NpyArray a = read_npy(file);
  Weights w;
  if (a.shape.size() == 1) {
    w.layers = 1;
    if (a.shape[0] > INT_MAX) throw Error(ErrorCode::kShapeMismatch, "--weights '" + file + "': too many experts");
    w.experts = static_cast<int>(a.shape[0]);
  } else if (a.shape.size() == 2) {
    if (a.shape[0] > INT_MAX || a.shape[1] > INT_MAX) {
      throw Error(ErrorCode::kShapeMismatch, "--weights '" + file + "': too many layers or experts");
    }
    w.layers = static_cast<int>(a.shape[0]);
    w.experts = static_cast<int>(a.shape[1]);
  } else {
    throw Error(ErrorCode::kShapeMismatch, "--weights '" + file +
                                               "': expected shape [layers, experts] or [experts], got " +
                                               std::to_string(a.shape.size()) + " dimensions");
  }
  if (w.layers == 0 || w.experts == 0) {
    throw Error(ErrorCode::kShapeMismatch, "--weights '" + file + "': empty weight matrix (" +
                                               std::to_string(w.layers) + " layers, " + std::to_string(w.experts) +
                                               " experts)");
  }
  const auto n = static_cast<std::size_t>(a.numel());
  w.values.resize(n);
  if (a.descr == "<f4") {
    for (std::size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, a.data.data() + i * 4, 4);
      w.values[i] = v;
    }
  } else if (a.descr == "<f8") {
    for (std::size_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, a.data.data() + i * 8, 8);
      w.values[i] = static_cast<float>(v);  // like torch's weight.float()
    }
  } else {
    throw Error(ErrorCode::kDtypeMismatch, "--weights '" + file + "': dtype " + a.descr + ", expected <f4 or <f8");
  }
  return w;
}

template <typename T>
nlohmann::json rows(const std::vector<T>& v, std::size_t cols) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t i = 0; i + cols <= v.size() && cols > 0; i += cols) {
    out.push_back(
        std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(i), v.begin() + static_cast<std::ptrdiff_t>(i + cols)));
  }
  return out;
}

std::string fmt_load(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// What run_eplb computed, for the text and the JSON.
struct EplbRun {
  Weights w;
  int replicas = 0;
  EplbPlan plan;
  std::vector<double> before, after;              // [layers][gpus] load per GPU
  std::vector<double> ratio_before, ratio_after;  // [layers] max / avg
};

std::string eplb_text(const EplbRun& x, const EplbOptions& o) {
  const int per_gpu = x.replicas / o.gpus;
  const auto R = static_cast<std::size_t>(x.replicas);
  const auto G = static_cast<std::size_t>(o.gpus);
  std::ostringstream out;
  out << "eplb: " << x.w.layers << " layer(s), " << x.w.experts << " logical experts -> " << x.replicas
      << " physical slots on " << o.gpus << " GPUs (" << per_gpu << " per GPU), " << o.nodes << " node(s), " << o.groups
      << " group(s), " << (x.plan.hierarchical ? "hierarchical" : "global") << " policy\n";
  for (int l = 0; l < x.w.layers; ++l) {
    const auto L = static_cast<std::size_t>(l);
    out << "layer " << l << "\n  phy2log:";
    for (std::size_t p = 0; p < R; ++p) out << ' ' << x.plan.phy2log[L * R + p];
    out << "\n";
    double max_b = 0, sum_b = 0, max_a = 0, sum_a = 0;
    for (std::size_t g = 0; g < G; ++g) {
      out << "  gpu " << g << ": experts";
      for (int k = 0; k < per_gpu; ++k)
        out << ' ' << x.plan.phy2log[L * R + g * static_cast<std::size_t>(per_gpu) + static_cast<std::size_t>(k)];
      out << "  load " << fmt_load(x.after[L * G + g]) << " (before " << fmt_load(x.before[L * G + g]) << ")\n";
      max_b = std::max(max_b, x.before[L * G + g]);
      sum_b += x.before[L * G + g];
      max_a = std::max(max_a, x.after[L * G + g]);
      sum_a += x.after[L * G + g];
    }
    out << "  load per GPU before: max " << fmt_load(max_b) << " avg " << fmt_load(sum_b / o.gpus) << " max/avg "
        << fmt_load(x.ratio_before[L]) << "; after: max " << fmt_load(max_a) << " avg " << fmt_load(sum_a / o.gpus)
        << " max/avg " << fmt_load(x.ratio_after[L]) << "\n";
  }
  return out.str();
}

nlohmann::json eplb_json(const EplbRun& x, const EplbOptions& o) {
  const auto R = static_cast<std::size_t>(x.replicas);
  const auto G = static_cast<std::size_t>(o.gpus);
  nlohmann::json j;
  j["weights"] = o.weights;
  j["num_layers"] = x.w.layers;
  j["num_logical_experts"] = x.w.experts;
  j["num_replicas"] = x.replicas;
  j["num_groups"] = o.groups;
  j["num_nodes"] = o.nodes;
  j["num_gpus"] = o.gpus;
  j["policy"] = x.plan.hierarchical ? "hierarchical" : "global";
  j["max_replicas"] = x.plan.max_replicas;
  j["phy2log"] = rows(x.plan.phy2log, R);
  nlohmann::json log2phy = nlohmann::json::array();
  const auto E = static_cast<std::size_t>(x.w.experts);
  const auto M = static_cast<std::size_t>(x.plan.max_replicas);
  for (std::size_t l = 0; l < static_cast<std::size_t>(x.w.layers); ++l) {
    std::vector<std::int64_t> layer(x.plan.log2phy.begin() + static_cast<std::ptrdiff_t>(l * E * M),
                                    x.plan.log2phy.begin() + static_cast<std::ptrdiff_t>((l + 1) * E * M));
    log2phy.push_back(rows(layer, M));
  }
  j["log2phy"] = log2phy;
  j["logcnt"] = rows(x.plan.logcnt, E);
  j["load_before"] = rows(x.before, G);
  j["load_after"] = rows(x.after, G);
  j["max_over_avg_before"] = x.ratio_before;
  j["max_over_avg_after"] = x.ratio_after;
  return j;
}

void run_eplb(const EplbOptions& o) {
  EplbRun x;
  x.w = load_weights(o.weights);
  x.replicas = o.replicas;
  if (o.replicas_option == nullptr || o.replicas_option->count() == 0) {
    // Default: the smallest multiple of --gpus above the expert count (1 to gpus redundant slots).
    if (o.gpus <= 0)
      throw Error(ErrorCode::kInvalidArgument, "eplb: num_gpus must be positive, got " + std::to_string(o.gpus));
    x.replicas = (x.w.experts / o.gpus + 1) * o.gpus;
  }
  x.plan = rebalance_experts(x.w.values, x.w.layers, x.w.experts, x.replicas, o.groups, o.nodes, o.gpus);
  x.before = eplb_gpu_load_without_replicas(x.w.values, x.w.layers, x.w.experts, o.gpus);
  x.after = eplb_gpu_load(x.plan, x.w.values, o.gpus);
  x.ratio_before = eplb_max_over_avg(x.before, x.w.layers, o.gpus);
  x.ratio_after = eplb_max_over_avg(x.after, x.w.layers, o.gpus);
  std::cout << eplb_text(x, o) << std::flush;
  if (!o.json.empty()) write_text_file(o.json, "--json", eplb_json(x, o).dump() + "\n");
}

}  // namespace

void add_eplb_command(CLI::App& app) {
  auto opts = std::make_shared<EplbOptions>();
  CLI::App* sub = app.add_subcommand(
      "eplb",
      "Plan redundant experts (DeepSeek EPLB) from an expert-load matrix and report the per-GPU load before and "
      "after.");
  sub->add_option("--weights", opts->weights,
                  "Expert loads, .npy of <f4 or <f8, shape [layers, experts] or [experts] (one layer)")
      ->required();
  opts->replicas_option =
      sub->add_option("--replicas", opts->replicas,
                      "Physical expert slots per layer, a multiple of --gpus and >= experts "
                      "[default: the smallest multiple of --gpus greater than the number of experts]");
  sub->add_option("--groups", opts->groups,
                  "Expert groups; the hierarchical policy is used when groups % nodes == 0 (experts must then be "
                  "divisible by groups), else the global one")
      ->capture_default_str();
  sub->add_option("--nodes", opts->nodes, "Nodes; --gpus must be a multiple of it")->capture_default_str();
  sub->add_option("--gpus", opts->gpus, "GPUs in total")->capture_default_str();
  sub->add_option("--json", opts->json,
                  "Also write the plan and loads as JSON: phy2log, log2phy, logcnt, load_before, load_after, "
                  "max_over_avg_before, max_over_avg_after and the parameters");
  sub->callback([opts]() { run_eplb(*opts); });
}

}  // namespace epx::tools
