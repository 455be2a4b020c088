// The pieces both sides of elastic groups use: losing ranks (elastic.cpp: agree_survivors,
// rebuild_group, sum_over_group) and joining them (joins.cpp: request_ranks, admit, the
// door). Internal to epx_transport; defined in elastic.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "control_block.hpp"
#include "epx/spi/backoff.hpp"
#include "shm/shm_transport.hpp"

namespace epx::detail {

inline constexpr auto kRunning = static_cast<std::int32_t>(RankState::kRunning);
inline constexpr auto kFailed = static_cast<std::int32_t>(RankState::kFailed);

/// `t` as the shm transport of a group not rebuilt yet, or throws (kUnsupported, kBadHandle)
/// naming `what`.
ShmTransport& elastic_shm(Transport& t, const char* what);

/// Which ranks of `t`'s group have ended for good, for a wait loop: a death recorded (by the
/// launcher, or by a peer that saw the process end) or the rank left the group (its
/// transport was destroyed: done) on every look; without a launcher, the processes
/// themselves (/proc) at most every 10 ms per rank.
class LossWatch {
 public:
  explicit LossWatch(const ShmTransport& t)
      : t_(t), lost_(static_cast<std::size_t>(t.num_ranks()), false), next_(lost_.size()) {}
  bool operator()(int p);

 private:
  const ShmTransport& t_;
  std::vector<bool> lost_;
  std::vector<std::chrono::steady_clock::time_point> next_;
};

std::string rank_str(int r);

/// A group rebuilt over the survivors: the shm transport over a new control block (mapped
/// from "/<prefix>ctl"), which checks its members against the launch's control block.
class ElasticShmTransport final : public ShmTransport {
 public:
  ElasticShmTransport(ControlBlock* control, std::size_t control_bytes, int rank, const ShmTransport& parent,
                      std::string prefix, std::vector<int> root_ranks)
      : ElasticShmTransport(control, control_bytes, rank, parent.timeout(), std::move(prefix), parent.root_control(),
                            std::move(root_ranks), parent.launcher_watched(), parent.wait_hook()) {}

  /// A group without a parent transport in this process (a joiner's first group).
  ElasticShmTransport(ControlBlock* control, std::size_t control_bytes, int rank, std::chrono::milliseconds timeout,
                      std::string prefix, ControlBlock* root, std::vector<int> root_ranks, bool launched,
                      std::function<void()> wait_hook);
  ~ElasticShmTransport() override;

  ControlBlock* root_control() const noexcept override { return root_; }
  int root_rank(int p) const noexcept override { return root_ranks_[static_cast<std::size_t>(p)]; }
  bool launcher_watched() const noexcept override { return launched_; }

  /// Collective: every member has mapped the control block (then its name can go).
  void join(const char* phase) { bootstrap_barrier(phase); }

 protected:
  void check_alive(const char* phase) const override;

 private:
  std::size_t control_bytes_;
  ControlBlock* root_;
  std::vector<int> root_ranks_;
  bool launched_;
};

/// Spin-then-yield until done(); false once the timeout has passed.
template <class Done>
bool wait_for(std::chrono::milliseconds timeout, Done done) {
  spi::Backoff backoff(timeout);
  while (!done())
    if (!backoff.step()) return done();
  return true;
}

/// The bytes of a control block for P ranks, whole pages.
std::size_t block_bytes(int P);

/// Maps the existing segment `name` (`bytes` of it); MAP_FAILED if there is none.
void* map_block(const std::string& name, std::size_t bytes);

}  // namespace epx::detail
