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

#include <cstdint>
#include <memory>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/transport.hpp"

namespace epx {

/// True when this build has the OpenSHMEM transport.
bool shmem_available() noexcept;

/// Collective over every PE of the job: initialises OpenSHMEM (shmem_init_thread with
/// SHMEM_THREAD_MULTIPLE; kUnsupported if the runtime offers less) on first use and returns
/// a Bootstrap whose rank/size are shmem_my_pe()/shmem_n_pes(). allgather puts each rank's
/// blob into a symmetric buffer on every PE, then shmem_barrier_all; barrier is
/// shmem_barrier_all. Those two have no deadline of their own (setup traffic only; the
/// launcher or a `timeout` bounds them): the data plane's waits do (ConnectOptions::timeout).
/// The runtime is finalised when the last bootstrap and transport made from it are gone;
/// it cannot be started again in the same process.
std::unique_ptr<Bootstrap> shmem_bootstrap();

/// How the shmem transport reaches one peer, and what it sent there (this rank's view).
struct ShmemPeerInfo {
  int peer = -1;
  int node = -1;                ///< the peer's node (discover_nodes numbering)
  bool mapped = false;          ///< shmem_ptr gave a pointer: puts are plain copies
  std::uint64_t puts = 0;       ///< put / put_flagged calls to this peer since the transport was made (its endpoints' included)
  std::uint64_t put_bytes = 0;  ///< their bytes (flag words and signals not counted)
  /// Of put_bytes, those into the window's payload region (rows; spi::PayloadRegionListener, told by the engine),
  /// the rest being headers and metadata.
  std::uint64_t payload_bytes = 0;
};

/// Per peer (index = peer rank) of a transport made by connect(kShmem); throws
/// kInvalidArgument for any other transport. Counters run from the transport's making and
/// include every endpoint's (every buffer's) puts: take differences around what you measure.
std::vector<ShmemPeerInfo> shmem_peer_info(const Transport& transport);

}  // namespace epx
