// eplb.cpp — DeepSeek's EPLB planner (eplb.py), see epx/eplb.hpp.
//
// The structure follows eplb.py function by function; comments give the torch expression each
// loop reproduces. Weights and loads are float32 throughout, as in the original.
#include "epx/eplb.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <string>

#include "epx/error.hpp"

namespace epx {

namespace {

using Index = std::int64_t;

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "eplb: " + message);
}

std::size_t sz(Index v) {
  return static_cast<std::size_t>(v);
}

// balanced_packing on one row of n items into num_packs packs of n / num_packs items each.
void balanced_packing_row(const float* weight, int n, int num_packs, Index* pack_index, Index* rank_in_pack) {
  const int per_pack = n / num_packs;
  if (per_pack == 1) {  // eplb.py: pack_index = arange(n), rank_in_pack = 0
    for (int i = 0; i < n; ++i) {
      pack_index[i] = i;
      rank_in_pack[i] = 0;
    }
    return;
  }
  // indices = weight.sort(-1, descending=True).indices (stable on ties)
  std::vector<int> order(sz(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight[a] > weight[b]; });
  std::vector<float> pack_weights(sz(num_packs), 0.0f);
  std::vector<int> pack_items(sz(num_packs), 0);
  for (int item : order) {
    // pack = min((p for p in range(num_packs) if pack_items[p] < per_pack), key=pack_weights.__getitem__)
    int pack = -1;
    for (int p = 0; p < num_packs; ++p) {
      if (pack_items[sz(p)] >= per_pack) continue;
      if (pack < 0 || pack_weights[sz(p)] < pack_weights[sz(pack)]) pack = p;
    }
    pack_index[item] = pack;
    rank_in_pack[item] = pack_items[sz(pack)];
    pack_weights[sz(pack)] += weight[item];
    ++pack_items[sz(pack)];
  }
}

// replicate_experts on one row: n logical experts onto num_phy physical slots.
void replicate_row(const float* weight, int n, int num_phy, Index* phy2log, Index* rank, Index* logcnt) {
  for (int i = 0; i < n; ++i) {
    phy2log[i] = i;
    rank[i] = 0;
    logcnt[i] = 1;
  }
  for (int i = n; i < num_phy; ++i) {
    // redundant = (weight / logcnt).max(dim=-1).indices  (first index on ties)
    int best = 0;
    float best_value = weight[0] / static_cast<float>(logcnt[0]);
    for (int j = 1; j < n; ++j) {
      const float value = weight[j] / static_cast<float>(logcnt[j]);
      if (value > best_value) {
        best = j;
        best_value = value;
      }
    }
    phy2log[i] = best;
    rank[i] = logcnt[best];
    ++logcnt[best];
  }
}

// Step 1 of the hierarchical policy: pack groups to nodes, numbering the logical experts
// node-major (log2mlog, and its inverse mlog2log: [num_log] each).
// tokens_per_group = weight.unflatten(-1, (G, group_size)).sum(-1)
void pack_groups_to_nodes(const float* weight, int num_log, int num_groups, int num_nodes, std::vector<Index>& log2mlog,
                          std::vector<Index>& mlog2log) {
  const int group_size = num_log / num_groups;
  const int groups_per_node = num_groups / num_nodes;
  std::vector<float> tokens_per_group(sz(num_groups), 0.0f);
  for (int g = 0; g < num_groups; ++g) {
    float sum = 0.0f;
    for (int k = 0; k < group_size; ++k) sum += weight[g * group_size + k];
    tokens_per_group[sz(g)] = sum;
  }
  std::vector<Index> group_pack(sz(num_groups)), group_rank(sz(num_groups));
  balanced_packing_row(tokens_per_group.data(), num_groups, num_nodes, group_pack.data(), group_rank.data());
  // log2mlog = ((group_pack * groups_per_node + group_rank) * group_size)[:, None] + arange(group_size)
  log2mlog.assign(sz(num_log), 0);
  mlog2log.assign(sz(num_log), 0);
  for (int g = 0; g < num_groups; ++g) {
    for (int k = 0; k < group_size; ++k) {
      log2mlog[sz(g * group_size + k)] = (group_pack[sz(g)] * groups_per_node + group_rank[sz(g)]) * group_size + k;
    }
  }
  for (int e = 0; e < num_log; ++e) mlog2log[sz(log2mlog[sz(e)])] = e;
}

// Step 3: pack each node's physical experts to its GPUs; returns pphy2phy [num_phy] (per
// node row: the physical expert at each packed position).
// tokens_per_phy = (tokens_per_mlog / mlogcnt).gather(-1, phy2mlog)
std::vector<Index> pack_physical_to_gpus(const std::vector<float>& tokens_per_mlog, const std::vector<Index>& phy2mlog,
                                         const std::vector<Index>& mlogcnt, int num_log, int num_phy, int num_nodes,
                                         int num_gpus) {
  const int phy_per_gpu = num_phy / num_gpus;
  const int log_per_node = num_log / num_nodes;
  const int phy_per_node = num_phy / num_nodes;
  const int gpus_per_node = num_gpus / num_nodes;
  std::vector<float> tokens_per_phy(sz(num_phy));
  for (int node = 0; node < num_nodes; ++node) {
    for (int p = 0; p < phy_per_node; ++p) {
      const Index m = node * log_per_node + phy2mlog[sz(node * phy_per_node + p)];
      tokens_per_phy[sz(node * phy_per_node + p)] = tokens_per_mlog[sz(m)] / static_cast<float>(mlogcnt[sz(m)]);
    }
  }
  std::vector<Index> pack_index(sz(num_phy)), rank_in_pack(sz(num_phy));
  for (int node = 0; node < num_nodes; ++node) {
    balanced_packing_row(tokens_per_phy.data() + node * phy_per_node, phy_per_node, gpus_per_node,
                         pack_index.data() + node * phy_per_node, rank_in_pack.data() + node * phy_per_node);
  }
  // phy2pphy = pack_index * phy_per_gpu + rank_in_pack; pphy2phy = inverse(phy2pphy)   (per node row)
  std::vector<Index> pphy2phy(sz(num_phy));
  for (int node = 0; node < num_nodes; ++node) {
    const int base = node * phy_per_node;
    for (int p = 0; p < phy_per_node; ++p) {
      const Index pphy = pack_index[sz(base + p)] * phy_per_gpu + rank_in_pack[sz(base + p)];
      pphy2phy[sz(base + pphy)] = p;
    }
  }
  return pphy2phy;
}

// rebalance_experts_hierarchical for one layer. Outputs: phy2log [num_phy], phyrank [num_phy], logcnt [num_log].
void rebalance_layer_hierarchical(const float* weight, int num_log, int num_phy, int num_groups, int num_nodes,
                                  int num_gpus, Index* out_phy2log, Index* out_phyrank, Index* out_logcnt) {
  const int log_per_node = num_log / num_nodes;
  const int phy_per_node = num_phy / num_nodes;
  std::vector<Index> log2mlog, mlog2log;
  pack_groups_to_nodes(weight, num_log, num_groups, num_nodes, log2mlog, mlog2log);

  // Step 2: replicate within each node. tokens_per_mlog = weight.gather(-1, mlog2log).view(-1, log_per_node)
  std::vector<float> tokens_per_mlog(sz(num_log));
  for (int m = 0; m < num_log; ++m) tokens_per_mlog[sz(m)] = weight[mlog2log[sz(m)]];
  std::vector<Index> phy2mlog(sz(num_phy)), phyrank(sz(num_phy)), mlogcnt(sz(num_log));
  for (int node = 0; node < num_nodes; ++node) {
    replicate_row(tokens_per_mlog.data() + node * log_per_node, log_per_node, phy_per_node,
                  phy2mlog.data() + node * phy_per_node, phyrank.data() + node * phy_per_node,
                  mlogcnt.data() + node * log_per_node);
  }

  const std::vector<Index> pphy2phy =
      pack_physical_to_gpus(tokens_per_mlog, phy2mlog, mlogcnt, num_log, num_phy, num_nodes, num_gpus);
  // pphy2mlog = phy2mlog.gather(-1, pphy2phy) + node * log_per_node; pphy2log = mlog2log.gather(-1, pphy2mlog)
  // pphyrank = phyrank.gather(-1, pphy2phy)
  for (int node = 0; node < num_nodes; ++node) {
    const int base = node * phy_per_node;
    for (int q = 0; q < phy_per_node; ++q) {
      const Index phy = base + pphy2phy[sz(base + q)];
      const Index pphy2mlog = phy2mlog[sz(phy)] + node * log_per_node;
      out_phy2log[base + q] = mlog2log[sz(pphy2mlog)];
      out_phyrank[base + q] = phyrank[sz(phy)];
    }
  }
  // logcnt = mlogcnt.view(num_layers, -1).gather(-1, log2mlog)
  for (int e = 0; e < num_log; ++e) out_logcnt[e] = mlogcnt[sz(log2mlog[sz(e)])];
}

void check_positive(const char* name, int value) {
  if (value <= 0) invalid(std::string(name) + " must be positive, got " + std::to_string(value));
}

void check_weight(const std::vector<float>& weight, int layers, int logical_experts) {
  const auto expected = static_cast<std::size_t>(layers) * static_cast<std::size_t>(logical_experts);
  if (weight.size() != expected) {
    invalid("weight has " + std::to_string(weight.size()) + " values, expected layers * logical_experts = " +
            std::to_string(layers) + " * " + std::to_string(logical_experts) + " = " + std::to_string(expected));
  }
  for (std::size_t i = 0; i < weight.size(); ++i) {
    const float w = weight[i];
    if (std::isnan(w) || std::isinf(w) || w < 0.0f) {
      const auto layer = i / static_cast<std::size_t>(logical_experts);
      const auto expert = i % static_cast<std::size_t>(logical_experts);
      invalid("weight[" + std::to_string(layer) + "][" + std::to_string(expert) + "] is " +
              (std::isnan(w) ? std::string("NaN") : std::to_string(w)) + "; weights must be finite and non-negative");
    }
  }
}

}  // namespace

namespace eplb_detail {

void balanced_packing(const std::vector<float>& weight, int rows, int n, int num_packs,
                      std::vector<std::int64_t>& pack_index, std::vector<std::int64_t>& rank_in_pack) {
  check_positive("rows", rows);
  check_positive("n", n);
  check_positive("num_packs", num_packs);
  if (n % num_packs != 0) {
    invalid("balanced_packing: n = " + std::to_string(n) +
            " is not a multiple of num_packs = " + std::to_string(num_packs));
  }
  check_weight(weight, rows, n);
  pack_index.assign(sz(rows) * sz(n), -1);
  rank_in_pack.assign(sz(rows) * sz(n), -1);
  for (int r = 0; r < rows; ++r) {
    balanced_packing_row(weight.data() + sz(r) * sz(n), n, num_packs, pack_index.data() + sz(r) * sz(n),
                         rank_in_pack.data() + sz(r) * sz(n));
  }
}

void replicate_experts(const std::vector<float>& weight, int rows, int n, int num_phy,
                       std::vector<std::int64_t>& phy2log, std::vector<std::int64_t>& rank,
                       std::vector<std::int64_t>& logcnt) {
  check_positive("rows", rows);
  check_positive("n", n);
  if (num_phy < n) {
    invalid("replicate_experts: num_phy = " + std::to_string(num_phy) + " is less than n = " + std::to_string(n));
  }
  check_weight(weight, rows, n);
  phy2log.assign(sz(rows) * sz(num_phy), -1);
  rank.assign(sz(rows) * sz(num_phy), -1);
  logcnt.assign(sz(rows) * sz(n), 0);
  for (int r = 0; r < rows; ++r) {
    replicate_row(weight.data() + sz(r) * sz(n), n, num_phy, phy2log.data() + sz(r) * sz(num_phy),
                  rank.data() + sz(r) * sz(num_phy), logcnt.data() + sz(r) * sz(n));
  }
}

}  // namespace eplb_detail

EplbPlan rebalance_experts(const std::vector<float>& weight, int layers, int logical_experts, int num_replicas,
                           int num_groups, int num_nodes, int num_gpus) {
  check_positive("layers", layers);
  check_positive("logical_experts", logical_experts);
  check_positive("num_replicas", num_replicas);
  check_positive("num_groups", num_groups);
  check_positive("num_nodes", num_nodes);
  check_positive("num_gpus", num_gpus);
  check_weight(weight, layers, logical_experts);
  if (num_replicas < logical_experts) {
    invalid("num_replicas = " + std::to_string(num_replicas) + " is less than logical_experts = " +
            std::to_string(logical_experts) + "; every logical expert needs at least one physical slot");
  }
  if (num_replicas % num_gpus != 0) {
    invalid("num_replicas = " + std::to_string(num_replicas) + " is not a multiple of num_gpus = " +
            std::to_string(num_gpus) + "; every GPU must hold the same number of physical experts");
  }
  if (num_gpus % num_nodes != 0) {
    invalid("num_gpus = " + std::to_string(num_gpus) + " is not a multiple of num_nodes = " +
            std::to_string(num_nodes) + "; every node must have the same number of GPUs");
  }
  const bool hierarchical = num_groups % num_nodes == 0;
  if (hierarchical && logical_experts % num_groups != 0) {
    invalid("logical_experts = " + std::to_string(logical_experts) + " is not divisible by num_groups = " +
            std::to_string(num_groups) + " (hierarchical policy, since num_groups % num_nodes == 0)");
  }
  const int groups = hierarchical ? num_groups : 1;
  const int nodes = hierarchical ? num_nodes : 1;

  EplbPlan plan;
  plan.layers = layers;
  plan.logical_experts = logical_experts;
  plan.num_replicas = num_replicas;
  plan.hierarchical = hierarchical;
  plan.phy2log.assign(sz(layers) * sz(num_replicas), -1);
  plan.logcnt.assign(sz(layers) * sz(logical_experts), 0);
  std::vector<Index> phyrank(sz(layers) * sz(num_replicas), -1);
  for (int l = 0; l < layers; ++l) {
    rebalance_layer_hierarchical(weight.data() + sz(l) * sz(logical_experts), logical_experts, num_replicas, groups,
                                 nodes, num_gpus, plan.phy2log.data() + sz(l) * sz(num_replicas),
                                 phyrank.data() + sz(l) * sz(num_replicas),
                                 plan.logcnt.data() + sz(l) * sz(logical_experts));
  }
  // log2phy.view(L, -1).scatter_(-1, phy2log * maxlogcnt + phyrank, arange(num_replicas))
  const Index max_cnt = *std::max_element(plan.logcnt.begin(), plan.logcnt.end());
  plan.max_replicas = static_cast<int>(max_cnt);
  plan.log2phy.assign(sz(layers) * sz(logical_experts) * sz(max_cnt), -1);
  for (int l = 0; l < layers; ++l) {
    Index* row = plan.log2phy.data() + sz(l) * sz(logical_experts) * sz(max_cnt);
    for (int p = 0; p < num_replicas; ++p) {
      const std::size_t i = sz(l) * sz(num_replicas) + sz(p);
      row[plan.phy2log[i] * max_cnt + phyrank[i]] = p;
    }
  }
  return plan;
}

std::vector<double> eplb_gpu_load(const EplbPlan& plan, const std::vector<float>& weight, int num_gpus) {
  check_positive("num_gpus", num_gpus);
  if (plan.num_replicas % num_gpus != 0) {
    invalid("num_replicas = " + std::to_string(plan.num_replicas) +
            " is not a multiple of num_gpus = " + std::to_string(num_gpus));
  }
  check_weight(weight, plan.layers, plan.logical_experts);
  const int per_gpu = plan.num_replicas / num_gpus;
  std::vector<double> load(sz(plan.layers) * sz(num_gpus), 0.0);
  for (int l = 0; l < plan.layers; ++l) {
    for (int p = 0; p < plan.num_replicas; ++p) {
      const Index e = plan.phy2log[sz(l) * sz(plan.num_replicas) + sz(p)];
      const std::size_t le = sz(l) * sz(plan.logical_experts) + sz(e);
      load[sz(l) * sz(num_gpus) + sz(p / per_gpu)] +=
          static_cast<double>(weight[le]) / static_cast<double>(plan.logcnt[le]);
    }
  }
  return load;
}

std::vector<double> eplb_gpu_load_without_replicas(const std::vector<float>& weight, int layers, int logical_experts,
                                                   int num_gpus) {
  check_positive("layers", layers);
  check_positive("logical_experts", logical_experts);
  check_positive("num_gpus", num_gpus);
  check_weight(weight, layers, logical_experts);
  std::vector<double> load(sz(layers) * sz(num_gpus), 0.0);
  for (int l = 0; l < layers; ++l) {
    for (int g = 0; g < num_gpus; ++g) {
      const Index begin = Index{g} * logical_experts / num_gpus;
      const Index end = Index{g + 1} * logical_experts / num_gpus;
      double sum = 0.0;
      for (Index e = begin; e < end; ++e) sum += weight[sz(l) * sz(logical_experts) + sz(e)];
      load[sz(l) * sz(num_gpus) + sz(g)] = sum;
    }
  }
  return load;
}

std::vector<double> eplb_max_over_avg(const std::vector<double>& load, int rows, int cols) {
  check_positive("rows", rows);
  check_positive("cols", cols);
  if (load.size() != sz(rows) * sz(cols)) {
    invalid("load has " + std::to_string(load.size()) + " values, expected " + std::to_string(rows) + " * " +
            std::to_string(cols));
  }
  std::vector<double> out(sz(rows));
  for (int r = 0; r < rows; ++r) {
    const double* row = load.data() + sz(r) * sz(cols);
    double sum = 0.0, max = row[0];
    for (int c = 0; c < cols; ++c) {
      sum += row[c];
      max = std::max(max, row[c]);
    }
    const double mean = sum / cols;
    out[sz(r)] = mean > 0.0 ? max / mean : 1.0;
  }
  return out;
}

}  // namespace epx
