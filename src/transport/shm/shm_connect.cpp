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

}  // namespace

std::unique_ptr<Transport> connect_shm(Bootstrap& b, const ConnectOptions& options) {
  const int rank = b.rank(), P = b.size();
  const std::string me = "rank " + std::to_string(rank) + ": connect (shm): ";
  const NodeMap nodes = discover_nodes(b);
  if (nodes.num_nodes != 1) {
    std::string where;
    for (int r = 0; r < P; ++r) where += (r ? ", " : "") + std::to_string(nodes.node_of_rank[static_cast<std::size_t>(r)]);
    throw Error(ErrorCode::kInvalidArgument,
                me + "the shm transport needs every rank on one node, but the " + std::to_string(P) + " ranks are on " +
                    std::to_string(nodes.num_nodes) + " nodes (node of each rank: " + where +
                    "); use the shmem transport across nodes");
  }

  // 1. Who is who: pids and start times for the liveness checks, rank 0's nonce names the job.
  Hello mine;
  const ProcessIdentity self = ProcessIdentity::self();
  mine.pid = self.pid;
  mine.start_time = self.start_time;
  mine.pid_ns = self.pid_ns;
  if (rank == 0) {
    std::random_device rd;
    mine.nonce = (static_cast<std::uint64_t>(rd()) << 32 ^ rd()) ^
                 static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  std::vector<Hello> hello(static_cast<std::size_t>(P));
  b.allgather(&mine, hello.data(), sizeof(Hello));
  const std::uint64_t job_id = hello[0].nonce;
  const std::string name = control_name(job_id);
  const std::size_t bytes = (ControlBlock::bytes_for(P) + 4095) / 4096 * 4096;

  // 2. Rank 0 creates the control block; 3. the others map it; then every rank unlinks the
  // name (only the first unlink finds it). Any rank's failure fails every rank.
  void* memory = MAP_FAILED;
  auto unmap = [&] {
    if (memory != MAP_FAILED) munmap(memory, bytes);
    memory = MAP_FAILED;
  };
  auto step = [&](bool mine_to_do, auto&& body) {
    try {
      agree_on_step(b, [&] {
        if (mine_to_do) body();
      });
    } catch (...) {
      shm_unlink(name.c_str());
      unmap();
      throw;
    }
  };
  step(rank == 0, [&] {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw Error(ErrorCode::kIo, me + "cannot create the control block " + name + ": " + std::strerror(errno), rank);
    const bool sized = ftruncate(fd, static_cast<off_t>(bytes)) == 0;
    if (sized) memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (!sized || memory == MAP_FAILED)
      throw Error(ErrorCode::kIo, me + "cannot size or map the control block " + name + ": " + std::strerror(err), rank);
    ControlBlock* c = ControlBlock::create(memory, P, job_id);
    for (int r = 0; r < P; ++r) {
      const Hello& h = hello[static_cast<std::size_t>(r)];
      record_identity(ProcessIdentity{h.pid, h.start_time, h.pid_ns}, c->ranks()[r]);
    }
  });
  step(rank != 0, [&] {
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) throw Error(ErrorCode::kIo, me + "cannot open rank 0's control block " + name + ": " + std::strerror(errno), rank);
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (memory == MAP_FAILED)
      throw Error(ErrorCode::kIo, me + "cannot map rank 0's control block " + name + ": " + std::strerror(err), rank);
  });
  shm_unlink(name.c_str());  // every rank holds a mapping (or failed above): nothing left in /dev/shm
  return std::make_unique<ConnectedShmTransport>(static_cast<ControlBlock*>(memory), bytes, rank, options);
}

}  // namespace epx::detail
