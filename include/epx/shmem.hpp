// epx/shmem.hpp — ranks started by oshrun / mpirun: the OpenSHMEM runtime as a Bootstrap,
// and what the shmem transport did per peer.
//
//   auto boot = epx::shmem_bootstrap();                       // rank = PE, size = #PEs
//   auto t = epx::connect(*boot, {.kind = epx::ConnectKind::kShmem});
//   epx::Buffer buffer(*t, config);
//
// Built only with Open MPI's OpenSHMEM (CMake option EPX_WITH_SHMEM, on when oshcc is
// found); otherwise every function here throws kUnsupported naming what is missing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/transport.hpp"

namespace epx {

/// True when this build has the OpenSHMEM transport.
bool shmem_available() noexcept;

/// How the first shmem_bootstrap() of a process starts the OpenSHMEM runtime (later calls
/// reuse the running runtime and ignore these).
struct ShmemOptions {
  /// The symmetric heap of each PE, which holds every window the shmem transport allocates
  /// (one shmem_malloc block per window). 0 = epx's default: what the launcher set
  /// (`-x SMA_SYMMETRIC_SIZE=...` or `-x SHMEM_SYMMETRIC_HEAP_SIZE=...`, the names Open MPI
  /// 4.1 reads; `SHMEM_SYMMETRIC_SIZE`, the OpenSHMEM 1.4 name, which Open MPI 4.1 ignores,
  /// is passed on as SMA_SYMMETRIC_SIZE), else this node's physical memory divided by the
  /// PEs on it (OMPI_COMM_WORLD_LOCAL_SIZE), at least Open MPI's 256 MiB: only touched pages
  /// cost memory, so every set of windows that fits in the machine fits in the heap (the
  /// engine still checks each window against the memory available). A value here overrides
  /// the launcher's.
  std::size_t heap_bytes = 0;
};

/// Collective over every PE of the job: initialises OpenSHMEM (shmem_init_thread with
/// SHMEM_THREAD_MULTIPLE; kUnsupported if the runtime offers less) on first use and returns
/// a Bootstrap whose rank/size are shmem_my_pe()/shmem_n_pes(). Before the first init it
/// sets, where the launcher has not, what epx needs from Open MPI 4.1: the heap above and
/// `osc ucx` (OMPI_MCA_osc; with the default osc every PE crashes in shmem_finalize), so a
/// plain `oshrun -np N program` works (shmem_runtime_info() says what was set).
/// allgather puts each rank's
/// blob into a symmetric buffer on every PE, then shmem_barrier_all; barrier is
/// shmem_barrier_all. Those two have no deadline of their own (setup traffic only; the
/// launcher or a `timeout` bounds them): the data plane's waits do (ConnectOptions::timeout).
/// The runtime is finalised when the last bootstrap and transport made from it are gone;
/// it cannot be started again in the same process.
std::unique_ptr<Bootstrap> shmem_bootstrap(const ShmemOptions& options = {});

/// The OpenSHMEM runtime this process started (after shmem_bootstrap()).
struct ShmemRuntimeInfo {
  std::size_t heap_bytes = 0;      ///< this PE's symmetric heap (0: unknown, the launcher's value did not parse)
  std::string heap_from;           ///< e.g. "SMA_SYMMETRIC_SIZE=4G (the launcher)", "epx default: ..."
  std::vector<std::string> set_by_epx;  ///< the settings epx made because the launcher had not, e.g. "OMPI_MCA_osc=ucx"
};
/// kUnsupported before the runtime was started (or in a build without the shmem transport).
ShmemRuntimeInfo shmem_runtime_info();

/// How the shmem transport reaches one peer, and what it sent there (this rank's view).
struct ShmemPeerInfo {
  int peer = -1;
  int node = -1;                ///< the peer's node (discover_nodes numbering)
  bool mapped = false;          ///< shmem_ptr gave a pointer: puts are plain copies
  std::uint64_t puts = 0;       ///< put / put_flagged calls to this peer since allocate()
  std::uint64_t put_bytes = 0;  ///< their bytes (flag words and signals not counted)
  /// Of put_bytes, those into the window's payload region (rows; spi::PayloadRegionListener, told by the engine),
  /// the rest being headers and metadata.
  std::uint64_t payload_bytes = 0;
};

/// Per peer (index = peer rank) of a transport made by connect(kShmem); throws
/// kInvalidArgument for any other transport. Counters are since the last allocate().
std::vector<ShmemPeerInfo> shmem_peer_info(const Transport& transport);

}  // namespace epx
