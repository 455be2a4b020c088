// epx/bootstrap.hpp — how the ranks of a job find each other before any window exists.
//
// A Bootstrap is the job's out-of-band channel: rank, size, an all-gather of small byte
// blobs and a barrier. It carries only setup traffic (segment names, sizes, config checks,
// which ranks share a node); rows never go through it. epx's own launcher (epx/launch.hpp)
// provides one, so do the OpenSHMEM/MPI runtime (ranks started by oshrun / mpirun) and a
// torch.distributed group (the Python package); a transport is created from a bootstrap
// (epx/connect.hpp) whichever launcher started the processes.
//
// Collectiveness: allgather and barrier are collective over all size() ranks and must be
// called by every rank in the same order, from one thread per rank.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace epx {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  /// This process's rank, 0 <= rank() < size().
  virtual int rank() const noexcept = 0;
  /// Ranks in the job (P >= 1).
  virtual int size() const noexcept = 0;

  /// Collective: every rank contributes `bytes` bytes from `in` (the same `bytes` on every
  /// rank); `out` (size() * bytes, caller-owned) receives rank r's bytes at r * bytes.
  /// Throws epx::Error (kPeerFailed / kTimeout) if the job's runtime reports a failure.
  virtual void allgather(const void* in, void* out, std::size_t bytes) = 0;

  /// Collective: returns when every rank has called it.
  virtual void barrier() = 0;

  /// A short name for messages and reports ("fork", "mpi", "shmem", "torch", ...).
  virtual const char* name() const noexcept = 0;
};

/// A Bootstrap over two callables, for runtimes epx does not link (the Python binding
/// backs it with a torch.distributed group). `allgather(in, out, bytes)` must behave as
/// Bootstrap::allgather; barrier() is an allgather of one byte.
class FunctionBootstrap final : public Bootstrap {
 public:
  using AllgatherFn = std::function<void(const void* in, void* out, std::size_t bytes)>;
  FunctionBootstrap(int rank, int size, AllgatherFn allgather, std::string name = "function");

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  void allgather(const void* in, void* out, std::size_t bytes) override;
  void barrier() override;
  const char* name() const noexcept override { return name_.c_str(); }

 private:
  int rank_;
  int size_;
  AllgatherFn allgather_;
  std::string name_;
};

/// Collective: every rank's `mine` (any length, different per rank), indexed by rank.
/// Two all-gathers through `bootstrap` (the lengths, then the strings padded to the longest).
std::vector<std::string> allgather_strings(Bootstrap& bootstrap, const std::string& mine);

/// Collective setup step: runs `step` on this rank (a rank with nothing to do passes a step
/// that does nothing), then all-gathers whether it threw. If any rank's step threw, every
/// rank throws the same epx::Error: the lowest failing rank's code and message, with
/// origin_rank = the rank that error named (or, if it named none, the rank that threw).
/// Exceptions other than epx::Error become kInternal naming the rank. A kTimeout or
/// kPeerFailed from the step is rethrown at once on its rank, without the agreement: a
/// dead or silent peer cannot take part in it.
void agree_on_step(Bootstrap& bootstrap, const std::function<void()>& step);

/// Which ranks share a node, i.e. can map each other's POSIX shared memory: ranks whose
/// kernel boot id and `/dev/shm` filesystem are the same (two network namespaces with
/// private /dev/shm mounts are two nodes, as two machines would be).
struct NodeMap {
  std::vector<int> node_of_rank;  ///< [P]: node index, numbered in order of each node's lowest rank
  int num_nodes = 0;
  /// Ranks of `node`, ascending.
  std::vector<int> ranks_of(int node) const;
  /// Ranks per node if every node has the same count, else 0.
  int uniform_ranks_per_node() const noexcept;
  /// "builtin:servers:L" (epx/topology.hpp) when every node holds L consecutive ranks, else "".
  std::string servers_topology() const;
};

/// Collective: all-gathers each rank's node identity through `bootstrap`.
NodeMap discover_nodes(Bootstrap& bootstrap);

/// This process's node identity (boot id, /dev/shm device and hostname), as compared by
/// discover_nodes. Local.
std::string local_node_identity();

}  // namespace epx
