#include "shm/shm_connect.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "epx/error.hpp"
#include "shm/shm_transport.hpp"

namespace epx::detail {
namespace {

/// What each rank announces about itself: enough to tell later whether it still lives.
struct Hello {
  std::uint64_t nonce = 0;       // rank 0's names the job
  std::uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  std::uint64_t pid_ns = 0;      // inode of /proc/self/ns/pid
  std::int32_t pid = 0;
  std::int32_t pad = 0;
};

/// The shm transport plus what a foreign launcher does not provide: the control block's
/// mapping, the peers' liveness (their ProcessIdentity in the control block) and the
/// caller's wait hook.
class ConnectedShmTransport final : public ShmTransport {
 public:
  ConnectedShmTransport(ControlBlock* control, std::size_t control_bytes, int rank, const ConnectOptions& o)
      : ShmTransport(control, rank, o.timeout), control_bytes_(control_bytes) {
    wait_hook_ = o.wait_hook;
  }

  ~ConnectedShmTransport() override {
    auto& state = control_->ranks()[rank()].state;
    std::int32_t running = static_cast<std::int32_t>(RankState::kRunning);
    state.compare_exchange_strong(running, static_cast<std::int32_t>(RankState::kDone), std::memory_order_acq_rel);
    // The base classes' destructors unmap the windows only; the control block goes now.
    munmap(control_, control_bytes_);
  }

  bool launcher_watched() const noexcept override { return false; }

 protected:
  void check_alive(const char* phase) const override { check_processes(phase, nullptr); }

 private:
  std::size_t control_bytes_;
};

std::string control_name(std::uint64_t job_id) { return "/" + ShmTransport::segment_prefix(job_id) + "ctl"; }

/// The shm transport maps one machine's memory: every rank on one node, or an error naming
/// the node of each rank.
void require_one_node(Bootstrap& b, const std::string& me) {
  const int P = b.size();
  const NodeMap nodes = discover_nodes(b);
  if (nodes.num_nodes == 1) return;
  std::string where;
  for (int r = 0; r < P; ++r) where += (r ? ", " : "") + std::to_string(nodes.node_of_rank[static_cast<std::size_t>(r)]);
  throw Error(ErrorCode::kInvalidArgument,
              me + "the shm transport needs every rank on one node, but the " + std::to_string(P) + " ranks are on " +
                  std::to_string(nodes.num_nodes) + " nodes (node of each rank: " + where +
                  "); use the shmem transport across nodes");
}

/// Who is who: pids and start times for the liveness checks; rank 0's nonce names the job.
std::vector<Hello> exchange_hellos(Bootstrap& b) {
  Hello mine;
  const ProcessIdentity self = ProcessIdentity::self();
  mine.pid = self.pid;
  mine.start_time = self.start_time;
  mine.pid_ns = self.pid_ns;
  if (b.rank() == 0) {
    std::random_device rd;
    mine.nonce = (static_cast<std::uint64_t>(rd()) << 32 ^ rd()) ^
                 static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  std::vector<Hello> hello(static_cast<std::size_t>(b.size()));
  b.allgather(&mine, hello.data(), sizeof(Hello));
  return hello;
}

/// The control block while it is set up: its /dev/shm name, its size and this rank's mapping.
struct ControlMapping {
  std::string name;
  std::size_t bytes = 0;
  void* memory = MAP_FAILED;

  /// A failed step, on any rank: nothing left in /dev/shm, nothing mapped.
  void abandon() noexcept {
    shm_unlink(name.c_str());
    if (memory != MAP_FAILED) munmap(memory, bytes);
    memory = MAP_FAILED;
  }
};

/// One setup step that every rank agrees on: `body` runs where it is `mine_to_do`, and any
/// rank's failure fails every rank, each abandoning the control block.
template <class Body>
void agreed_step(Bootstrap& b, ControlMapping& control, bool mine_to_do, Body&& body) {
  try {
    agree_on_step(b, [&] {
      if (mine_to_do) body();
    });
  } catch (...) {
    control.abandon();
    throw;
  }
}

/// Rank 0: the control block created, sized, mapped, and every rank's identity recorded in it.
void create_control_block(ControlMapping& control, std::uint64_t job_id, const std::vector<Hello>& hello, int rank,
                          const std::string& me) {
  const int P = static_cast<int>(hello.size());
  const int fd = shm_open(control.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    throw Error(ErrorCode::kIo, me + "cannot create the control block " + control.name + ": " + std::strerror(errno), rank);
  const bool sized = ftruncate(fd, static_cast<off_t>(control.bytes)) == 0;
  if (sized) control.memory = mmap(nullptr, control.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (!sized || control.memory == MAP_FAILED)
    throw Error(ErrorCode::kIo, me + "cannot size or map the control block " + control.name + ": " + std::strerror(err),
                rank);
  ControlBlock* c = ControlBlock::create(control.memory, P, job_id);
  for (int r = 0; r < P; ++r) {
    const Hello& h = hello[static_cast<std::size_t>(r)];
    record_identity(ProcessIdentity{h.pid, h.start_time, h.pid_ns}, c->ranks()[r]);
  }
}

/// The other ranks: rank 0's control block mapped.
void map_control_block(ControlMapping& control, int rank, const std::string& me) {
  const int fd = shm_open(control.name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    throw Error(ErrorCode::kIo, me + "cannot open rank 0's control block " + control.name + ": " + std::strerror(errno),
                rank);
  control.memory = mmap(nullptr, control.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (control.memory == MAP_FAILED)
    throw Error(ErrorCode::kIo, me + "cannot map rank 0's control block " + control.name + ": " + std::strerror(err), rank);
}

}  // namespace

std::unique_ptr<Transport> connect_shm(Bootstrap& b, const ConnectOptions& options) {
  const int rank = b.rank(), P = b.size();
  const std::string me = "rank " + std::to_string(rank) + ": connect (shm): ";
  require_one_node(b, me);
  const std::vector<Hello> hello = exchange_hellos(b);
  const std::uint64_t job_id = hello[0].nonce;
  ControlMapping control{control_name(job_id), (ControlBlock::bytes_for(P) + 4095) / 4096 * 4096};
  // Rank 0 creates the control block, the others map it; then every rank unlinks the name
  // (only the first unlink finds it).
  agreed_step(b, control, rank == 0, [&] { create_control_block(control, job_id, hello, rank, me); });
  agreed_step(b, control, rank != 0, [&] { map_control_block(control, rank, me); });
  shm_unlink(control.name.c_str());  // every rank holds a mapping (or failed above): nothing left in /dev/shm
  return std::make_unique<ConnectedShmTransport>(static_cast<ControlBlock*>(control.memory), control.bytes, rank, options);
}

}  // namespace epx::detail
