// Joins on the shmem transport (epx/elastic.hpp: admit, request_ranks, joined_admission):
// the job's spare PEs. oshrun starts N + S PEs; with EPX_SHMEM_SPARES=S the last S are
// spares. connect makes the transport over every PE (every shmem_malloc of the job happens
// there, while all PEs take part: the elastic words, the reserve), then gives the first N
// the group over them and keeps each spare waiting inside connect until an admission takes
// it (connect then returns the new group, and joined_admission() says how), or until the
// job ends (then the spare ends, status 0, without returning). From the first connect on
// the job makes no call over every PE (ShmemRuntime::mark_partial): the group's windows
// come from the reserve EPX_SHMEM_ELASTIC_RESERVE, as a rebuilt group's do.
//
// An admission, through the control words (ShmemControl): the members' rank 0 probes the
// spares still waiting (two words set on each, answered on rank 0), claims the first
// `joiners` that answer within the wait, and writes the decision (the new group's PEs: the
// members in rank order, then the joiners; lineage, tag, round; which spares are out) to
// every member and joiner. Each of them makes the new group and meets the others in its
// first barrier; the members then sum over the old group whether it stood for every one
// of them (one voting step), and rank 0 writes that verdict to the joiners. A spare that
// does not answer a probe, or a joiner of an abandoned admission, is out: never claimed
// again. Every member keeps the same book of the spares (it follows the decisions).
#include <shmem.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "control_block.hpp"
#include "elastic_ops.hpp"
#include "epx/error.hpp"
#include "shmem/shmem_elastic.hpp"
#include "shmem/shmem_runtime.hpp"
#include "shmem/shmem_settings.hpp"
#include "shmem/shmem_transport.hpp"

extern "C" int opal_progress(void);

namespace epx::detail {

namespace {

// The book, per PE: a spare still waiting, a spare that is out (dead, or failed to join),
// or a PE that is (or was) in a group.
enum : std::uint64_t { kSpareWaiting = 0, kSpareOut = 1, kInGroup = 2 };
std::vector<std::uint64_t> g_book;  // [pe]; empty: the job has no spares

constexpr std::uint64_t kStands = 1, kAbandoned = 2;
// join_head's words.
enum : std::size_t { kHeadLineage, kHeadOldRanks, kHeadRanks, kHeadTag, kHeadRound, kHeadTimeoutMs, kHeadLeader };

using Clock = std::chrono::steady_clock;

// One idle step of a join's waits: progress (a network peer's put lands only while this PE
// progresses), then a short rest. False once `deadline` has passed.
bool idle(Clock::time_point deadline, long rest_ns = 50'000) {
  opal_progress();
  if (Clock::now() >= deadline) return false;
  const timespec pause{0, rest_ns};
  nanosleep(&pause, nullptr);
  return true;
}

// A spare released at the job's end: rank 0 ends the job (shmem_global_exit) right after;
// until then, or a bound, nothing (liboshmem's finalize would wait for every PE).
[[noreturn]] void end_spare(std::chrono::milliseconds timeout) {
  std::fflush(nullptr);
  const auto limit = Clock::now() + 2 * timeout + std::chrono::seconds(5);
  while (Clock::now() < limit) {
    const timespec pause{0, 50'000'000};
    nanosleep(&pause, nullptr);
  }
  _exit(0);
}

}  // namespace

int job_spares(Bootstrap& bootstrap, int npes) {
  const char* text = std::getenv("EPX_SHMEM_SPARES");
  const char* reserve = std::getenv("EPX_SHMEM_ELASTIC_RESERVE");
  std::int64_t mine[2] = {0, reserve != nullptr && parse_heap_size(reserve) > 0 ? 1 : 0};
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    mine[0] = *end == '\0' && v >= 0 ? v : -1;
  }
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(npes));
  bootstrap.allgather(mine, all.data(), sizeof mine);
  const int me = bootstrap.rank();
  const std::string who = "rank " + std::to_string(me) + ": shmem: EPX_SHMEM_SPARES";
  for (int p = 0; p < npes; ++p)
    if (all[2 * static_cast<std::size_t>(p)] != mine[0])
      throw Error(ErrorCode::kInvalidArgument, who + " differs between the ranks (rank " + std::to_string(p) +
                                                   " has another): give every rank the same (oshrun -x)", p);
  if (mine[0] < 0 || mine[0] >= npes)
    throw Error(ErrorCode::kInvalidArgument, who + "=" + text + ": want a count of spare PEs from 0 to " +
                                                 std::to_string(npes - 1) + " (the job has " + std::to_string(npes) + ")", me);
  if (mine[0] == 0) return 0;
  for (int p = 0; p < npes; ++p)
    if (all[2 * static_cast<std::size_t>(p) + 1] == 0)
      throw Error(ErrorCode::kInvalidArgument,
                  who + " needs EPX_SHMEM_ELASTIC_RESERVE=SIZE on every rank (rank " + std::to_string(p) +
                      " has none): with spares the group takes its windows from that reserve, since shmem_malloc runs "
                      "over every PE and the spares make no such call",
                  p);
  const int members = npes - static_cast<int>(mine[0]);
  g_book.assign(static_cast<std::size_t>(npes), kSpareWaiting);
  for (int p = 0; p < members; ++p) g_book[static_cast<std::size_t>(p)] = kInGroup;
  return static_cast<int>(mine[0]);
}

void release_spares(ShmemControl& c) {
  for (int p = 0; p < static_cast<int>(g_book.size()); ++p)
    if (g_book[static_cast<std::size_t>(p)] == kSpareWaiting && !c.known_dead(p)) c.set(p, c.release(), 1);
}

std::unique_ptr<Transport> ShmemTransport::split_spares(std::unique_ptr<ShmemTransport> all, int spares) {
  ShmemRuntime::mark_partial();  // the spares make no call over every PE: nobody does from now on
  const int members = all->num_ranks_ - spares, me = all->rank_;
  if (me >= members) return all->wait_as_spare();
  std::vector<int> pes(static_cast<std::size_t>(members));
  for (int p = 0; p < members; ++p) pes[static_cast<std::size_t>(p)] = p;
  all->remove_term_note();  // the group's SIGTERM line names its ranks
  auto group = std::unique_ptr<ShmemTransport>(new ShmemTransport(*all, std::move(pes), me, 1, all->timeout_));
  end_job_with_group(group->control_, group->pe_, me, 1, group->timeout_);
  return group;
}

std::unique_ptr<Transport> ShmemTransport::wait_as_spare() {
  remove_term_note();
  ::signal(SIGTERM, SIG_DFL);  // the launcher's SIGTERM at the job's end ends a waiting spare silently
  note("spare: waiting for an admission", -1);
  ShmemControl& c = *control_;
  const int me = c.my_pe();
  std::uint64_t probed = 0, invited = 0;
  for (;;) {
    if (c.load(c.release()) != 0) end_spare(timeout_);
    const std::uint64_t p = c.load(c.probe());
    if (p > probed) {  // an admitting rank 0 asks whether this spare lives
      probed = p;
      c.set(static_cast<int>(c.load(c.probe_from())), c.probe_ack(me), p);
    }
    const std::uint64_t j = c.load(c.join_stamp());
    if (j > invited) {
      invited = j;
      if (std::unique_ptr<Transport> group = join_invited(j)) return group;
      ::signal(SIGTERM, SIG_DFL);
      note("spare: waiting for an admission", -1);
      continue;
    }
    idle(Clock::time_point::max(), 1'000'000);
  }
}

std::unique_ptr<Transport> ShmemTransport::join_invited(std::uint64_t stamp) {
  ShmemControl& c = *control_;
  const int me = c.my_pe(), n = c.num_pes();
  auto head = [&c](std::size_t i) { return c.load(c.join_head(i)); };
  const int lineage = static_cast<int>(head(kHeadLineage)), old_p = static_cast<int>(head(kHeadOldRanks));
  const int q = static_cast<int>(head(kHeadRanks));
  const std::chrono::milliseconds timeout(static_cast<long long>(head(kHeadTimeoutMs)));
  if (q > n || old_p >= q) return nullptr;
  std::vector<int> roster;
  for (int i = 0; i < q; ++i) roster.push_back(static_cast<int>(c.load(c.roster() + static_cast<std::size_t>(i))));
  const auto at = std::find(roster.begin(), roster.end(), me);
  const int rank = static_cast<int>(at - roster.begin());
  if (rank < old_p || rank >= q) return nullptr;  // not invited into this one
  for (int p = 0; p < n; ++p) g_book[static_cast<std::size_t>(p)] = c.load(c.book() + static_cast<std::size_t>(p));
  FaultPlan fault = FaultPlan::from_env();  // the tests' "a spare dies while joining"
  fault.maybe_fire(me, "elastic admit");
  auto group = std::unique_ptr<ShmemTransport>(new ShmemTransport(*this, roster, rank, lineage + 1, timeout));
  group->note("elastic admit", -1);
  c.meeting(roster, stamp, timeout);  // whatever this joiner saw, the members' verdict decides
  // The verdict follows the members' barrier and their sum: each at most the timeout.
  c.wait(c.outcome_stamp(), stamp, Clock::now() + 3 * timeout);
  if (c.load(c.outcome_stamp()) < stamp || c.load(c.outcome()) != kStands) return nullptr;
  for (int p : roster) g_book[static_cast<std::size_t>(p)] = kInGroup;
  g_transport_joined = Admission{static_cast<int>(head(kHeadRound)), old_p, q - old_p, rank, head(kHeadTag)};
  end_job_with_group(control_, group->pe_, rank, lineage + 1, timeout);
  return group;
}

std::vector<int> ShmemTransport::claim_spares(std::uint64_t stamp, int want, std::chrono::milliseconds wait) {
  ShmemControl& c = *control_;
  const int me = pe(rank_);
  std::vector<int> asked, answered;
  for (int p = 0; p < c.num_pes(); ++p) {
    std::uint64_t& state = g_book[static_cast<std::size_t>(p)];
    if (state != kSpareWaiting) continue;
    if (c.known_dead(p)) {
      state = kSpareOut;
      continue;
    }
    c.set(p, c.probe_from(), static_cast<std::uint64_t>(me));
    c.set(p, c.probe(), stamp);
    asked.push_back(p);
  }
  const auto deadline = Clock::now() + wait;
  for (;;) {
    answered.clear();
    for (int p : asked)
      if (c.load(c.probe_ack(p)) >= stamp) answered.push_back(p);
    if (static_cast<int>(answered.size()) >= want || answered.size() == asked.size() || !idle(deadline)) break;
  }
  for (int p : asked)
    if (std::find(answered.begin(), answered.end(), p) == answered.end()) g_book[static_cast<std::size_t>(p)] = kSpareOut;
  if (static_cast<int>(answered.size()) > want) answered.resize(static_cast<std::size_t>(want));
  return answered;
}

void ShmemTransport::publish_admission(const std::vector<int>& joiners, std::uint64_t stamp, std::uint64_t tag,
                                       std::uint64_t round) {
  ShmemControl& c = *control_;
  std::vector<std::uint64_t> roster(pe_.begin(), pe_.end());
  for (int j : joiners) roster.push_back(static_cast<std::uint64_t>(j));
  std::uint64_t head[ShmemControl::kJoinHead] = {};
  head[kHeadLineage] = static_cast<std::uint64_t>(lineage_);
  head[kHeadOldRanks] = static_cast<std::uint64_t>(num_ranks_);
  head[kHeadRanks] = roster.size();
  head[kHeadTag] = tag;
  head[kHeadRound] = round;
  head[kHeadTimeoutMs] = static_cast<std::uint64_t>(timeout_.count());
  head[kHeadLeader] = static_cast<std::uint64_t>(pe(rank_));
  for (std::size_t i = 0; i < roster.size(); ++i) {
    const int p = static_cast<int>(roster[i]);
    if (i < pe_.size() && member_gone(static_cast<int>(i))) continue;  // the sum will fail on it
    c.put(p, c.join_head(0), head, ShmemControl::kJoinHead);
    c.put(p, c.roster(), roster.data(), roster.size());
    c.put(p, c.book(), g_book.data(), g_book.size());
    c.set(p, c.join_stamp(), stamp);
  }
}

std::unique_ptr<ShmemTransport> ShmemTransport::meet_joiners(const std::vector<int>& roster, std::uint64_t stamp) {
  ShmemControl& c = *control_;
  remove_term_note();  // the new group's SIGTERM line names its ranks (this one's again if abandoned)
  auto group = std::unique_ptr<ShmemTransport>(new ShmemTransport(*this, roster, rank_, lineage_ + 1, timeout_));
  group->note("elastic admit", -1);
  // A joiner that died or never came fails it here; the members decide below, together.
  const bool stands = c.meeting(roster, stamp, timeout_) < 0;
  const std::vector<int> joiners(roster.begin() + num_ranks_, roster.end());
  auto tell_joiners = [&](std::uint64_t verdict) {
    if (rank_ != 0) return;
    for (int p : joiners) {
      if (c.known_dead(p)) continue;
      c.put(p, c.outcome(), &verdict, 1);
      c.set(p, c.outcome_stamp(), stamp);
    }
  };
  std::vector<std::int64_t> failed;
  try {
    failed = sum_over_group({stands ? 0 : 1});
  } catch (...) {
    tell_joiners(kAbandoned);
    for (int p : joiners) g_book[static_cast<std::size_t>(p)] = kSpareOut;
    group.reset();
    install_term_note();
    throw;
  }
  const bool commit = failed[0] == 0;
  tell_joiners(commit ? kStands : kAbandoned);
  for (int p : joiners) g_book[static_cast<std::size_t>(p)] = commit ? kInGroup : kSpareOut;
  if (commit) return group;
  group.reset();  // the old group goes on as it was
  install_term_note();
  return nullptr;
}

std::unique_ptr<Transport> ShmemTransport::admit(const AdmitOptions& options, Admission* admission) {
  require_live("admit");
  const int P = num_ranks_, me = rank_;
  const std::string who = "rank " + std::to_string(me) + ": admit";
  if (options.joiners < 1 || options.wait.count() < 0)
    throw Error(ErrorCode::kInvalidArgument,
                who + ": AdmitOptions::joiners must be >= 1 and wait >= 0, got " + std::to_string(options.joiners) + " and " +
                    std::to_string(options.wait.count()) + " ms",
                me);
  if (g_book.empty())
    throw Error(ErrorCode::kUnsupported,
                who + ": on the shmem transport ranks join from the job's spare PEs: start it with EPX_SHMEM_SPARES=S "
                      "(oshrun -x; the last S PEs wait in connect until admitted); this job has none",
                me);
  note("elastic admit", -1);
  ShmemControl& c = *control_;
  const std::uint64_t g = group_->admits.fetch_add(1) + 1;
  const std::uint64_t stamp = ShmemControl::stamp(lineage_, g);
  if (admission != nullptr) *admission = Admission{static_cast<int>(g), P, 0, me, options.tag};
  const std::chrono::milliseconds wait = options.wait.count() > 0 ? options.wait : timeout_;
  if (me == 0) {
    publish_admission(claim_spares(stamp, options.joiners, wait), stamp, options.tag, g);
  } else if (!c.wait(c.join_stamp(), stamp, Clock::now() + wait + timeout_)) {
    throw Error(ErrorCode::kTimeout,
                who + ": " + describe_peer(0) + " published no admission within " + std::to_string((wait + timeout_).count()) +
                    " ms (it died while admitting?)",
                0);
  }
  const int q = static_cast<int>(c.load(c.join_head(kHeadRanks)));
  for (std::size_t p = 0; p < g_book.size(); ++p) g_book[p] = c.load(c.book() + p);
  if (q <= P) return nullptr;  // no spare answered: the group as it was
  std::vector<int> roster;
  for (int i = 0; i < q; ++i) roster.push_back(static_cast<int>(c.load(c.roster() + static_cast<std::size_t>(i))));
  std::unique_ptr<ShmemTransport> group = meet_joiners(roster, stamp);
  if (group == nullptr) return nullptr;
  release_heap();  // given back (kept): the new group's windows reuse it
  group_->retired.store(static_cast<int>(g), std::memory_order_release);
  end_job_with_group(control_, group->pe_, group->rank_, group->lineage_, timeout_);
  if (admission != nullptr) admission->joined = q - P;
  return group;
}

void ShmemTransport::request_ranks(int count) {
  require_live("request_ranks");
  const std::string who = "rank " + std::to_string(rank_) + ": request_ranks";
  if (g_book.empty())
    throw Error(ErrorCode::kUnsupported, who + ": this shmem job has no spare PEs (EPX_SHMEM_SPARES)", rank_);
  const auto waiting = std::count(g_book.begin(), g_book.end(), kSpareWaiting);
  if (count < 1 || count > waiting)
    throw Error(ErrorCode::kInvalidArgument,
                who + ": " + std::to_string(count) + " rank(s) asked for, " + std::to_string(waiting) +
                    " spare PE(s) of the job still wait (the spares run already: admit claims them)",
                rank_);
}

}  // namespace epx::detail
