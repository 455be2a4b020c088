// SimTransport: the threads transport (ranks are threads of this process, windows mapped
// here) that also records every operation (epx/sim/trace.hpp) for the discrete-event model
// in src/sim/. Copy mode moves every byte (bit-exact results); model-only mode skips the
// bytes of puts that fall entirely inside the payload region announced by the engine
// (set_payload_region) and reports moves_payload() = false (epx/sim/model_transport.hpp,
// the engine's optional model interface, which this transport implements). Windows are anonymous
// MAP_NORESERVE mappings: pages cost RAM only once touched, so the never-written payload
// region of a 128-rank x 16384-token window costs nothing.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "epx/sim/model_transport.hpp"
#include "epx/sim/trace.hpp"
#include "mapped_transport.hpp"

namespace epx::detail {

/// Shared by the ranks of one launch: each rank's mapping size (for unmapping).
struct SimShared {
  explicit SimShared(int ranks) : mapped_bytes(static_cast<std::size_t>(ranks), 0) {}
  std::vector<std::size_t> mapped_bytes;
};

class SimTransport : public MappedTransport, public sim::ModelTransport {
 public:
  SimTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout, SimShared* shared,
               const sim::SimTransportOptions& options);

  void allocate(std::size_t window_bytes, std::size_t num_signals) override;
  void put(int peer, std::size_t offset, const void* src, std::size_t bytes, int queue) override;
  void signal(int peer, std::size_t slot, std::uint64_t value, int queue) override;
  void wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) override;
  std::uint64_t read_signal(std::size_t slot) noexcept override;
  void put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                   int queue) override;
  void wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) override;
  void quiet(int queue) override;
  void barrier(const char* phase) override;
  // sim::ModelTransport
  bool moves_payload() const noexcept override { return !options_.model_only; }
  void set_payload_region(std::size_t begin, std::size_t end) override;
  /// Records a join on the rank thread's stream for each worker stream with new ops.
  void workers_joined() override;
  /// The model has puts, not reads of peer memory: in-place reads are not offered.
  const std::byte* peer_window(int) const noexcept override { return nullptr; }

  /// Starts call `name` on this rank (rank thread only).
  int begin_call(const std::string& name);
  bool saw_payload_region() const noexcept { return payload_end_ > payload_begin_; }
  /// Moves the records out (after the rank finished).
  sim::RankTrace take_trace();
  std::vector<std::string> call_names() const { return call_names_; }

  /// Unmaps every rank's window (after all ranks finished).
  static void free_all(ControlBlock* control, const SimShared& shared) noexcept;

 private:
  struct Stream;
  Stream& stream();  // the calling thread's stream (creates it on first use)
  void record(sim::TraceOp op);
  void record_put(int peer, std::size_t offset, std::size_t bytes, int queue);
  bool in_payload(std::size_t offset, std::size_t bytes) const noexcept {
    return bytes > 0 && offset >= payload_begin_ && offset + bytes <= payload_end_;
  }

  SimShared* shared_;
  sim::SimTransportOptions options_;
  std::uint64_t instance_;  // tells this transport's thread-local cache entries apart
  std::size_t payload_begin_ = 0, payload_end_ = 0;
  struct Stream {
    sim::StreamTrace trace;
    std::uint64_t last_dep = 0;  // the main wait its last op followed
    std::size_t joined = 0;      // worker: ops the rank thread's latest join waits for
    bool sealed = false;         // worker: a join follows its last op (no put merges into it)
    std::unordered_map<std::size_t, std::uint64_t> polled;  // slot -> last value read_signal saw
  };
  void count_main_wait();  // the rank thread's wait just recorded is a fork point
  std::mutex streams_mutex_;
  std::vector<std::unique_ptr<Stream>> streams_;
  bool in_barrier_ = false;  // the barrier's own waits are not recorded
  std::atomic<std::uint32_t> call_{0};
  std::atomic<std::uint64_t> main_waits_{0};  // completed waits of the rank thread
  std::vector<std::string> call_names_{"setup"};
};

}  // namespace epx::detail
