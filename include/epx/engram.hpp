// epx/engram.hpp — EngramBuffer: rows fetched from tables sharded across the ranks of a
// group (DeepEP V2.5's EngramBuffer), on every transport.
//
//   epx::EngramConfig c{.num_entries_per_layer = {131072, 131072}, .hidden = 256,
//                       .num_max_tokens = 512, .num_entries_per_token = 24};
//   epx::EngramBuffer engram(transport, c);                    // collective: sized for c, set_config(c)
//   engram.write({shard0, shard1});                            // collective: this rank's rows
//   epx::EngramFetch f = engram.fetch(indices);                // int32 [L, T, E']
//   epx::EngramLayer l1 = f.layer(1);                          // waits for layer 1 only
//
// DeepEP's two steps are kept and equivalent: a window of explicit sizes, then the tables'
// shape (a buffer sized once for the largest tables, set_config'ed for several):
//   auto [bytes, storage] = epx::EngramBuffer::get_storage_size_hint(P, c);
//   epx::EngramBuffer engram(transport, bytes, storage);       // collective
//   engram.set_config(c);                                      // collective
//
// Semantics (docs/spec.md §10): layer l's table has P * N_l rows of H values (bf16, or FP8 E4M3
// with num_sf_packs float32 scales per row); global row g lives on rank g / N_l as its
// local row g % N_l. fetch gives out_l[t, e*H:(e+1)*H] = table_l[indices[l, t, e]] bitwise
// (FP8: the data and its scale row); -1 gives a zero row (zero scales).
//
// How rows move (EngramFetchStats says which path each row took): rows of this rank are
// copied locally; rows of a peer whose window is mapped here (shm, threads) are read in
// place; with a transport offering one-sided gets (OpenSHMEM across machines) they are
// read by gets; otherwise (the simulator) each owner serves the rows asked of it inside
// the fetch, which is then collective: every rank calls fetch the same number of times,
// and an index outside the table on one rank fails the fetch on every rank. On the other
// paths fetch is local: a bad index fails the call on the calling rank only.
//
// A buffer is used by one thread at a time; an EngramFetch may be used by another thread
// than the one that made it, one at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "epx/buffer_base.hpp"
#include "epx/tensor.hpp"
#include "epx/transport.hpp"

namespace epx {

/// The most layers an EngramBuffer holds.
inline constexpr int kMaxEngramLayers = 128;

/// The tables' shape (set_config), and what an EngramBuffer is built for with
/// `epx::EngramBuffer engram(transport, config)` (the shape of every buffer kind: EPConfig,
/// BucketConfig, PPConfig). Every rank passes the same values.
struct EngramConfig {
  /// N_l: rows of layer l on each rank (1..kMaxEngramLayers layers, each N_l >= 1).
  std::vector<std::int64_t> num_entries_per_layer;
  std::int64_t hidden = 0;                 ///< H >= 1 (FP8: a multiple of 128)
  std::int64_t num_max_tokens = 0;         ///< T_max >= 1: most tokens one fetch asks for
  std::int64_t num_entries_per_token = 0;  ///< E' >= 1: rows per token
  DType dtype = DType::kBF16;              ///< kBF16 or kFP8E4M3
  /// float32 scales per row: 0 for bf16, H / 128 for FP8 (docs/spec.md §1; -1: the default for dtype).
  std::int64_t num_sf_packs = -1;
};

/// What an EngramBuffer's window needs (DeepEP's pair): the fetch area (outputs, and the
/// requests of the served path) and the storage (this rank's shards and scales).
struct EngramSizes {
  std::size_t num_bytes = 0;
  std::size_t num_storage_bytes = 0;
};

/// Which way a fetch's rows came.
struct EngramFetchStats {
  std::int64_t rows = 0;         ///< L * T * E'
  std::int64_t rows_padding = 0; ///< -1 entries (zero rows)
  std::int64_t rows_local = 0;   ///< owned by this rank
  std::int64_t rows_mapped = 0;  ///< read in place from a mapped peer window
  std::int64_t rows_get = 0;     ///< read by one-sided gets
  std::int64_t rows_served = 0;  ///< served by their owner inside the fetch
  std::uint64_t bytes = 0;       ///< data + scale bytes written to the outputs
  const char* path = "";         ///< "mapped", "get" or "served": how remote rows move
};

/// One layer's output: data [T, E' * H] (bf16 or FP8), and for FP8 scales [T, E' * S] f32.
/// Views of the buffer's window, valid until the next fetch (or destroy()).
struct EngramLayer {
  TensorView data;
  TensorView scales;  ///< empty for bf16
  /// Keeps the window mapped while held (even after destroy(); not after the transport).
  std::shared_ptr<const void> keep;
};

class EngramBuffer;
namespace engram {
struct FetchState;  // the implementation's (src/engram/fetch_state.hpp)
}

/// The hooks of one fetch: layer(l) may be called for any layer, in any order, any number
/// of times; the first call for l waits for (or does) layer l's rows only.
class EngramFetch {
 public:
  EngramFetch() = default;
  EngramFetch(EngramFetch&&) noexcept;
  EngramFetch& operator=(EngramFetch&&) noexcept;
  ~EngramFetch();

  /// L, the layers of the fetch (0 for an empty EngramFetch).
  int num_layers() const noexcept;
  /// Waits for layer l and returns its views. Throws kInvalidArgument for l outside
  /// 0..num_layers()-1, kBadHandle once a later fetch (or destroy) made this one stale,
  /// kTimeout / kPeerFailed on the served path as any wait does.
  EngramLayer layer(int l);
  /// The path counters (complete once every layer was waited for).
  EngramFetchStats stats() const;

 private:
  friend class EngramBuffer;
  explicit EngramFetch(std::shared_ptr<engram::FetchState> s);
  std::shared_ptr<engram::FetchState> state_;
};

class EngramBuffer : public BufferBase {
 public:
  /// Local: window sizes for `config` on `num_ranks` ranks (what set_config needs).
  /// Throws kInvalidArgument for a config set_config would refuse.
  static EngramSizes get_storage_size_hint(int num_ranks, const EngramConfig& config);

  /// Collective: the `Kind(Transport&, KindConfig)` shape every buffer kind shares. A window
  /// sized for `config` on the transport's ranks (get_storage_size_hint), then
  /// set_config(config): the same as the two steps below. Throws kInvalidArgument locally for a
  /// config get_storage_size_hint refuses (every rank alike when every rank passes it), and as
  /// those two steps throw otherwise. `transport` must outlive the buffer.
  EngramBuffer(Transport& transport, const EngramConfig& config)
      : EngramBuffer(transport, get_storage_size_hint(transport.num_ranks(), config)) {
    set_config(config);
  }
  /// Collective: a window of sizes.num_bytes + sizes.num_storage_bytes, as below.
  EngramBuffer(Transport& transport, const EngramSizes& sizes)
      : EngramBuffer(transport, sizes.num_bytes, sizes.num_storage_bytes) {}
  /// Collective (DeepEP's constructor): a window of num_bytes + num_storage_bytes (every rank
  /// the same, else kInvalidArgument on every rank); set_config follows before write / fetch.
  /// Throws kCapacityExceeded if it does not fit in memory.
  EngramBuffer(Transport& transport, std::size_t num_bytes, std::size_t num_storage_bytes);
  /// Calls destroy() if the caller did not (collective then; errors are swallowed).
  ~EngramBuffer() override;

  /// Collective: the tables' shape. Every rank passes the same config, which must fit in
  /// the window's two parts (kCapacityExceeded naming the part and both sizes). Previous
  /// tables are forgotten (write again).
  void set_config(const EngramConfig& config);

  /// Collective: this rank's shard of every layer, tables[l] [N_l, H] of config.dtype, and
  /// for FP8 sfs[l] float32 [N_l, S] (this rank's scale rows) or [P * N_l, S] (the whole
  /// table's, as DeepEP takes them: this rank's rows are used). A wrong count, shape or
  /// dtype on any rank fails the call on every rank, before any table changes.
  void write(const std::vector<TensorView>& tables, const std::vector<TensorView>& sfs = {});
  /// write() with a binding's own verdict on its inputs (a tensor it could not read): agreed
  /// with the ranks' other problems, so it too fails the call on every rank.
  void write(const std::vector<TensorView>& tables, const std::vector<TensorView>& sfs,
             const std::optional<CallProblem>& caller_problem);

  /// Fetches indices int32 [L, T, E'] (T <= num_max_tokens) for every layer; returns the
  /// hooks. Collective on the served path only (see above). Errors: kDtypeMismatch /
  /// kShapeMismatch for indices, kInvalidArgument naming layer, token, entry and value for
  /// an index outside [-1, P * N_l), kInvalidArgument before set_config / write.
  EngramFetch fetch(const TensorView& indices);
  /// fetch() with a binding's own verdict on `indices` (on the served path agreed like the
  /// fetch's own checks; elsewhere thrown on this rank).
  EngramFetch fetch(const TensorView& indices, const std::optional<CallProblem>& caller_problem);

  const EngramConfig& config() const noexcept { return config_; }
  /// "mapped", "get" or "served": how this buffer moves remote rows on its transport.
  const char* path() const noexcept;

 private:
  void on_destroy() noexcept override;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  EngramConfig config_;
};

}  // namespace epx
