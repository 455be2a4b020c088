// One fetch of an EngramBuffer (implementer header): the indices, what each layer still
// needs, the views once a layer is done, and the path counters. The buffer makes it; the
// hooks (EngramFetch::layer) finish layer by layer through `Core`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "epx/dataplane.hpp"
#include "epx/engram.hpp"
#include "epx/transport.hpp"
#include "layout.hpp"

namespace epx::engram {

enum class Path { kLocal, kMapped, kGet, kServed };
const char* to_string(Path p) noexcept;

/// What the hooks need of the buffer: valid while the buffer lives (State checks `live`).
struct Core {
  Transport* endpoint = nullptr;
  std::byte* window = nullptr;
  std::size_t num_bytes = 0;  // the fetch area; storage follows
  const Layout* layout = nullptr;
  Path path = Path::kLocal;
  int rank = 0;
  const std::byte* zero_row = nullptr;  // row_bytes zeros: the source of a -1 entry
  const std::byte* zero_sf = nullptr;   // sf_row_bytes zeros
  bool yield = false;                   // ranks outnumber the cores: waits yield at once (spi::await_signal)
  /// The served path's requests and replies: tail (the signal ordered after the puts) or
  /// explicit (a quiet first), the support table's pick for the transport (spi/kind_support.hpp).
  Protocol served_protocol = Protocol::kExplicit;
};

struct FetchState {
  /// The buffer's fetch counter: this fetch is stale once it differs from `generation`
  /// (a later fetch, or destroy(), which sets it to 0).
  std::shared_ptr<std::uint64_t> live;
  std::uint64_t generation = 0;
  Core core;
  std::shared_ptr<const void> keep;  // the endpoint: the outputs' window stays mapped
  const std::int32_t* indices = nullptr;  // [L, T, E'], the caller's: only while fetch() runs
  std::int64_t num_tokens = 0;
  std::vector<char> done;  // per layer
  std::vector<const std::byte*> bases;  // per owner: its window here (this rank's, a mapped peer's), else null
  /// Per (layer, row) of the fetch: where the row (and its scale row) can be read here (the
  /// zero row for -1), null for rows another path moves (plan_rows).
  std::vector<const std::byte*> src, src_sf;
  /// Served path: per layer, the output positions of the served rows in reply order, the
  /// first reply row of the layer, and the reply signal value that completes it.
  std::vector<std::vector<std::int32_t>> served_pos;
  std::vector<std::size_t> reply_base;
  std::vector<std::uint64_t> reply_target;
  EngramFetchStats stats;
  /// Get path: the buffer's flag "gets issued, not yet quieted" (shared with the buffer).
  std::shared_ptr<bool> gets_pending;

  bool stale() const noexcept { return !live || *live != generation; }
};

}  // namespace epx::engram
