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

/// Field 3 (state) and field 22 (start time) of /proc/<pid>/stat; false if it is gone.
bool read_stat(int pid, char& state, std::uint64_t& start_time) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  const std::size_t close = line.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> state;
  for (int f = 4; f <= 22 && rest >> field; ++f)
    if (f == 22) start_time = std::stoull(field);
  return true;
}

std::uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

/// The shm transport plus what a foreign launcher does not provide: the control block's
/// mapping, the peers' liveness and the caller's wait hook.
class ConnectedShmTransport final : public ShmTransport {
 public:
  ConnectedShmTransport(ControlBlock* control, std::size_t control_bytes, int rank, const ConnectOptions& o,
                        std::vector<Hello> peers)
      : ShmTransport(control, rank, o.timeout),
        control_bytes_(control_bytes),
        hook_(o.wait_hook),
        peers_(std::move(peers)),
        own_ns_(pid_namespace()) {}

  ~ConnectedShmTransport() override {
    auto& state = control_->ranks()[rank()].state;
    std::int32_t running = static_cast<std::int32_t>(RankState::kRunning);
    state.compare_exchange_strong(running, static_cast<std::int32_t>(RankState::kDone), std::memory_order_acq_rel);
    // The base classes' destructors unmap the windows only; the control block goes now.
    munmap(control_, control_bytes_);
  }

  bool launcher_watched() const noexcept override { return false; }

 protected:
  void check_alive(const char* phase) const override {
    using Clock = std::chrono::steady_clock;
    const auto now = Clock::now().time_since_epoch().count();
    if (hook_) {
      thread_local std::int64_t last_hook = 0;
      if (now - last_hook >= std::chrono::nanoseconds(std::chrono::milliseconds(50)).count()) {
        last_hook = now;
        hook_();
      }
    }
    std::int64_t next = next_check_.load(std::memory_order_relaxed);
    if (now < next) return;
    if (!next_check_.compare_exchange_strong(next, now + std::chrono::nanoseconds(std::chrono::milliseconds(20)).count()))
      return;  // another thread of this rank checks now
    for (int p = 0; p < num_ranks(); ++p) {
      const Hello& h = peers_[static_cast<std::size_t>(p)];
      if (p == rank() || h.pid_ns != own_ns_ || h.pid <= 0) continue;
      // Only running ranks can die unnoticed (one that ended marked itself done or failed).
      if (control_->ranks()[p].state.load(std::memory_order_acquire) != static_cast<std::int32_t>(RankState::kRunning))
        continue;
      char state = '?';
      std::uint64_t start = 0;
      const bool present = read_stat(h.pid, state, start);
      if (present && state != 'Z' && state != 'X' && start == h.start_time) continue;
      const std::string msg = "rank " + std::to_string(rank()) + ": peer rank " + std::to_string(p) + " (pid " +
                              std::to_string(h.pid) + ") died while this rank waited in phase '" + phase + "'";
      control_->record_failure(p, static_cast<int>(ErrorCode::kPeerFailed), p, msg.c_str());
      throw Error(ErrorCode::kPeerFailed, msg, p);
    }
  }

 private:
  std::size_t control_bytes_;
  std::function<void()> hook_;
  std::vector<Hello> peers_;
  std::uint64_t own_ns_;
  mutable std::atomic<std::int64_t> next_check_{0};
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
  mine.pid = static_cast<std::int32_t>(getpid());
  char state = '?';
  read_stat(mine.pid, state, mine.start_time);
  mine.pid_ns = pid_namespace();
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
    for (int r = 0; r < P; ++r) c->ranks()[r].pid.store(hello[static_cast<std::size_t>(r)].pid);
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
  return std::make_unique<ConnectedShmTransport>(static_cast<ControlBlock*>(memory), bytes, rank, options,
                                                 std::move(hello));
}

}  // namespace epx::detail
