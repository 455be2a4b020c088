// `epx sim ledger`: what one MoE layer moves per EP size — the closed form next to the
// engine's own counters on the real routing (sim transport). docs/sim.md §6.
#pragma once

#include <string>
#include <vector>

#include "epx/sim/runner/run.hpp"

namespace epx::tools {

/// Expected unique destination ranks per token when each of k experts lands on one of R
/// ranks independently and uniformly: R * (1 - (1 - 1/R)^k).
double expected_unique_ranks(int ranks, int topk);
/// The same for k distinct experts out of E (E/R per rank, no expert twice per token, as
/// top-k routing picks them): R * (1 - C(E - E/R, k) / C(E, k)).
double expected_unique_ranks_distinct(int ranks, int experts, int topk);

/// Logical bytes of one row (README definition): dispatch x (H fp8 or 2H bf16) + float32
/// scales (H/128*4 with fp8) + metadata (topk_idx K*8 + topk_weights K*4); combine 2H (bf16
/// partial, the routing weights applied at the expert rank: nothing else travels back).
double dispatch_row_bytes(int hidden, int topk, bool fp8);
double combine_row_bytes(int hidden);

struct LedgerRow {
  int ep = 0;
  std::int64_t tokens = 0;  ///< S per rank
  // Closed form.
  double unique = 0;           ///< R (1 - (1 - 1/R)^k)
  double unique_distinct = 0;  ///< k distinct experts of E
  double local_fraction = 0;   ///< 1/R of a token's rows stay on its rank
  double dispatch_token_bytes = 0, combine_token_bytes = 0;  ///< per token, all its rows (local included)
  double layer_rank_bytes = 0;  ///< per layer per rank to other ranks, dispatch + combine
  // Measured: the engine's counters (puts and their bytes, dispatch handle rows) on the
  // routing it ran, averaged over ranks. Includes whatever the engine sends besides rows
  // (headers, its metadata record).
  double unique_measured = 0;  ///< received rows / tokens
  double local_fraction_measured = 0;  ///< dispatch bytes into the own window / all
  double dispatch_token_bytes_measured = 0, combine_token_bytes_measured = 0;
  double layer_rank_bytes_measured = 0;
  // Cross-server bytes per layer per rank (dispatch + combine), when the topology has
  // servers of G ranks (servers > 1): flat = every row to another server's rank crosses;
  // hierarchical = a token crosses to each other server it reaches once (one row there,
  // the partials summed there before one crosses back).
  int servers = 1, server_size = 0;
  double cross_flat = 0, cross_hier = 0;  ///< closed form: (R-G)(1-(1-1/R)^k), (N-1)(1-(1-1/N)^k) rows
  double cross_flat_measured = 0;  ///< the sim transport's per-peer bytes of the engine run (rotated)
  double cross_hier_routing = 0;   ///< counted on the routing: other servers each token reaches
};

/// Runs the engine once per o.ep (compact layout, model-only, counters on) and fills the rows.
std::vector<LedgerRow> ledger(const SimOptions& o);
std::string ledger_table(const std::vector<LedgerRow>& rows, const SimOptions& o);
std::string ledger_json(const std::vector<LedgerRow>& rows);
std::string ledger_svg(const std::vector<LedgerRow>& rows);

}  // namespace epx::tools
