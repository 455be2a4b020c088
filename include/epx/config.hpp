// epx/config.hpp — what an EP buffer (epx::EPBuffer, epx/buffer.hpp) is sized and agreed for.
// Every rank of the group passes the same values (the constructor checks this collectively).
//
//   epx::EPConfig c{.num_experts = 256, .hidden = 7168, .num_topk = 8, .max_tokens_per_rank = 4096};
//   epx::EPBuffer ep(transport, c);
//
// epx::EPConfig is the name to use (one `Kind(Transport&, KindConfig)` shape for every buffer
// kind: EPConfig, BucketConfig, PPConfig, EngramConfig); BufferConfig is the same type under
// its first name, kept for existing code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "epx/dataplane.hpp"
#include "epx/dtype.hpp"

namespace epx {

struct BufferConfig {
  int num_experts = 0;                   ///< E, a multiple of the number of ranks P
  int hidden = 0;                        ///< H (FP8 dispatch needs H % 128 == 0)
  int num_topk = 0;                      ///< K >= 1
  std::int64_t max_tokens_per_rank = 0;  ///< C: every call has S_r <= C on every rank
  /// Rows this rank's receive area holds; 0 = P * C (every token of every rank). A
  /// dispatch that needs more fails on every rank with kCapacityExceeded.
  std::int64_t max_recv_rows = 0;
  /// Bounded receive areas: rows per source ring (0 = unbounded: a slot for every row this
  /// rank may receive). With a ring, the window holds P x ring_rows rows instead of
  /// max_recv_rows for dispatch, and combine's replies come back in rounds of
  /// max(1, ring_rows / 2) tokens into 2 x P x that many rows instead of
  /// max_tokens_per_rank x min(K, P); senders wait for credits before reusing slots.
  /// Needs the compact or expanded output as a copy (not recv_in_window), a schedule other
  /// than hierarchical and a protocol other than flag.
  std::int64_t ring_rows = 0;
  /// Bytes of this rank's window set aside for dispatch outputs (the output pool): a
  /// compact dispatch output (recv_x, recv_x_scales) is a block of it, and senders put the
  /// rows straight into that block — one copy per row (docs/engine.md, "One copy"). The
  /// returned Tensors keep their block; it returns to the pool when the last of them (and
  /// of any Tensor sharing its storage) is destroyed, from any thread. A receiver whose
  /// pool has no free block big enough for a call's output gets a copy instead
  /// (CallStats::output says which, and why). -1 = auto: room for one output of the
  /// largest size (max_recv_rows x 2H, plus FP8 scales); 0 = no pool: every output is a
  /// copy out of the receive area, and a call right after one of the other kind may put
  /// its rows before the header exchange (rows first). Part of the window: counted in the
  /// memory check before the window is allocated.
  std::int64_t output_pool_bytes = -1;
  /// Worker threads per rank (the SM / vector-core analogue); 0 = auto: the cores of this
  /// machine divided by the ranks on it, at least 1.
  int num_workers = 0;
  /// Record per-worker phase times and put counters of every call (Buffer::last_stats).
  bool collect_stats = false;
  /// Record how long each call waited for each peer (Buffer::peer_waits, epx::Diagnose's
  /// input): on by default, whatever collect_stats says. Off only to measure its cost (a
  /// local setting: ranks may differ).
  bool record_waits = true;
  /// Topology, peer schedule, queues, put aggregation, completion protocol.
  DataPlaneOptions dataplane{};
};

/// The EP buffer's config under the name that matches epx::EPBuffer (the same type).
using EPConfig = BufferConfig;

/// Bytes one dispatch output of `rows` rows of `hidden` columns of `dtype` (FP8: with its
/// float32 scales) takes in the output pool (BufferConfig::output_pool_bytes). The auto pool
/// holds one compact output of max_recv_rows; an expanded output has a row per slot (plus
/// each expert's padding), so a pool for expanded one-copy outputs is sized with this.
std::size_t output_block_bytes(std::int64_t rows, int hidden, DType dtype) noexcept;

}  // namespace epx
