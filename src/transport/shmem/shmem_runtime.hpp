// The OpenSHMEM runtime of this process (one per process) and the symmetric blocks epx's
// shmem transports took from its heap.
//
// Calls over every PE of the job (shmem_malloc, shmem_free, shmem_barrier_all, and
// shmem_finalize's barrier) cannot complete once a PE died, so after a loss (lost(): a
// rebuild left PEs out) or a failure (failed(): a wait timed out) epx makes none: a block
// a transport gives back is kept ("orphaned") instead of freed, and a group rebuilt over
// the survivors takes its windows from those blocks (reuse_block: the best fit, split when
// much bigger; pieces that touch again are joined) and from the reserve
// EPX_SHMEM_ELASTIC_RESERVE kept at the first connect. Every survivor gave back the same
// blocks in the same order (the calls are collective), so each picks the same one; the
// group checks that before using it (shmem_elastic.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "epx/shmem.hpp"
#include "shmem/shmem_settings.hpp"

namespace epx::detail {

class ShmemControl;

class ShmemRuntime {
 public:
  /// Starts the runtime on first use (shmem_init_thread), else returns the running one;
  /// kUnsupported once it was finalised.
  static std::shared_ptr<ShmemRuntime> acquire(const ShmemOptions& options = {});
  /// The running runtime's settings; kUnsupported if none runs.
  static ShmemRuntimeInfo info();
  ~ShmemRuntime();

  /// A wait timed out (a peer may be gone): teardown skips the calls over every PE.
  static bool failed() noexcept { return failed_.load(std::memory_order_acquire); }
  static void mark_failed() noexcept { failed_.store(true, std::memory_order_release); }
  /// A rebuild left PEs out: no call over every PE can complete any more.
  static bool lost() noexcept { return lost_.load(std::memory_order_acquire); }
  static void mark_lost() noexcept {
    lost_.store(true, std::memory_order_release);
    mark_failed();
  }
  /// The job has spare PEs (EPX_SHMEM_SPARES) outside the group: from its first connect on,
  /// no call over every PE either (the spares make none), but nothing failed.
  static void mark_partial() noexcept { lost_.store(true, std::memory_order_release); }

  /// This PE's symmetric heap as epx set or read it (0: unknown).
  std::size_t heap_bytes() const noexcept { return settings_.heap_bytes; }
  const std::string& heap_from() const noexcept { return settings_.heap_from; }
  /// Bytes of the heap epx's transports hold now (every window of every endpoint).
  std::atomic<std::size_t>& heap_in_use() noexcept { return in_use_; }

  /// A block shmem_malloc gave a transport.
  void register_block(std::byte* base, std::size_t bytes);
  /// The block was shmem_free'd.
  void unregister_block(std::byte* base);
  /// The block's transport is gone (or gave it back after a failure) without freeing it (a
  /// free is collective): it stays in the heap, free for reuse_block.
  void orphan_block(std::byte* base);
  /// The smallest orphaned block of at least `bytes` (the lowest address among equals),
  /// taken; nullptr if none. `*got`: its size.
  std::byte* reuse_block(std::size_t bytes, std::size_t* got);
  /// The orphaned blocks' sizes, for messages ("none", "2: 1.0 MiB, 4.0 KiB").
  std::string orphans() const;

  /// The words of the elastic calls (agreement, sums, the survivors' barriers), made by the
  /// first connect (collective over every PE, while all live); null before.
  std::shared_ptr<ShmemControl> control() const;
  void set_control(std::shared_ptr<ShmemControl> c);

  /// Every PE's node and whether shmem_ptr maps its heap here, as the first connect found
  /// them (a group over any PEs of the job takes its ranks' from here).
  void set_pes(std::vector<int> node_of_pe, std::vector<bool> mapped_pe);
  int node_of_pe(int pe) const;
  bool mapped_pe(int pe) const;

 private:
  explicit ShmemRuntime(ShmemSettings settings) : settings_(std::move(settings)) {}
  static std::mutex& mu();
  static std::weak_ptr<ShmemRuntime>& current();
  static inline bool started_ = false;
  static inline std::atomic<bool> failed_{false};
  static inline std::atomic<bool> lost_{false};
  ShmemSettings settings_;
  std::atomic<std::size_t> in_use_{0};
  struct Block {
    std::size_t bytes = 0;
    bool orphan = false;
  };
  mutable std::mutex blocks_mu_;
  std::map<std::byte*, Block> blocks_;  // by address: the same order on every PE (symmetric heap)
  std::shared_ptr<ShmemControl> control_;
  std::vector<int> node_of_pe_;
  std::vector<bool> mapped_pe_;
};

}  // namespace epx::detail
