// Elastic groups on the shmem transport (epx/elastic.hpp; shmem_elastic.hpp): the
// survivors of a lost PE agree on who is left, rebuild a group over themselves and sum
// small values, all through the control words, with no call over every PE (shmem_malloc,
// shmem_barrier_all and shmem_finalize would wait for the dead PE forever).
//
// Agreement: each member announces the round on every member (a store where shmem_ptr maps
// the peer, else a fence and an 8-byte put) and waits for the others' announcements at most
// the timeout, or until a member of the dead PE's machine announces it gone (it reads the
// dead process's identity in the dead PE's mapped words); the lowest rank it saw arrive decides: it writes the members it saw to every
// one of them, who take that decision (waiting at most twice the timeout). Assumes the
// ranks fail by stopping and no other rank is lost during the agreement (as the shm
// agreement assumes its one CAS completes).
//
// A put to the dead PE over the network fails inside UCX once its keepalive declares the
// endpoint dead (Open MPI prints "Internal error is appeared" from shmem_ulong_p, and UCX
// "error during flush: Endpoint timeout"): the put is dropped and shmem_quiet returns. A
// PE on the dead PE's machine reaches it by plain stores into the mapped heap, which land
// harmlessly in the dead process's memory.
#include "shmem/shmem_elastic.hpp"

#include <shmem.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"
#include "epx/spi/resources.hpp"
#include "process_identity.hpp"
#include "shmem/shmem_runtime.hpp"
#include "shmem/shmem_transport.hpp"

extern "C" int opal_progress(void);

namespace epx::detail {

namespace {

std::uint64_t load_word(const std::uint64_t* w) noexcept {
  return std::atomic_ref<const std::uint64_t>(*w).load(std::memory_order_acquire);
}
void store_word(std::uint64_t* w, std::uint64_t v) noexcept {
  std::atomic_ref<std::uint64_t>(*w).store(v, std::memory_order_release);
}

}  // namespace

ShmemControl::ShmemControl(int rank, int npes) : me_(rank), n_(static_cast<std::size_t>(npes)) {
  const std::size_t bytes = total_words() * sizeof(std::uint64_t);
  words_ = static_cast<std::uint64_t*>(shmem_malloc(bytes));  // collective
  if (words_ == nullptr)
    throw Error(ErrorCode::kCapacityExceeded, "rank " + std::to_string(rank) + ": shmem: shmem_malloc(" + std::to_string(bytes) +
                                                  " bytes) of the elastic words failed (symmetric heap full?)");
  std::memset(words_, 0, bytes);
  const ProcessIdentity self = ProcessIdentity::self();  // for the PEs of this machine to read
  words_[identity(me_)] = static_cast<std::uint64_t>(static_cast<std::uint32_t>(self.pid));
  words_[identity(me_) + 1] = self.start_time;
  words_[identity(me_) + 2] = self.pid_ns;
  mapped_.assign(n_, nullptr);
  for (int p = 0; p < npes; ++p)
    mapped_[static_cast<std::size_t>(p)] = p == me_ ? words_ : static_cast<std::uint64_t*>(shmem_ptr(words_, p));
  shmem_barrier_all();  // every PE zeroed its words before anyone writes into them
}

std::uint64_t* ShmemControl::word(int pe, std::size_t w) const noexcept {
  std::uint64_t* base = mapped_[static_cast<std::size_t>(pe)];
  return base == nullptr ? nullptr : base + w;
}

void ShmemControl::set(int pe, std::size_t w, std::uint64_t value) {
  if (std::uint64_t* mine = word(pe, w)) return store_word(mine, value);
  shmem_fence();  // after this PE's earlier puts to pe
  static_assert(sizeof(unsigned long) == sizeof(std::uint64_t));
  shmem_ulong_p(reinterpret_cast<unsigned long*>(words_ + w), static_cast<unsigned long>(value), pe);
}

void ShmemControl::put(int pe, std::size_t w, const std::uint64_t* src, std::size_t n) {
  if (std::uint64_t* mine = word(pe, w)) {
    for (std::size_t i = 0; i < n; ++i) std::atomic_ref<std::uint64_t>(mine[i]).store(src[i], std::memory_order_relaxed);
    return;
  }
  shmem_putmem(words_ + w, src, n * sizeof(std::uint64_t), pe);
}

std::uint64_t ShmemControl::load(std::size_t w) const noexcept { return load_word(words_ + w); }

bool ShmemControl::seen_dead(int pe) const {
  const std::uint64_t* theirs = pe == me_ ? nullptr : mapped_[static_cast<std::size_t>(pe)];
  if (theirs == nullptr) return false;
  ProcessIdentity id;
  id.pid = static_cast<std::int32_t>(theirs[identity(pe)]);
  id.start_time = theirs[identity(pe) + 1];
  id.pid_ns = theirs[identity(pe) + 2];
  return id.checkable() && id.ended();
}

namespace {
// One idle step of the control words' waits: progress (a network peer's put lands only while
// this PE progresses), then the core's wait policy (spi::Backoff: 64 short spins, then yields);
// past 256 looks the wait is a long one (the agreement waits the whole timeout for a dead PE)
// and rests 100 us between looks instead of taking the core. False once `deadline` has passed.
class ControlWait {
 public:
  explicit ControlWait(std::chrono::steady_clock::time_point deadline) : deadline_(deadline) {}
  bool step() {
    opal_progress();
    if (std::chrono::steady_clock::now() >= deadline_) return false;
    if (++looks_ > kRestAfter) {
      const timespec pause{0, 100'000};
      nanosleep(&pause, nullptr);
    } else {
      backoff_.step();
    }
    return true;
  }

 private:
  static constexpr unsigned kRestAfter = 256;
  std::chrono::steady_clock::time_point deadline_;
  spi::Backoff backoff_{64};
  unsigned looks_ = 0;
};
}  // namespace

bool ShmemControl::wait(std::size_t w, std::uint64_t at_least, std::chrono::steady_clock::time_point deadline) const {
  return wait_unless(w, at_least, deadline, [] { return false; });
}

bool ShmemControl::wait_unless(std::size_t w, std::uint64_t at_least, std::chrono::steady_clock::time_point deadline,
                               const std::function<bool()>& give_up) const {
  for (ControlWait idle(deadline);;) {
    if (load(w) >= at_least) return true;
    if (give_up()) return false;
    if (!idle.step()) return load(w) >= at_least;
  }
}

void ShmemControl::announce_gone(int pe, const std::vector<int>& pes) {
  for (int x : pes)
    if (x != pe && load(gone(x)) == 0) set(x, gone(pe), 1);
}

int ShmemControl::barrier(const std::vector<int>& pes, std::uint64_t stamp, std::chrono::milliseconds timeout) {
  for (int p : pes) set(p, barrier_word(me_), stamp);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::size_t i = 0; i < pes.size(); ++i)
    if (!wait(barrier_word(pes[i]), stamp, deadline)) return static_cast<int>(i);
  return -1;
}

int ShmemControl::meeting(const std::vector<int>& pes, std::uint64_t stamp, std::chrono::milliseconds timeout) {
  for (int p : pes) set(p, meet(me_), stamp);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::size_t i = 0; i < pes.size(); ++i) {
    const int q = pes[i];
    // A PE that dies meeting (a joiner killed while it joins) fails the meeting at once, not
    // at the timeout: a PE of its machine sees its process gone and tells the others.
    const bool met = wait_unless(meet(q), stamp, deadline, [&] {
      if (q == me_) return false;
      if (load(gone(q)) != 0) return true;
      if (!seen_dead(q)) return false;
      announce_gone(q, pes);
      return true;
    });
    if (!met) return static_cast<int>(i);
  }
  return -1;
}

// ---- the end of a job that lost PEs

namespace {

struct ExitGroup {
  std::shared_ptr<ShmemControl> control;
  std::vector<int> pes;
  int me;
  int lineage;
  std::chrono::milliseconds timeout;
};
std::atomic<ExitGroup*> g_exit_group{nullptr};

// Runs first among the exit handlers (registered after liboshmem's, which would finalise:
// a barrier over every PE, the dead ones too).
void end_job(int status, void*) {
  ExitGroup* g = g_exit_group.load(std::memory_order_acquire);
  if (g == nullptr || !g->control) return;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  int code = status;
  if (code == 0) {
    // Nobody ends the job while a survivor still works (its output still to come).
    const int missing = g->control->barrier(g->pes, ShmemControl::stamp(g->lineage, std::uint64_t{1} << 39), g->timeout);
    if (missing >= 0) {
      std::fprintf(stderr,
                   "epx: rank %d: at exit the survivors' last barrier timed out after %lld ms waiting for rank %d (PE %d); "
                   "ending the job\n",
                   g->me, static_cast<long long>(g->timeout.count()), missing, g->pes[static_cast<std::size_t>(missing)]);
      code = 1;
    }
  }
  ::signal(SIGTERM, SIG_DFL);  // the launcher's SIGTERM then ends the other survivors silently
  std::fflush(nullptr);
  if (g->me == 0) release_spares(*g->control);  // spare PEs never admitted end too, not as a failure
  if (code != 0 || g->me == 0) shmem_global_exit(code);
  // Rank 0's shmem_global_exit ends the job, and this process with it; should it not come:
  const auto limit = std::chrono::steady_clock::now() + 2 * g->timeout + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < limit) {
    const timespec pause{0, 50'000'000};
    nanosleep(&pause, nullptr);
  }
  _exit(code);
}

}  // namespace

bool launcher_keeps_survivors() noexcept {
  // The launcher's environment, fixed for the job: read once (the data path asks on every get).
  static const bool keeps = [] {
    const char* v = std::getenv("OMPI_MCA_orte_abort_on_non_zero_status");
    if (v == nullptr) return false;
    const std::string s = v;
    return s == "0" || s == "false" || s == "f" || s == "no" || s == "n" || s == "disabled";
  }();
  return keeps;
}

void end_job_with_group(std::shared_ptr<ShmemControl> control, std::vector<int> pes, int me, int lineage,
                        std::chrono::milliseconds timeout) {
  auto* g = new ExitGroup{std::move(control), std::move(pes), me, lineage, timeout};
  ExitGroup* old = g_exit_group.exchange(g, std::memory_order_acq_rel);
  if (old == nullptr) on_exit(&end_job, nullptr);
  delete old;
}

// ---- ShmemTransport's elastic calls

void ShmemTransport::require_live(const char* call) const {
  const int round = group_->retired.load(std::memory_order_acquire);
  if (round == 0) return;
  throw Error(ErrorCode::kBadHandle,
              "rank " + std::to_string(rank_) + ": " + call + " on a shmem group that was rebuilt (without its lost PEs, or "
                  "with joiners; round " + std::to_string(round) + "): a buffer of the old group cannot be used any more; "
                  "build it again on the group rebuild_group or admit returned",
              rank_);
}

namespace {
std::vector<int> pes_of(const std::vector<int>& pe, const std::vector<int>& ranks) {
  std::vector<int> v;
  for (int r : ranks) v.push_back(pe[static_cast<std::size_t>(r)]);
  return v;
}
}  // namespace

ShmemTransport::ShmemTransport(ShmemTransport& old, const Membership& m)
    : ShmemTransport(old, pes_of(old.pe_, m.survivors), m.new_rank, old.lineage_ + 1, old.timeout_) {}

ShmemTransport::ShmemTransport(const ShmemTransport& from, std::vector<int> pes, int rank, int lineage,
                               std::chrono::milliseconds timeout)
    : runtime_(from.runtime_),
      control_(from.control_),
      pe_(std::move(pes)),
      lineage_(lineage),
      heap_bytes_(from.heap_bytes_),
      rank_(rank),
      num_ranks_(static_cast<int>(pe_.size())),
      timeout_(timeout),
      caps_(from.caps_),
      puts_(new std::atomic<std::uint64_t>[pe_.size()]),
      put_bytes_(new std::atomic<std::uint64_t>[pe_.size()]),
      payload_bytes_(new std::atomic<std::uint64_t>[pe_.size()]),
      outstanding_(new std::atomic<bool>[pe_.size()]),
      unprobed_(new std::atomic<bool>[pe_.size()]) {
  for (int p : pe_) {
    node_of_rank_.push_back(runtime_->node_of_pe(p));
    mapped_.push_back(runtime_->mapped_pe(p));
  }
  const bool all_mapped = std::all_of(mapped_.begin(), mapped_.end(), [](bool x) { return x; });
  caps_.peer_memory_mapped = all_mapped;
  caps_.put_completes_on_return = all_mapped;
  for (int p = 0; p < num_ranks_; ++p)
    reset_counters(p), outstanding_[static_cast<std::size_t>(p)] = false, unprobed_[static_cast<std::size_t>(p)] = false;
  install_term_note();
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

void ShmemTransport::control_barrier(const char* phase) {
  note(phase, -1);
  const int missing = control_->barrier(pe_, ShmemControl::stamp(lineage_, group_->barriers.fetch_add(1) + 1), timeout_);
  if (missing < 0) return;
  ShmemRuntime::mark_failed();
  throw Error(ErrorCode::kTimeout,
              "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) + " ms in phase '" +
                  phase + "' waiting for " + describe_peer(missing) + " (shmem transport, a group rebuilt over the survivors)",
              missing);
}

void ShmemTransport::reuse_block(std::size_t bytes) {
  std::size_t got = 0;
  std::byte* b = runtime_->reuse_block(bytes, &got);
  if (b == nullptr)
    throw Error(ErrorCode::kCapacityExceeded,
                "rank " + std::to_string(rank_) + ": shmem: a window of " + format_bytes(bytes) +
                    " after PEs were lost: a group rebuilt over the survivors can only reuse the blocks the old group gave "
                    "back (shmem_malloc would wait for the dead PEs), and none of them holds it (blocks given back: " +
                    runtime_->orphans() + "). Destroy the old group's buffers before building the new ones, and build them "
                    "no bigger",
                rank_);
  base_ = b;
  block_bytes_ = got;
  runtime_->heap_in_use() += got;
  std::memset(base_, 0, got);
  // The same block on every member (each gave back the same ones, in the same order): each
  // compares the others' choice with its own before anyone writes into it.
  ShmemControl& c = *control_;
  const auto mine = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(b));
  for (int p = 0; p < num_ranks_; ++p) c.set(pe(p), c.check(pe(rank_)), mine);
  control_barrier("allocate (rebuilt group)");
  for (int p = 0; p < num_ranks_; ++p)
    if (c.load(c.check(pe(p))) != mine) {
      ShmemRuntime::mark_failed();
      throw Error(ErrorCode::kInternal,
                  "rank " + std::to_string(rank_) + ": shmem: allocate after a loss: " + describe_peer(p) +
                      " took another of the blocks the old group gave back than this rank (the ranks gave back different "
                      "blocks: did they destroy the old group's buffers alike?)",
                  p);
    }
}

bool ShmemTransport::member_gone(int rank) const noexcept { return control_->load(control_->gone(pe(rank))) != 0; }

// Everyone is here or known dead, or twice the timeout passed: whoever has not arrived by then is
// lost. A PE whose process a PE of its machine sees gone (its identity, in its own words) is
// announced dead to every member at once, so the agreement need not wait the timeout for it
// (a machine that is gone whole still costs the timeout).
std::vector<bool> ShmemTransport::arrivals(std::uint64_t stamp) {
  ShmemControl& c = *control_;
  const int P = num_ranks_;
  enum : char { kPending, kArrived, kDead };
  std::vector<char> state(static_cast<std::size_t>(P), kPending);
  state[static_cast<std::size_t>(rank_)] = kArrived;
  // Twice the timeout (the watchdog's limit here): a survivor may reach this a whole timeout
  // after another (held in a quiet toward the dead PE); the one that came first must not take
  // it for lost and decide without it.
  ControlWait idle(std::chrono::steady_clock::now() + watch_limit());
  for (unsigned i = 0;; ++i) {
    bool pending = false;
    for (int q = 0; q < P; ++q) {
      char& st = state[static_cast<std::size_t>(q)];
      if (st != kPending) continue;
      if (c.load(c.arrive(pe(q))) >= stamp) {
        st = kArrived;
      } else if (c.load(c.dead_at(pe(q))) >= stamp || member_gone(q)) {
        st = kDead;
      } else if (i % 64 == 0 && c.seen_dead(pe(q))) {
        for (int x = 0; x < P; ++x)
          if (x != q && !member_gone(x)) c.set(pe(x), c.dead_at(pe(q)), stamp);
        st = kDead;
      } else {
        pending = true;
      }
    }
    if (!pending || !idle.step()) break;
  }
  std::vector<bool> in(static_cast<std::size_t>(P), false);
  for (int q = 0; q < P; ++q) in[static_cast<std::size_t>(q)] = state[static_cast<std::size_t>(q)] == kArrived;
  return in;
}

Membership ShmemTransport::agree_survivors() {
  require_live("agree_survivors");
  const int P = num_ranks_, me = rank_;
  const std::string who = "rank " + std::to_string(me) + ": agree_survivors";
  if (static_cast<std::size_t>(P) > kMemberWords * 64)
    throw Error(ErrorCode::kUnsupported, who + ": more than " + std::to_string(kMemberWords * 64) + " ranks", me);
  note("elastic agree", -1);
  ShmemControl& c = *control_;
  const std::uint64_t g = group_->agree.fetch_add(1) + 1;
  const std::uint64_t stamp = ShmemControl::stamp(lineage_, g);
  const int parity = static_cast<int>(g % 2);
  // Not to a PE known gone: a put UCX cannot deliver stays in flight until its keepalive
  // declares the endpoint dead, holding up every shmem_quiet of this PE meanwhile.
  for (int q = 0; q < P; ++q)
    if (!member_gone(q)) c.set(pe(q), c.arrive(pe(me)), stamp);
  const std::vector<bool> in = arrivals(stamp);
  // The lowest rank that arrived decides: it writes the members it saw to each of them.
  const int leader = static_cast<int>(std::find(in.begin(), in.end(), true) - in.begin());
  if (leader == me) {
    std::uint64_t bits[kMemberWords] = {};
    for (int q = 0; q < P; ++q)
      if (in[static_cast<std::size_t>(q)]) bits[q / 64] |= std::uint64_t{1} << (q % 64);
    for (int q = 0; q < P; ++q)
      if (in[static_cast<std::size_t>(q)]) {
        c.put(pe(q), c.members(parity), bits, kMemberWords);
        c.set(pe(q), c.decided(), stamp);
      }
  } else if (!c.wait(c.decided(), stamp, std::chrono::steady_clock::now() + 2 * timeout_)) {
    ShmemRuntime::mark_failed();
    throw Error(ErrorCode::kTimeout,
                who + ": " + describe_peer(leader) + ", the lowest rank that arrived, published no decision of round " +
                    std::to_string(g) + " within " + std::to_string(2 * timeout_.count()) + " ms (it died while deciding?)",
                leader);
  }
  Membership m = decided_membership(g, P, me, who, [&c, parity](std::size_t w) { return c.load(c.members(parity) + w); });
  if (!m.lost.empty()) {
    // From here an exit() ends the job the survivors' way (a failure in between too).
    std::vector<int> pes;
    for (int o : m.survivors) pes.push_back(pe(o));
    end_job_with_group(control_, std::move(pes), m.new_rank, lineage_ + 1, timeout_);
  }
  return m;
}

std::unique_ptr<Transport> ShmemTransport::rebuild_group(const Membership& m) {
  require_live("rebuild_group");
  const int me = rank_;
  if (m.old_num_ranks != num_ranks_ || m.new_rank < 0 || m.survivors.empty() ||
      static_cast<std::size_t>(m.new_rank) >= m.survivors.size() || m.survivors[static_cast<std::size_t>(m.new_rank)] != me)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(me) + ": rebuild_group: the membership is not one agree_survivors gave this rank", me);
  note("elastic rebuild", -1);
  if (!m.lost.empty()) ShmemRuntime::mark_lost();  // from now on no call over every PE
  release_heap();                                  // given back (kept): the new group's windows reuse it
  remove_term_note();                              // the SIGTERM line describes the new group
  auto group = std::unique_ptr<ShmemTransport>(new ShmemTransport(*this, m));
  group->control_barrier("elastic rebuild");
  group_->retired.store(m.round, std::memory_order_release);  // the old group's buffers now fail at once
  if (ShmemRuntime::lost()) end_job_with_group(control_, group->pe_, group->rank_, group->lineage_, timeout_);
  else end_job_with_group(nullptr, {}, 0, 0, timeout_);  // nobody lost: the job ends as any
  return group;
}

std::vector<std::int64_t> ShmemTransport::sum_over_group(const std::vector<std::int64_t>& values) {
  require_live("sum_over_group");
  const int P = num_ranks_, me = rank_;
  if (values.empty() || values.size() > kSumWords)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(me) + ": sum_over_group takes 1 to " + std::to_string(kSumWords) + " values, got " +
                    std::to_string(values.size()),
                me);
  const char* phase = "elastic sum";
  note(phase, -1);
  ShmemControl& c = *control_;
  // Two parities: a rank can be at most one sum ahead of a peer still reading.
  const std::uint64_t n = group_->sums.fetch_add(1) + 1;
  const std::uint64_t stamp = ShmemControl::stamp(lineage_, n);
  const int parity = static_cast<int>(n % 2);
  std::uint64_t words[kSumWords] = {};
  for (std::size_t i = 0; i < values.size(); ++i) words[i] = static_cast<std::uint64_t>(values[i]);
  for (int q = 0; q < P; ++q) {
    c.put(pe(q), c.sum_words(pe(me), parity), words, kSumWords);
    c.set(pe(q), c.sum_round(pe(me)), stamp);
  }
  std::vector<std::int64_t> total(values.size(), 0);
  for (int q = 0; q < P; ++q) {
    if (!c.wait(c.sum_round(pe(q)), stamp, std::chrono::steady_clock::now() + timeout_)) {
      ShmemRuntime::mark_failed();
      throw Error(ErrorCode::kTimeout,
                  "rank " + std::to_string(me) + ": timed out after " + std::to_string(timeout_.count()) + " ms in phase '" +
                      phase + "' waiting for " + describe_peer(q) + " (shmem transport)",
                  q);
    }
    for (std::size_t i = 0; i < values.size(); ++i)
      total[i] += static_cast<std::int64_t>(c.load(c.sum_words(pe(q), parity) + i));
  }
  return total;
}

}  // namespace epx::detail
