// The launcher: P ranks as threads or as forked processes, failures collected in the
// control block, leftovers cleaned.
#include "epx/launch.hpp"
#include "epx/sim/launch.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "control_block.hpp"
#include "door.hpp"
#include "epx/error.hpp"
#include "epx/spi/janitor.hpp"
#include "epx/spi/resources.hpp"
#include "shm/shm_transport.hpp"
#include "sim/sim_transport.hpp"
#include "threads/threads_transport.hpp"

namespace epx {

TransportKind parse_transport_kind(std::string_view name) {
  if (name == "threads") return TransportKind::kThreads;
  if (name == "shm") return TransportKind::kShm;
  if (name == "sim") return TransportKind::kSim;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown transport '" + std::string(name) + "' (expected 'shm', 'threads' or 'sim')");
}

const char* to_string(TransportKind kind) noexcept {
  switch (kind) {
    case TransportKind::kThreads: return "threads";
    case TransportKind::kShm: return "shm";
    case TransportKind::kSim: return "sim";
  }
  return "?";
}

int max_ranks(TransportKind transport) noexcept {
  if (transport != TransportKind::kShm) return kMaxRanks;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::min<long>(kMaxRanks, kMaxRanksPerCore * std::max<long>(1, cores)));
}

std::chrono::milliseconds checked_timeout(std::int64_t ms, const std::string& what) {
  constexpr std::int64_t kDay = 86'400'000;
  if (ms < 1 || ms > kDay)
    throw Error(ErrorCode::kInvalidArgument,
                what + " must be in [1, " + std::to_string(kDay) + "] ms (one day), got " + std::to_string(ms));
  return std::chrono::milliseconds(ms);
}

namespace {

using detail::ControlBlock;
using detail::RankState;

std::uint64_t new_job_id() {
  std::random_device rd;
  const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return (static_cast<std::uint64_t>(rd()) << 32) ^ now ^ (static_cast<std::uint64_t>(getpid()) << 16);
}

// Runs `fn` for one rank and records how it ended in the control block.
void run_rank(ControlBlock* control, int rank, Transport& transport, const RankFn& fn) {
  try {
    fn(transport);
    control->ranks()[rank].state.store(static_cast<std::int32_t>(RankState::kDone), std::memory_order_release);
  } catch (const Error& e) {
    control->record_failure(rank, static_cast<int>(e.code()), e.origin_rank(), e.what());
  } catch (const std::exception& e) {
    const std::string msg = "rank " + std::to_string(rank) + ": " + e.what();
    control->record_failure(rank, static_cast<int>(ErrorCode::kInternal), rank, msg.c_str());
  } catch (...) {
    const std::string msg = "rank " + std::to_string(rank) + ": unknown exception";
    control->record_failure(rank, static_cast<int>(ErrorCode::kInternal), rank, msg.c_str());
  }
}

// The error of the rank at fault: a rank that blames itself (its own bad input or death)
// first, else the lowest rank that reported an error naming someone, else any failure.
// With `lost` (an elastic launch): the ranks that died are not the launch's failure as long
// as some rank ended normally, and a survivor's own failure is reported before them.
void throw_if_failed(ControlBlock* control, const std::vector<bool>* lost = nullptr, int num_slots = -1) {
  const int P = num_slots >= 0 ? num_slots : control->num_ranks;
  int pick = -1, pick_quality = 0;
  bool survivor_failed = false;
  if (lost != nullptr) {
    bool some_done = false, others_done = true;
    for (int r = 0; r < P; ++r) {
      if ((*lost)[static_cast<std::size_t>(r)]) continue;
      const bool done = control->ranks()[r].state.load(std::memory_order_acquire) == static_cast<std::int32_t>(RankState::kDone);
      some_done |= done;
      others_done &= done;
      survivor_failed |= !done;
    }
    if (some_done && others_done) return;
  }
  for (int r = 0; r < P; ++r) {
    const detail::RankSlot& s = control->ranks()[r];
    if (s.state.load(std::memory_order_acquire) != static_cast<std::int32_t>(RankState::kFailed)) continue;
    if (survivor_failed && (*lost)[static_cast<std::size_t>(r)]) continue;
    const int quality = s.origin_rank == r ? 3 : s.origin_rank >= 0 ? 2 : 1;
    if (quality > pick_quality) pick = r, pick_quality = quality;
  }
  if (pick < 0) return;
  const detail::RankSlot& s = control->ranks()[pick];
  throw Error(static_cast<ErrorCode>(s.error_code), s.message, s.origin_rank);
}

void launch_threads(const LaunchOptions& opt, const RankFn& fn) {
  const std::size_t bytes = ControlBlock::bytes_for(opt.num_ranks);
  std::unique_ptr<std::byte[]> memory(new std::byte[bytes]);
  ControlBlock* control = ControlBlock::create(memory.get(), opt.num_ranks, new_job_id());
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(opt.num_ranks));
  for (int r = 0; r < opt.num_ranks; ++r) {
    threads.emplace_back([&, r] {
      detail::ThreadsTransport transport(control, r, opt.timeout);
      run_rank(control, r, transport, fn);
    });
  }
  for (auto& t : threads) t.join();
  detail::ThreadsTransport::free_all(control);
  throw_if_failed(control);
}

void launch_sim(const LaunchOptions& opt, const sim::SimTransportOptions& so, const RankFn& fn) {
  const std::size_t bytes = ControlBlock::bytes_for(opt.num_ranks);
  std::unique_ptr<std::byte[]> memory(new std::byte[bytes]);
  ControlBlock* control = ControlBlock::create(memory.get(), opt.num_ranks, new_job_id());
  detail::SimShared shared(opt.num_ranks);
  std::vector<sim::RankTrace> traces(static_cast<std::size_t>(opt.num_ranks));
  std::vector<std::vector<std::string>> calls(static_cast<std::size_t>(opt.num_ranks));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(opt.num_ranks));
  for (int r = 0; r < opt.num_ranks; ++r) {
    threads.emplace_back([&, r] {
      detail::SimTransport transport(control, r, opt.timeout, &shared, so);
      run_rank(control, r, transport, fn);
      if (so.trace != nullptr) {
        traces[static_cast<std::size_t>(r)] = transport.take_trace();
        calls[static_cast<std::size_t>(r)] = transport.call_names();
      }
    });
  }
  for (auto& t : threads) t.join();
  detail::SimTransport::free_all(control, shared);
  throw_if_failed(control);
  if (so.trace != nullptr) {
    so.trace->num_ranks = opt.num_ranks;
    so.trace->ranks = std::move(traces);
    so.trace->calls = calls.empty() ? std::vector<std::string>{"setup"} : calls[0];
  }
}

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int sig) { g_interrupted = sig; }

// How a rank process ended, with the phase it was last in. SIGKILL is attributed to the
// out-of-memory killer only when the cgroup's oom_kill count rose during this launch.
std::string describe_exit(int status, const char* phase, std::int64_t oom_kills_before) {
  const std::string in = std::string(" in phase '") + phase + "'";
  if (WIFSTOPPED(status)) {
    const char* name = sigabbrev_np(WSTOPSIG(status));
    return "was stopped by signal " + std::to_string(WSTOPSIG(status)) + " (SIG" + (name ? name : "?") + ")" + in;
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    std::string msg = "was killed by signal " + std::to_string(sig) + " (SIG" + (name ? name : "?") + ")" + in;
    if (sig == SIGKILL) {
      const std::int64_t now = detail::cgroup_oom_kills();
      if (oom_kills_before >= 0 && now > oom_kills_before)
        msg += ": the cgroup's memory.events counted " + std::to_string(now - oom_kills_before) +
               " out-of-memory kill(s) during this launch";
      else
        msg += " (sent by someone, or the kernel's out-of-memory killer: `dmesg` tells)";
    }
    if (sig == SIGBUS) msg += " (a bus error: often a full /dev/shm or a truncated mapped file)";
    return msg;
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status)) + in;
}

// Starts rank r on the (r mod n)-th of the n CPUs it may use, then lets it run anywhere again
// (no binding). Forked from one launcher, the ranks otherwise begin mostly on its CPU, and
// with more ranks than CPUs the scheduler takes a long time to spread ranks that wait by
// yielding (it does not move a task that ran within the last half millisecond): 8 ranks on
// 2 CPUs ran 7 + 1 for the first ~0.3 s of a bench (BENCHMARKS.md, "What we tried":
// bucket collectives).
void start_on_own_cpu(int r) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  const int n = CPU_COUNT(&allowed);
  if (n < 2) return;
  int k = r % n;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || k-- > 0) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) sched_setaffinity(0, sizeof allowed, &allowed);
    return;
  }
}

// Forks the P rank processes over `control`; a failed fork is recorded as rank r's failure
// and ends the forking. Returns the pids (-1 where none was started).
std::vector<pid_t> fork_ranks(const LaunchOptions& opt, ControlBlock* control, const RankFn& fn, pid_t launcher,
                              const struct sigaction& old_int, const struct sigaction& old_term) {
  const int P = opt.num_ranks;
  std::fflush(nullptr);
  std::vector<pid_t> pids(static_cast<std::size_t>(P), -1);
  for (int r = 0; r < P; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(1);  // the launcher died before the line above
      detail::janitor_after_fork_in_child();
      start_on_own_cpu(r);
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      int code = 1;
      {
        detail::ShmTransport transport(control, r, opt.timeout);
        run_rank(control, r, transport, fn);
        code = control->ranks()[r].state.load() == static_cast<std::int32_t>(RankState::kDone) ? 0 : 1;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    if (pid < 0) {
      const std::string msg = "launch: fork of rank " + std::to_string(r) + " failed";
      control->record_failure(r, static_cast<int>(ErrorCode::kInternal), r, msg.c_str());
      break;
    }
    pids[static_cast<std::size_t>(r)] = pid;
    control->ranks()[r].pid.store(pid);
  }
  return pids;
}

// Forks the process of joiner `seat` (epx::request_ranks): it waits at the door to be
// admitted, then runs `fn` on the group that admitted it; not admitted, it ends as done
// without running it. -1 if the fork failed (recorded as its failure).
pid_t fork_joiner(const LaunchOptions& opt, ControlBlock* control, detail::Door* door, int seat, const RankFn& fn,
                  pid_t launcher, const struct sigaction& old_int, const struct sigaction& old_term) {
  const int r = door->first_root + seat;
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(1);
    detail::janitor_after_fork_in_child();
    start_on_own_cpu(r);
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    int code = 0;
    {
      std::unique_ptr<Transport> group;
      try {
        group = detail::join_at_door(control, door, seat, opt.timeout);
      } catch (...) {
        group.reset();
      }
      if (group) {
        run_rank(control, r, *group, fn);
        code = control->ranks()[r].state.load() == static_cast<std::int32_t>(RankState::kDone) ? 0 : 1;
      } else {
        control->ranks()[r].state.store(static_cast<std::int32_t>(RankState::kDone), std::memory_order_release);
      }
    }
    std::fflush(nullptr);
    _exit(code);
  }
  if (pid < 0) {
    const std::string msg = "launch: fork of joining rank " + std::to_string(r) + " failed";
    control->record_failure(r, static_cast<int>(ErrorCode::kInternal), r, msg.c_str());
    door->seat(seat).state.store(static_cast<std::uint32_t>(detail::SeatState::kLeft), std::memory_order_release);
    return -1;
  }
  control->ranks()[r].pid.store(pid);
  return pid;
}

// Reaps the rank processes. After the first failure the others get a grace period to fail
// by themselves (they see the failure in their next wait), then they are killed.
class RankReaper {
 public:
  /// `spawn(seat)`: forks joiner `seat` of `door` (null: no spare ranks), its pid or -1.
  RankReaper(const LaunchOptions& opt, ControlBlock* control, std::vector<pid_t> pids, std::int64_t oom_kills_before,
             detail::Door* door = nullptr, std::function<pid_t(int)> spawn = {})
      : opt_(opt), control_(control), P_(opt.num_ranks), n_(opt.num_ranks), pids_(std::move(pids)),
        oom_kills_before_(oom_kills_before),
        grace_(std::min<std::chrono::milliseconds>(opt.timeout, std::chrono::milliseconds(5000))),
        stopped_in_(at(P_ + opt.spare_ranks)), lost_(at(P_ + opt.spare_ranks), false),
        killed_stopped_(at(P_ + opt.spare_ranks), false), door_(door), spawn_(std::move(spawn)) {
    for (pid_t p : pids_) alive_ += p > 0;
    started_ = alive_;
    pids_.resize(at(P_ + opt.spare_ranks), -1);
  }

  /// Slots in use: the launched ranks, then the joiners started so far.
  int num_slots() const { return n_; }

  // Until every started rank is reaped.
  void run() {
    while (alive_ > 0) {
      if (door_ != nullptr) start_joiners();
      bool reaped = false;
      for (int r = 0; r < n_; ++r) reaped = poll(r) || reaped;
      if (reaped) continue;
      if (door_ != nullptr) close_door_if_only_joiners_wait();
      if (opt_.elastic) kill_if_only_stopped_left();
      stop_on_interrupt();
      kill_after_deadline();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  /// Elastic: the ranks that died (the others went on without them).
  const std::vector<bool>& lost() const { return lost_; }

 private:
  static std::size_t at(int r) { return static_cast<std::size_t>(r); }

  // The ranks asked for (request_ranks) that have no process yet get one (not once the job
  // is being stopped).
  void start_joiners() {
    while (door_->started.load(std::memory_order_acquire) < door_->requested.load(std::memory_order_acquire)) {
      if (!no_deadline() || g_interrupted) return;
      const int seat = static_cast<int>(door_->started.load(std::memory_order_relaxed));
      door_->seat(seat).state.store(static_cast<std::uint32_t>(detail::SeatState::kStarted), std::memory_order_release);
      door_->started.fetch_add(1, std::memory_order_acq_rel);
      const int r = P_ + seat;
      n_ = std::max(n_, r + 1);
      const pid_t pid = spawn_(seat);
      pids_[at(r)] = pid;
      if (pid > 0) ++alive_, ++started_;
    }
  }

  // Once no rank that could admit them runs any more, the joiners still waiting leave.
  void close_door_if_only_joiners_wait() {
    if (door_->closed.load(std::memory_order_relaxed) != 0) return;
    for (int r = 0; r < n_; ++r) {
      if (pids_[at(r)] <= 0) continue;
      if (r < P_) return;
      const auto st = static_cast<detail::SeatState>(door_->seat(r - P_).state.load(std::memory_order_acquire));
      if (st != detail::SeatState::kStarted && st != detail::SeatState::kKnocking) return;
    }
    door_->closed.store(1, std::memory_order_release);
  }
  bool no_deadline() const { return kill_deadline_ == std::chrono::steady_clock::time_point::max(); }

  // Rank r's process, if it changed state: true when it ended (and was reaped).
  bool poll(int r) {
    const pid_t rp = pids_[at(r)];
    if (rp <= 0) return false;
    int status = 0;
    // WUNTRACED: a stopped rank (SIGSTOP) is named as the one at fault, in its phase.
    const pid_t pid = waitpid(rp, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (pid != rp) return false;
    char phase[detail::kPhaseChars];
    control_->ranks()[r].get_phase(phase);
    if (WIFSTOPPED(status) || WIFCONTINUED(status)) {
      // Not a failure by itself (Ctrl-Z stops the whole job); the peers' timeouts name it,
      // and if it is still stopped when the launcher kills it, that is its report.
      stopped_in_[at(r)] = WIFSTOPPED(status) ? describe_exit(status, phase, oom_kills_before_) : "";
      return false;
    }
    --alive_;
    pids_[at(r)] = -1;
    ended(r, status, phase);
    return true;
  }

  void ended(int r, int status, const char* phase) {
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // Died rather than failed: it recorded no error of its own (an elastic launch goes on).
    const bool died = !ok && control_->ranks()[r].state.load() != static_cast<std::int32_t>(RankState::kFailed);
    if (died) record_death(r, status, phase);
    if (opt_.elastic && died && !killed_) {
      lost_[at(r)] = true;
      return;
    }
    if (!ok && no_deadline()) kill_deadline_ = std::chrono::steady_clock::now() + grace_;
  }

  void record_death(int r, int status, const char* phase) {
    // Killed by us after another rank failed: a consequence, not the cause.
    const bool by_us = (killed_ || killed_stopped_[at(r)]) && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    const std::string& was_stopped = stopped_in_[at(r)];
    std::string msg = "rank " + std::to_string(r);
    if (killed_stopped_[at(r)])
      msg += " " + was_stopped + " and was killed when every other rank had ended";
    else if (by_us && !was_stopped.empty())
      msg += " " + was_stopped + " and was killed after the timeout";  // the stalled rank itself
    else if (by_us)
      msg += " did not stop after another rank failed and was killed";
    else
      msg += " " + describe_exit(status, phase, oom_kills_before_);
    control_->record_failure(r, static_cast<int>(ErrorCode::kPeerFailed), by_us && was_stopped.empty() ? -1 : r, msg.c_str());
  }

  // Elastic: stopped ranks are killed (as lost) once some rank ended and nobody is left who
  // could still end by itself.
  void kill_if_only_stopped_left() {
    if (alive_ >= started_ || !no_deadline()) return;
    bool all_stopped = true;
    for (int r = 0; r < n_; ++r)
      if (pids_[at(r)] > 0) all_stopped &= !stopped_in_[at(r)].empty();
    if (!all_stopped) return;
    for (int r = 0; r < n_; ++r)
      if (pids_[at(r)] > 0 && !killed_stopped_[at(r)]) {
        killed_stopped_[at(r)] = true;
        kill(pids_[at(r)], SIGKILL);
      }
  }

  void stop_on_interrupt() {
    if (!g_interrupted || !no_deadline()) return;
    for (int r = 0; r < n_; ++r) control_->record_failure(r, static_cast<int>(ErrorCode::kPeerFailed), -1, "interrupted");
    for (pid_t p : pids_)
      if (p > 0) kill(p, SIGTERM);
    kill_deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  }

  void kill_after_deadline() {
    if (killed_ || std::chrono::steady_clock::now() <= kill_deadline_) return;
    for (pid_t p : pids_)
      if (p > 0) kill(p, SIGKILL);
    killed_ = true;
  }

  const LaunchOptions& opt_;
  ControlBlock* control_;
  const int P_;
  int n_;
  std::vector<pid_t> pids_;
  const std::int64_t oom_kills_before_;
  const std::chrono::milliseconds grace_;
  int alive_ = 0, started_ = 0;
  std::chrono::steady_clock::time_point kill_deadline_ = std::chrono::steady_clock::time_point::max();
  bool killed_ = false;
  std::vector<std::string> stopped_in_;  // "was stopped by signal 19 ..." while stopped
  std::vector<bool> lost_, killed_stopped_;  // died; stopped and killed once every other rank had ended
  detail::Door* door_;
  std::function<pid_t(int)> spawn_;
};

void launch_processes(const LaunchOptions& opt, const RankFn& fn) {
  const int P = opt.num_ranks;
  // With spare ranks the block has a slot for each joiner too (the launcher records their
  // deaths there), while the launched group is P ranks; the door follows it.
  const std::size_t control_bytes = (ControlBlock::bytes_for(P + opt.spare_ranks) + 63) / 64 * 64;
  const std::size_t bytes = control_bytes + (opt.spare_ranks > 0 ? detail::Door::bytes_for(opt.spare_ranks) : 0);
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) throw Error(ErrorCode::kIo, "launch: cannot map the control block");
  ControlBlock* control = ControlBlock::create(memory, P + opt.spare_ranks, new_job_id());
  control->num_ranks = P;
  detail::Door* door = nullptr;
  if (opt.spare_ranks > 0) door = detail::Door::create(static_cast<std::byte*>(memory) + control_bytes, P, opt.spare_ranks);
  detail::g_launch_door = door;  // the ranks forked below inherit it
  detail::g_launch_root = control;
  // If this launcher is SIGKILLed, its ranks die with it (PR_SET_PDEATHSIG) and the
  // janitor unlinks whatever segment a rank had not unlinked yet.
  detail::unlink_segments_at_exit(detail::ShmTransport::segment_prefix(control->job_id));
  const std::int64_t oom_kills_before = detail::cgroup_oom_kills();

  // Until every child is reaped, Ctrl-C / SIGTERM only set a flag: the launcher still
  // stops the ranks and removes their segments.
  struct sigaction sa{}, old_int{}, old_term{};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_interrupted = 0;

  const pid_t launcher = getpid();
  RankReaper reaper(opt, control, fork_ranks(opt, control, fn, launcher, old_int, old_term), oom_kills_before, door,
                    [&](int seat) { return fork_joiner(opt, control, door, seat, fn, launcher, old_int, old_term); });
  reaper.run();
  detail::g_launch_door = nullptr;
  detail::g_launch_root = nullptr;
  detail::ShmTransport::unlink_leftovers(control->job_id);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  const std::vector<bool>& lost = reaper.lost();
  if (opt.lost != nullptr) {
    opt.lost->clear();
    for (int r = 0; r < reaper.num_slots(); ++r)
      if (lost[static_cast<std::size_t>(r)]) opt.lost->push_back(r);
  }
  try {
    throw_if_failed(control, opt.elastic ? &lost : nullptr, reaper.num_slots());
  } catch (...) {
    munmap(memory, bytes);
    if (g_interrupted) raise(g_interrupted);
    throw;
  }
  munmap(memory, bytes);
}

void check_launch_options(const LaunchOptions& options) {
  const int most = max_ranks(options.transport);
  if (options.num_ranks < 1 || options.num_ranks > most)
    throw Error(ErrorCode::kInvalidArgument,
                "launch: num_ranks must be in [1, " + std::to_string(most) + "] on transport '" + to_string(options.transport) +
                    "' (at most " + std::to_string(kMaxRanks) + ", and " + std::to_string(kMaxRanksPerCore) +
                    " per online core for processes), got " + std::to_string(options.num_ranks));
  checked_timeout(options.timeout.count(), "launch: timeout");
  if (options.spare_ranks != 0 &&
      (!options.elastic || options.spare_ranks < 0 || options.num_ranks + options.spare_ranks > most))
    throw Error(ErrorCode::kInvalidArgument,
                "launch: spare_ranks needs elastic and must be in [0, " + std::to_string(most - options.num_ranks) +
                    "] (num_ranks + spare_ranks <= " + std::to_string(most) + "), got " + std::to_string(options.spare_ranks));
  if (options.elastic && options.transport != TransportKind::kShm)
    throw Error(ErrorCode::kUnsupported, std::string("launch: elastic needs the shm transport (a process per rank: a rank "
                                                     "that dies must not take the others with it), not '") +
                                             to_string(options.transport) + "'");
}

}  // namespace

void launch(const LaunchOptions& options, const RankFn& fn) {
  check_launch_options(options);
  if (options.transport == TransportKind::kThreads)
    launch_threads(options, fn);
  else if (options.transport == TransportKind::kSim)
    launch_sim(options, sim::SimTransportOptions{}, fn);
  else
    launch_processes(options, fn);
}

void sim::launch(const LaunchOptions& options, const SimTransportOptions& sim, const RankFn& fn) {
  LaunchOptions o = options;
  o.transport = TransportKind::kSim;
  check_launch_options(o);
  launch_sim(o, sim, fn);
}

}  // namespace epx
