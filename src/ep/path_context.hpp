// What a data path unit (paths/*.cpp) may use of its Buffer, and nothing else of
// Buffer::Impl: the Setup (read only: config, ranks, topology, geometry, payload policy),
// the call in progress (CallContext: epoch, stats, waits, staging), and the engine's
// services by name — workers and timers, the Sender (channels.cpp) and await_rows (the
// completion protocol's receive side), the dispatch rows' building blocks (dispatch.cpp)
// and the combine's replies and reduction (combine.cpp). Three references, passed by
// value; every service is an inline forward (no cost per row).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "engine.hpp"

namespace epx::detail {

class PathContext {
 public:
  using Impl = Buffer::Impl;
  PathContext(Impl& m) noexcept : setup(m), call(m), m_(m) {}  // NOLINT: every call step converts its Impl

  const Setup& setup;
  CallContext& call;

  // Workers, timers, waits, statistics (stats.cpp).
  void run_workers(const std::function<void(int)>& task) const { m_.run_workers(task); }
  Impl::PhaseTimer timer(int worker, Phase phase) const { return Impl::PhaseTimer(m_, worker, phase); }
  Impl::WaitClock::time_point lap_wait(int w, int s, Impl::WaitClock::time_point since) const noexcept {
    return m_.lap_wait(w, s, since);
  }
  int wait_source(int i) const noexcept { return m_.wait_source(i); }
  void count_put(WorkerStats& ws, int peer, std::size_t bytes, int queue) const noexcept { m_.count_put(ws, peer, bytes, queue); }
  /// Worker w's statistics when collecting, else null.
  WorkerStats* stats_of(int w) const noexcept {
    return setup.config.collect_stats ? &call.stats.workers[static_cast<std::size_t>(w)] : nullptr;
  }

  // Puts and their completion (channels.cpp, protocol.hpp).
  Impl::Sender sender(int worker, std::size_t first_signal, const std::vector<std::uint64_t>& channel_bytes,
                      const std::vector<int>& peers) const {
    return Impl::Sender(m_, worker, first_signal, channel_bytes, peers);
  }
  void await_rows(Impl::CompletionSlot slot, const char* phase, const std::vector<std::int64_t>& begin,
                  std::initializer_list<Impl::RowGroup> groups, const Impl::SourceLanded* landed = nullptr) const {
    m_.await_rows(slot, phase, begin, groups, landed);
  }

  // Dispatch rows (dispatch.cpp).
  void stage_meta(const HandleState& h) const { m_.stage_meta(h); }
  void stage_scales(const HandleState& h, const DispatchArgs& a) const { m_.stage_scales(h, a); }
  void put_segment(Impl::Sender& send, const HandleState& h, const DispatchArgs& a, const std::vector<std::int32_t>* expert_base,
                   int d, std::int64_t p0, std::int64_t p1, std::int64_t base, const Landing& at) const {
    m_.put_segment(send, h, a, expert_base, d, p0, p1, base, at);
  }
  void put_segment_rows(Impl::Sender& send, const HandleState& h, const DispatchArgs& a, int d, std::int64_t p0, std::int64_t p1,
                        std::int64_t base, const Landing& at, bool run_scales) const {
    m_.put_segment_rows(send, h, a, d, p0, p1, base, at, run_scales);
  }
  void put_segment_scales(Impl::Sender& send, const HandleState& h, const DispatchArgs& a, int d, std::int64_t p0,
                          std::int64_t p1, std::int64_t base, const Landing& at) const {
    m_.put_segment_scales(send, h, a, d, p0, p1, base, at);
  }
  void put_segment_meta(Impl::Sender& send, const HandleState& h, const DispatchArgs& a,
                        const std::vector<std::int32_t>* expert_base, int d, std::int64_t p0, std::int64_t p1,
                        std::int64_t base) const {
    m_.put_segment_meta(send, h, a, expert_base, d, p0, p1, base);
  }
  void fill_meta(RowMetaView row, const HandleState& h, const DispatchArgs& a, int d, std::int32_t t,
                 const std::vector<std::int32_t>& expert_base) const {
    m_.fill_meta(row, h, a, d, t, expert_base);
  }

  // Combine replies and the reduction (combine.cpp).
  void send_replies(const HandleState& h, const CombineArgs& a, bool signal, bool relayed = true) const {
    m_.send_replies(h, a, signal, relayed);
  }
  std::pair<std::int64_t, std::int64_t> reply_slice(const HandleState& h, int s, int w) const { return m_.reply_slice(h, s, w); }
  void reserve_reply_stage(const HandleState& h) const { m_.reserve_reply_stage(h); }
  std::vector<std::uint64_t> reply_channel_bytes(const HandleState& h, int w, bool relayed = true) const {
    return m_.reply_channel_bytes(h, w, relayed);
  }
  Impl::Replies replies(const HandleState& h, const CombineArgs& a, int worker) const { return Impl::Replies(m_, h, a, worker); }
  void put_replies(Impl::Sender& send, Impl::Replies& replies, const HandleState& h, const CombineArgs& a, int peer, int s,
                   std::int64_t first, std::int64_t end) const {
    m_.put_replies(send, replies, h, a, peer, s, first, end);
  }
  bool relay_sums_in_place(const HandleState& h) const { return m_.relay_sums_in_place(h); }
  void reduce(const HandleState& h, const CombineArgs& a, const Impl::Peers* pull, Tensor& out) const { m_.reduce(h, a, pull, out); }
  void reduce_tokens(const HandleState& h, const CombineArgs& a, std::int64_t t0, std::int64_t t1,
                     const std::vector<const std::uint16_t*>& rows_of, const std::vector<std::int64_t>& first_row,
                     std::uint16_t* o, WorkerStats* pulls) const {
    m_.reduce_tokens(h, a, t0, t1, rows_of, first_row, o, pulls);
  }

 private:
  Impl& m_;
};

}  // namespace epx::detail
