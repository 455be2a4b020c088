// The door of an elastic launch: where ranks started while the job runs (epx::request_ranks)
// wait to be admitted (epx::admit). It lives in the launch's anonymous shared mapping, after
// the control block, so the launcher, every rank process and every joiner forked later see
// the same one. The control block there has a slot for every seat too (root rank
// first_root + seat): the launcher records a joiner's death in it as in any rank's, and
// the groups an admission makes read it there (ElasticShmTransport's root ranks).
//
// A seat's life: kFree -> kStarted (the launcher forked its process) -> kKnocking (the
// joiner waits to be invited) -> kClaimed (an admitting group's rank 0 picked it) ->
// kInvited (the invitation is written) -> kAdmitted, or kLeft (not admitted: the door
// closed, nobody invited it within the timeout, or the admission was abandoned). A
// knocking joiner leaves by CAS kKnocking -> kLeft, so it never leaves a seat a leader
// claimed.
//
// A connect()-ed group (ranks another launcher started: torch.distributed, Python's
// epx.launch) has no launcher to fork joiners or record their deaths: its members open a
// door of their own (epx::open_door), a named segment "/<job prefix>door" that a process
// started later maps by name (published through the group's own rendezvous, e.g. torch's
// store). The joiner takes a free seat itself (kFree -> kStarted by CAS), writes its process
// identity there, and the members check that identity (/proc) where a launched group reads
// the launcher's record.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "control_block.hpp"
#include "epx/transport.hpp"

namespace epx::detail {

enum class SeatState : std::uint32_t { kFree = 0, kStarted, kKnocking, kClaimed, kInvited, kAdmitted, kLeft };

struct Seat {
  std::atomic<std::uint32_t> state{0};
  // The invitation, written by the admitting group's rank 0 before state = kInvited.
  std::uint32_t round = 0;          ///< that group's admission round
  std::int32_t new_rank = -1;       ///< the joiner's rank in the new group
  std::int32_t num_ranks = 0;       ///< the new group's P
  std::int32_t old_num_ranks = 0;   ///< the admitting group's P
  std::uint64_t tag = 0;            ///< the members' AdmitOptions::tag
  std::uint64_t control_bytes = 0;  ///< of the new group's control block
  // The joiner's process (a connect()-ed group's door only), written before kKnocking.
  std::int32_t pid = 0;
  std::uint64_t start_time = 0;
  std::uint64_t pid_ns = 0;
  char prefix[160] = {};            ///< the new group's segment prefix; its control block is "/<prefix>ctl"
};

// Aligned as a Seat, so the seats that follow it in memory (seat(i)) are aligned too.
struct alignas(alignof(Seat)) Door {
  std::int32_t first_root = 0;  ///< root rank of seat 0: the launch's num_ranks
  std::int32_t num_seats = 0;   ///< LaunchOptions::spare_ranks
  std::atomic<std::uint32_t> requested{0};  ///< ranks asked for so far (request_ranks)
  std::atomic<std::uint32_t> started{0};    ///< seats the launcher gave a process so far
  std::atomic<std::uint32_t> closed{0};     ///< 1: no admission can come any more (every member ended)

  Seat& seat(int i) noexcept { return reinterpret_cast<Seat*>(this + 1)[i]; }
  static_assert(sizeof(Seat) % alignof(Seat) == 0);
  static std::size_t bytes_for(int seats) noexcept {
    return sizeof(Door) + static_cast<std::size_t>(seats) * sizeof(Seat);
  }
  static Door* create(void* memory, int first_root, int seats) noexcept;
};

/// In the launcher and every process of an elastic launch with spare ranks (set before the
/// ranks are forked): the launch's door and control block. Null elsewhere.
extern Door* g_launch_door;
extern ControlBlock* g_launch_root;

/// A joiner's side of admission (in the process the launcher forked for `seat`, or one that
/// took a seat of a connect()-ed group's door: `root` null): knocks, waits to be invited (at
/// most `timeout`, or until the door closes), then joins the new group and waits for the
/// members' verdict. The group if admitted, null if not. `wait_hook`: the new group's (a
/// connect()-ed group's joiner).
std::unique_ptr<Transport> join_at_door(ControlBlock* root, Door* door, int seat, std::chrono::milliseconds timeout,
                                        std::function<void()> wait_hook = {});

}  // namespace epx::detail
