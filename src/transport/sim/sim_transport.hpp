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

/// Shared by the ranks of one launch: each rank's mapping size (for unmapping), and the
/// mappings endpoints let go (kept until the launch ends: a peer may still unwind through one).
struct SimShared {
  explicit SimShared(int ranks) : mapped_bytes(static_cast<std::size_t>(ranks), 0) {}
  std::vector<std::size_t> mapped_bytes;
  std::mutex graveyard_mutex;
  std::vector<std::pair<std::byte*, std::size_t>> graveyard;
};

/// One rank's record (its streams, calls and main-thread waits), shared by the rank's
/// transport and its endpoints: every buffer's operations land in the rank's one trace.
struct SimRecorder;

class SimTransport : public MappedTransport, public sim::ModelTransport {
 public:
  SimTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout, SimShared* shared,
               const sim::SimTransportOptions& options);

  ~SimTransport() override;
  /// allocate(0, 0) releases the window (kept mapped until the launch ends).
  void allocate(std::size_t window_bytes, std::size_t num_signals) override;
  /// An endpoint recording into this rank's trace; its signal slots and flag offsets carry
  /// the endpoint's number in their trace keys (bits 40+), so the model's timing keeps them apart.
  std::unique_ptr<Transport> open_endpoint() override;
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
  /// The model has puts, not reads of peer memory: in-place reads and gets are not offered.
  const std::byte* peer_window(int) const noexcept override { return nullptr; }
  void get(int peer, std::size_t offset, void* dst, std::size_t bytes, int queue) override {
    Transport::get(peer, offset, dst, bytes, queue);  // kUnsupported
  }

  /// Starts call `name` on this rank (rank thread only).
  int begin_call(const std::string& name);
  /// Some buffer of this rank (this transport or an endpoint) announced its payload region.
  bool saw_payload_region() const noexcept;
  /// Moves the records out (after the rank finished).
  sim::RankTrace take_trace();
  std::vector<std::string> call_names() const;

  /// Unmaps every rank's window (after all ranks finished).
  static void free_all(ControlBlock* control, SimShared& shared) noexcept;

 private:
  SimTransport(const SimTransport& parent, unsigned endpoint);  // an endpoint
  void let_go() noexcept;
  void record(sim::TraceOp op);
  void record_put(int peer, std::size_t offset, std::size_t bytes, int queue);
  bool in_payload(std::size_t offset, std::size_t bytes) const noexcept {
    return bytes > 0 && offset >= payload_begin_ && offset + bytes <= payload_end_;
  }
  /// A signal slot or flag offset of this transport as the trace names it.
  std::uint64_t key(std::size_t slot_or_offset) const noexcept { return key_tag_ | slot_or_offset; }
  void count_main_wait();  // the rank thread's wait just recorded is a fork point

  SimShared* shared_;
  sim::SimTransportOptions options_;
  std::shared_ptr<SimRecorder> rec_;
  std::uint64_t key_tag_ = 0;          // endpoint k: k << 40
  unsigned endpoints_ = 0;             // endpoints opened (the parent's count)
  bool endpoint_ = false;
  std::byte* mine_ = nullptr;          // an endpoint's mapping
  std::size_t mine_bytes_ = 0;
  std::size_t payload_begin_ = 0, payload_end_ = 0;
  bool in_barrier_ = false;  // the barrier's own waits are not recorded
};

}  // namespace epx::detail
