// ucx/: the UCX transport (UCP), for ranks on one machine or several that any launcher
// started: everything it needs beyond the bootstrap comes from UCX itself.
//
//   * one UCP context (RMA) and one worker (UCS_THREAD_MODE_MULTI: the engine's workers put,
//     signal and quiet from several threads) per group; the worker addresses go through the
//     bootstrap, and every rank makes an endpoint to every other (error mode PEER: a lost
//     peer becomes an error on its endpoint, never an abort);
//   * allocate(): the window + signal slots are one block that UCX allocates and registers
//     (ucp_mem_map with UCP_MEM_MAP_ALLOCATE: shared memory that UCX's sysv/posix transports
//     can reach from the same machine), its rkey packed and exchanged through the bootstrap
//     and unpacked per peer; every endpoint (open_endpoint) has a block of its own over the
//     same worker and endpoints;
//   * put / ordered signal to a peer on another machine that UCX reaches over TCP only: a
//     message on the group's own TCP connection to it (a "link", ucx_links.cpp), which a
//     reader thread there writes into the window in order (UCX 1.13 over TCP moves puts as
//     acknowledged 64 KiB active messages, several times slower than the socket); to a
//     same-machine peer a copy into its mapped block; otherwise (UCX has an RDMA lane, rc / dc
//     / ud, to some other machine: ucx_lanes.hpp; EPX_UCX_LINKS=0; EPX_UCX_MAP_PEERS=0)
//     ucp_put_nbx (src valid until quiet), a signal ucp_worker_fence + an 8-byte put;
//     EPX_UCX_LINKS=1 forces links; put_flagged: the bytes, then the flag;
//   * get: ucp_get_nbx (complete after quiet);
//   * quiet: every link message acknowledged by its reader, then ucp_ep_flush_nbx to every peer
//     this group has talked to, until done or the timeout: a cut link becomes kTimeout naming
//     the peers with incomplete puts and their machines (hostname), never a hang;
//   * waits look at local memory (spi::Backoff) and call ucp_worker_progress meanwhile, then
//     sleep (a futex the link readers and every productive progress bump) when the awaited
//     peer is on another machine; a timeout names the peer, its node (hostname) and the
//     phase; a peer whose endpoint or link failed is kPeerFailed;
//   * barrier: signals through the block like the other transports (a deadline);
//   * bootstrap calls (allocate's rkey exchange) run with a helper thread progressing the
//     worker, so a peer that still completes puts to this rank is never stuck behind it;
//   * closing (ucx_group.cpp, say_goodbye): a rank completes its puts, then sets its word in
//     the goodbye block of every rank on another machine, then closes its connections; a
//     put, signal or flush to a rank that said goodbye is complete (it reads nothing more),
//     one to a rank that vanished without it fails naming the rank. A released block stays
//     mapped until no peer can put into it any more.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "epx/bootstrap.hpp"
#include "epx/connect.hpp"
#include "epx/transport.hpp"
#include "ucx/ucx_transport_api.hpp"

namespace epx::detail {

class UcxGroup;

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxGroup> group);
  ~UcxTransport() override;

  int rank() const noexcept override;
  int num_ranks() const noexcept override;
  const TransportCaps& caps() const noexcept override;
  /// allocate(0, 0) releases the block (local, after a quiet).
  void allocate(std::size_t window_bytes, std::size_t num_signals) override;
  std::unique_ptr<Transport> open_endpoint() override;
  std::byte* window() noexcept override { return base_; }
  std::size_t window_bytes() const noexcept override { return window_bytes_; }
  void put(int peer, std::size_t offset, const void* src, std::size_t bytes, int queue) override;
  void get(int peer, std::size_t offset, void* dst, std::size_t bytes, int queue) override;
  void signal(int peer, std::size_t slot, std::uint64_t value, int queue) override;
  void wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) override;
  /// Progresses the worker first: the rings poll slots with this alone.
  std::uint64_t read_signal(std::size_t slot) noexcept override;
  void put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                   int queue) override;
  void wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) override;
  void quiet(int queue) override;
  void quiet_timed(int queue, std::uint64_t* lap_ns) override;
  void barrier(const char* phase) override;
  void enter_phase(const char* phase) noexcept override;
  std::chrono::milliseconds timeout() const noexcept override;

 private:
  void release() noexcept;
  std::string map_block(std::size_t bytes);
  void make_block(std::size_t window_bytes, std::size_t num_signals);
  std::string unpack_rkeys(const std::vector<std::string>& all);
  std::uint64_t* signal_word(std::size_t slot) const noexcept;
  /// Sets `peer`'s copy of the word at `offset` of the block, after every earlier put of
  /// this worker to `peer`.
  void ordered_set(int peer, std::size_t offset, std::uint64_t value);
  void wait_word(std::uint64_t* word, std::uint64_t at_least, const WaitPoint& where);
  void check_range(const char* what, int peer, std::size_t offset, std::size_t bytes) const;

  std::shared_ptr<UcxGroup> group_;
  ucp_mem_h memh_ = nullptr;
  std::byte* base_ = nullptr;  // this rank's block (window, then signals, then the barrier's slots)
  std::size_t block_bytes_ = 0;
  std::size_t window_bytes_ = 0;
  std::size_t signal_offset_ = 0;
  std::size_t num_signals_ = 0;
  std::uint64_t barrier_epoch_ = 0;
  std::vector<std::uint64_t> remote_base_;  // [P] each peer's block address
  std::vector<ucp_rkey_h> rkeys_;           // [P] (nullptr for this rank)
  std::vector<std::byte*> mapped_;          // [P] where a same-machine peer's block is mapped here (ucp_rkey_ptr), else nullptr
  // Released blocks a peer on another machine may still put into (release()): unmapped once
  // every rank joined this endpoint's next allocation, else at the group's end.
  std::vector<ucp_mem_h> retired_;
};

}  // namespace epx::detail
