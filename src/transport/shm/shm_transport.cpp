#include "shm/shm_transport.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "epx/error.hpp"
#include "epx/spi/janitor.hpp"
#include "epx/spi/resources.hpp"

namespace epx::detail {

ShmTransport::ShmTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout)
    : ShmTransport(control, rank, timeout, segment_prefix(control->job_id)) {}

ShmTransport::ShmTransport(ControlBlock* control, int rank, std::chrono::milliseconds timeout, std::string prefix)
    : MappedTransport(control, rank, timeout, mapped_caps("shm")), prefix_(std::move(prefix)) {}

ShmTransport::~ShmTransport() { unmap_all(); }

ProcessIdentity identity_of(const RankSlot& slot) noexcept {
  ProcessIdentity id;
  id.pid = slot.pid.load(std::memory_order_acquire);
  id.start_time = slot.start_time;
  id.pid_ns = slot.pid_ns;
  return id;
}

void record_identity(const ProcessIdentity& id, RankSlot& slot) noexcept {
  slot.start_time = id.start_time;
  slot.pid_ns = id.pid_ns;
  slot.pid.store(id.pid, std::memory_order_release);
}

bool ShmTransport::peer_ended(int p) const {
  constexpr auto kFailed = static_cast<std::int32_t>(RankState::kFailed);
  if (launcher_watched()) return root_control()->ranks()[root_rank(p)].state.load(std::memory_order_acquire) == kFailed;
  RankSlot& slot = control_->ranks()[p];
  const std::int32_t state = slot.state.load(std::memory_order_acquire);
  if (state == kFailed) return true;
  if (state != static_cast<std::int32_t>(RankState::kRunning) || !identity_of(slot).ended()) return false;
  const std::string msg = "rank " + std::to_string(p) + " (pid " + std::to_string(slot.pid.load()) + ") died";
  control_->record_failure(p, static_cast<int>(ErrorCode::kPeerFailed), p, msg.c_str());
  return true;
}

void ShmTransport::check_processes(const char* phase, const std::function<std::string(int)>& what) const {
  using Clock = std::chrono::steady_clock;
  const auto now = Clock::now().time_since_epoch().count();
  if (wait_hook_) {
    thread_local std::int64_t last_hook = 0;
    if (now - last_hook >= std::chrono::nanoseconds(std::chrono::milliseconds(50)).count()) {
      last_hook = now;
      wait_hook_();
    }
  }
  std::int64_t next = next_check_.load(std::memory_order_relaxed);
  if (now < next) return;
  if (!next_check_.compare_exchange_strong(next, now + std::chrono::nanoseconds(std::chrono::milliseconds(20)).count()))
    return;  // another thread of this rank checks now
  for (int p = 0; p < num_ranks(); ++p) {
    if (p == rank()) continue;
    RankSlot& slot = control_->ranks()[p];
    // Only running ranks can die unnoticed (one that ended marked itself done or failed).
    if (slot.state.load(std::memory_order_acquire) != static_cast<std::int32_t>(RankState::kRunning)) continue;
    const ProcessIdentity id = identity_of(slot);
    if (!id.ended()) continue;
    const std::string msg = "rank " + std::to_string(rank()) + ": peer rank " + std::to_string(p) +
                            (what ? what(p) : std::string()) + " (pid " + std::to_string(id.pid) +
                            ") died while this rank waited in phase '" + phase + "'";
    control_->record_failure(p, static_cast<int>(ErrorCode::kPeerFailed), p, msg.c_str());
    throw Error(ErrorCode::kPeerFailed, msg, p);
  }
}

void ShmTransport::require_live(const char* call) const {
  const int round = retired_round();
  if (round == 0) return;
  throw Error(ErrorCode::kBadHandle,
              "rank " + std::to_string(rank()) + ": " + call + " on a group that was rebuilt (without its lost ranks, or with the " +
                  "ranks it admitted; round " + std::to_string(round) + "): a buffer of the old group cannot be used any " +
                  "more; build it again on the group the rebuild or admission returned",
              rank());
}

void ShmTransport::put(int peer, std::size_t offset, const void* src, std::size_t bytes, int queue) {
  require_live("put");
  MappedTransport::put(peer, offset, src, bytes, queue);
}
void ShmTransport::get(int peer, std::size_t offset, void* dst, std::size_t bytes, int queue) {
  require_live("get");
  MappedTransport::get(peer, offset, dst, bytes, queue);
}
void ShmTransport::signal(int peer, std::size_t slot, std::uint64_t value, int queue) {
  require_live("signal");
  MappedTransport::signal(peer, slot, value, queue);
}
void ShmTransport::wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) {
  require_live(where.phase);
  MappedTransport::wait_signal(slot, at_least, where);
}
void ShmTransport::put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag,
                               int queue) {
  require_live("put");
  MappedTransport::put_flagged(peer, offset, src, bytes, flag, queue);
}
void ShmTransport::wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) {
  require_live(where.phase);
  MappedTransport::wait_flag(offset, at_least, where);
}
void ShmTransport::barrier(const char* phase) {
  require_live(phase);
  MappedTransport::barrier(phase);
}

namespace {
/// An endpoint of a shm group: its own segments, the group's control block, and the peers'
/// liveness, phase mirror and launcher as its parent has them.
class ShmEndpoint final : public ShmTransport {
 public:
  ShmEndpoint(const ShmTransport& parent, std::string prefix)
      : ShmTransport(parent.control_block(), parent.rank(), parent.timeout(), std::move(prefix)), parent_(parent) {
    inherit_from(parent);
    follow_retirement_of(parent);  // a rebuild retires the group's buffers with it
  }
  ControlBlock* root_control() const noexcept override { return parent_.root_control(); }
  int root_rank(int p) const noexcept override { return parent_.root_rank(p); }
  bool launcher_watched() const noexcept override { return parent_.launcher_watched(); }

 protected:
  void check_alive(const char* phase) const override { parent_.check_alive_of(phase); }

 private:
  const ShmTransport& parent_;
};
}  // namespace

std::unique_ptr<Transport> ShmTransport::open_endpoint() {
  require_live("open_endpoint");
  return std::make_unique<ShmEndpoint>(*this, prefix_ + "w" + std::to_string(++endpoints_) + "-");
}

std::string ShmTransport::segment_prefix(std::uint64_t job_id) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "epx-%016llx-", static_cast<unsigned long long>(job_id));
  return buf;
}

std::string ShmTransport::segment_name(int rank) const {
  return "/" + prefix_ + std::to_string(rank) + "-" + std::to_string(generation_);
}

void ShmTransport::release_windows() noexcept {
  unmap_all();
  set_segments({}, 0, 0);
}

void ShmTransport::unmap_all() noexcept {
  for (std::byte* p : mapped_)
    if (p != nullptr) munmap(p, mapped_bytes_);
  mapped_.clear();
}

void ShmTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  if (window_bytes == 0 && num_signals == 0) return release_windows();
  require_live("allocate");
  const std::string me = "rank " + std::to_string(rank()) + ": ";
  const std::size_t bytes = (segment_bytes(window_bytes, num_signals) + 4095) / 4096 * 4096;
  // Checked on every rank before any segment of this generation exists (all ranks pass here
  // before the barrier): every rank fails with the same clear error instead of one SIGBUS.
  // The old windows still mapped count as free: they are unmapped below.
  check_memory_fits(me, "the window", bytes > mapped_bytes_ ? bytes - mapped_bytes_ : 0, num_ranks(), true);
  bootstrap_barrier("allocate: enter");  // nobody touches the old windows any more
  unmap_all();
  ++generation_;
  mapped_.assign(static_cast<std::size_t>(num_ranks()), nullptr);
  mapped_bytes_ = bytes;

  try {
    map_segments(window_bytes, num_signals, bytes);
  } catch (...) {
    for (int p = 0; p < num_ranks(); ++p) shm_unlink(segment_name(p).c_str());
    unmap_all();
    throw;
  }
}

void ShmTransport::map_segments(std::size_t window_bytes, std::size_t num_signals, std::size_t bytes) {
  const std::string me = "rank " + std::to_string(rank()) + ": ";
  const std::string name = segment_name(rank());
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw Error(ErrorCode::kIo, me + "shm_open(" + name + ") failed: " + std::strerror(errno));
  // posix_fallocate reserves the pages now: a /dev/shm that fills up meanwhile (another job)
  // gives ENOSPC here, never a SIGBUS at the first touch.
  const int err = ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    close(fd);
    throw Error(ErrorCode::kCapacityExceeded,
                me + "cannot reserve a shared-memory segment of " + format_bytes(bytes) + " (the window x " +
                    std::to_string(num_ranks()) + " ranks needs " + format_bytes(mul_sat(bytes, static_cast<std::uint64_t>(num_ranks()))) +
                    "; /dev/shm has " + format_bytes(shm_free_bytes()) + " free): " + std::strerror(err));
  }
  void* mine = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (mine == MAP_FAILED) throw Error(ErrorCode::kIo, me + "mmap of own segment failed: " + std::strerror(errno));
  mapped_[static_cast<std::size_t>(rank())] = static_cast<std::byte*>(mine);
  // Pre-fault: first touch of shared memory costs a page fault per 4 KiB.
  auto* bytes_ptr = static_cast<volatile std::byte*>(mine);
  for (std::size_t off = 0; off < bytes; off += 4096) bytes_ptr[off] = std::byte{0};
  bootstrap_barrier("allocate: created");

  for (int p = 0; p < num_ranks(); ++p) {
    if (p == rank()) continue;
    const std::string peer = segment_name(p);
    int pfd = shm_open(peer.c_str(), O_RDWR, 0600);
    if (pfd < 0) throw Error(ErrorCode::kIo, me + "cannot open rank " + std::to_string(p) + "'s segment: " + std::strerror(errno), p);
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, pfd, 0);
    close(pfd);
    if (m == MAP_FAILED)
      throw Error(ErrorCode::kIo, me + "cannot map rank " + std::to_string(p) + "'s segment: " + std::strerror(errno), p);
    mapped_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(m);
  }
  bootstrap_barrier("allocate: mapped");
  shm_unlink(name.c_str());  // every rank holds a mapping; nothing can leak from here on
  set_segments(mapped_, window_bytes, num_signals);
}

void ShmTransport::unlink_leftovers(std::uint64_t job_id) noexcept { unlink_segments(segment_prefix(job_id)); }

}  // namespace epx::detail
