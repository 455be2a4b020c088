// Elastic groups (epx/elastic.hpp): the survivors' agreement and the group's small sums
// through the control block, and the rebuilt group: a shm transport over a new control
// block. Who is dead: in a launched group the launcher records deaths in the launch's
// control block (by the ranks' original numbers), and a rebuilt group reads them there; in
// a connect()-ed group (and a group rebuilt from one) every slot holds its rank's process
// identity (ProcessIdentity), which the survivors check themselves, and the rebuilt group's
// block gets copies of its members' identities.
#include "epx/elastic.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "control_block.hpp"
#include "elastic_ops.hpp"
#include "elastic_shm.hpp"
#include "epx/launch.hpp"
#include "process_identity.hpp"
#include "shm/shm_transport.hpp"

namespace epx {

static_assert(detail::kMemberWords * 64 >= static_cast<std::size_t>(kMaxRanks));
static_assert(detail::kSumWords == kMaxSumValues);

bool is_peer_loss(const Error& error) noexcept {
  return error.code() == ErrorCode::kPeerFailed || error.code() == ErrorCode::kTimeout;
}

int Membership::new_rank_of(int old_rank) const noexcept {
  const auto it = std::lower_bound(survivors.begin(), survivors.end(), old_rank);
  return it != survivors.end() && *it == old_rank ? static_cast<int>(it - survivors.begin()) : -1;
}

namespace detail {

ShmTransport& elastic_shm(Transport& t, const char* what) {
  auto* shm = dynamic_cast<ShmTransport*>(&t);
  if (shm == nullptr)
    throw Error(ErrorCode::kUnsupported,
                "rank " + std::to_string(t.rank()) + ": " + what +
                    ": elastic groups need the shm transport (processes on one machine: epx::launch with "
                    "LaunchOptions::elastic, or a connect()-ed group; across machines the shmem transport heals from "
                    "losses: agree_survivors, rebuild_group, sum_over_group); this transport is '" +
                    t.caps().name + "'");
  if (shm->retired_round() != 0)
    throw Error(ErrorCode::kBadHandle,
                "rank " + std::to_string(t.rank()) + ": " + what + ": this group was rebuilt already (round " +
                    std::to_string(shm->retired_round()) + "): call it on the group the rebuild returned",
                t.rank());
  return *shm;
}

bool LossWatch::operator()(int p) {
  const auto u = static_cast<std::size_t>(p);
  if (lost_[u]) return true;
  if (t_.control_block()->ranks()[p].state.load(std::memory_order_acquire) != kRunning) return lost_[u] = true;
  if (t_.launcher_watched()) return lost_[u] = t_.peer_ended(p);  // a load of the launcher's record
  const auto now = std::chrono::steady_clock::now();
  if (now < next_[u]) return false;
  next_[u] = now + std::chrono::milliseconds(10);
  return lost_[u] = t_.peer_ended(p);
}

std::string rank_str(int r) { return "rank " + std::to_string(r); }

ElasticShmTransport::ElasticShmTransport(ControlBlock* control, std::size_t control_bytes, int rank,
                                         std::chrono::milliseconds timeout, std::string prefix, ControlBlock* root,
                                         std::vector<int> root_ranks, bool launched, std::function<void()> wait_hook)
    : ShmTransport(control, rank, timeout, std::move(prefix)),
      control_bytes_(control_bytes),
      root_(root),
      root_ranks_(std::move(root_ranks)),
      launched_(launched) {
  wait_hook_ = std::move(wait_hook);
  disarm_fault_hook();
  // A joiner of a connect()-ed group has no first group's block: its root is this block,
  // whose slots may be fewer than the root numbers.
  const int o = root_ranks_[static_cast<std::size_t>(rank)];
  if (o >= 0 && o < root_->num_ranks) mirror_phases_to(root_, o);
}

ElasticShmTransport::~ElasticShmTransport() {
  // A peer still waiting for this rank fails at once ("finished without answering").
  std::int32_t running = kRunning;
  control_->ranks()[rank()].state.compare_exchange_strong(running, static_cast<std::int32_t>(RankState::kDone),
                                                           std::memory_order_acq_rel);
  munmap(control_, control_bytes_);
}

void ElasticShmTransport::check_alive(const char* phase) const {
  if (!launched_) {
    // No launcher: this group's slots hold its members' process identities.
    return check_processes(phase, [this](int p) {
      return " (rank " + std::to_string(root_ranks_[static_cast<std::size_t>(p)]) + " of the first group)";
    });
  }
  for (int p = 0; p < num_ranks(); ++p) {
    const int o = root_ranks_[static_cast<std::size_t>(p)];
    if (p == rank() || root_->ranks()[o].state.load(std::memory_order_acquire) != kFailed) continue;
    const std::string msg = rank_str(rank()) + ": peer rank " + std::to_string(p) + " (rank " + std::to_string(o) +
                            " of the launched group) failed while this rank waited in phase '" + phase +
                            "': " + root_->ranks()[o].message;
    control_->record_failure(p, static_cast<int>(ErrorCode::kPeerFailed), p, msg.c_str());
    throw Error(ErrorCode::kPeerFailed, msg, p);
  }
}

Membership decided_membership(std::uint64_t round, int old_num_ranks, int me, const std::string& who,
                              const std::function<std::uint64_t(std::size_t)>& member_word) {
  Membership m;
  m.round = static_cast<int>(round);
  m.old_num_ranks = old_num_ranks;
  for (int p = 0; p < old_num_ranks; ++p) {
    const bool in = (member_word(static_cast<std::size_t>(p / 64)) >> (p % 64)) & 1u;
    (in ? m.survivors : m.lost).push_back(p);
  }
  m.new_rank = m.new_rank_of(me);
  if (m.new_rank < 0)
    throw Error(ErrorCode::kPeerFailed,
                who + ": this rank was left out of the survivors' group of round " + std::to_string(round) +
                    " (it arrived after the others decided without it)",
                me);
  return m;
}

std::size_t block_bytes(int P) { return (ControlBlock::bytes_for(P) + 4095) / 4096 * 4096; }

void* map_block(const std::string& name, std::size_t bytes) {
  void* memory = MAP_FAILED;
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd >= 0) {
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  return memory;
}

}  // namespace detail

Membership agree_survivors(Transport& transport) {
  using namespace detail;
  if (auto* ops = dynamic_cast<ElasticOps*>(&transport)) return ops->agree_survivors();  // shmem: its own words
  ShmTransport& t = elastic_shm(transport, "agree_survivors");
  ControlBlock* c = t.control_block();
  const int P = t.num_ranks(), me = t.rank();
  const std::string who = rank_str(me) + ": agree_survivors";
  t.enter_phase("elastic agree");
  const std::uint32_t g = c->ranks()[me].elastic_round.load(std::memory_order_relaxed) + 1;
  c->ranks()[me].elastic_round.store(g, std::memory_order_release);
  auto arrived = [&](int p) { return c->ranks()[p].elastic_round.load(std::memory_order_acquire) >= g; };
  LossWatch is_lost(t);

  // Everyone is here or gone (or the timeout passed): one rank decides, in a single CAS.
  wait_for(t.timeout(), [&] {
    if (c->elastic_decided.load(std::memory_order_acquire) >= g) return true;
    for (int p = 0; p < P; ++p)
      if (p != me && !arrived(p) && !is_lost(p)) return false;
    return true;
  });
  std::uint32_t expected = g - 1;
  if (c->elastic_claim.compare_exchange_strong(expected, g, std::memory_order_acq_rel)) {
    std::atomic<std::uint64_t>* words = c->elastic_members[g % 2];
    for (std::size_t w = 0; w < kMemberWords; ++w) words[w].store(0, std::memory_order_relaxed);
    for (int p = 0; p < P; ++p)
      if (p == me || (arrived(p) && !is_lost(p)))
        words[p / 64].fetch_or(std::uint64_t{1} << (p % 64), std::memory_order_relaxed);
    c->elastic_decided.store(g, std::memory_order_release);
  }
  if (!wait_for(t.timeout(), [&] { return c->elastic_decided.load(std::memory_order_acquire) >= g; }))
    throw Error(ErrorCode::kTimeout,
                who + ": no survivor published the decision of round " + std::to_string(g) + " within " +
                    std::to_string(t.timeout().count()) + " ms (the deciding rank died while deciding?)",
                -1);

  const std::atomic<std::uint64_t>* words = c->elastic_members[g % 2];
  return decided_membership(g, P, me, who, [words](std::size_t w) { return words[w].load(std::memory_order_relaxed); });
}

namespace detail {
namespace {

// One rebuild, as its steps share it.
struct RebuildCall {
  ShmTransport& t;
  const Membership& m;
  int me, P, leader;          // P: the new group's size; leader: its rank 0 (old rank)
  std::uint32_t g;            // the agreement's round
  std::string who, prefix;    // the new group's segment prefix
  std::string name;           // its control block
  std::size_t bytes;
};

// The new group's rank 0: creates its control block (the members' identities copied) and
// announces it; on failure announces that, for the others to fail at once too.
void* create_rebuilt_block(const RebuildCall& r) {
  ControlBlock* c = r.t.control_block();
  void* memory = MAP_FAILED;
  const int fd = shm_open(r.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd >= 0) {
    if (ftruncate(fd, static_cast<off_t>(r.bytes)) == 0)
      memory = mmap(nullptr, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
  }
  if (memory == MAP_FAILED) {
    const int err = errno;
    shm_unlink(r.name.c_str());
    c->elastic_ready_failed.store(r.g, std::memory_order_release);
    throw Error(ErrorCode::kIo, r.who + ": cannot create the group's control block " + r.name + ": " + std::strerror(err), r.me);
  }
  ControlBlock* fresh = ControlBlock::create(memory, r.P, c->job_id);
  // Who each member is (a group without a launcher checks its peers' processes by these).
  for (int i = 0; i < r.P; ++i)
    record_identity(identity_of(c->ranks()[r.m.survivors[static_cast<std::size_t>(i)]]), fresh->ranks()[i]);
  c->elastic_ready.store(r.g, std::memory_order_release);
  return memory;
}

// The other survivors: wait for rank 0's announcement (or its failure or death), then map it.
void* map_rebuilt_block(const RebuildCall& r) {
  ControlBlock* c = r.t.control_block();
  LossWatch is_lost(r.t);
  const bool ready = wait_for(r.t.timeout(), [&] {
    return c->elastic_ready.load(std::memory_order_acquire) >= r.g ||
           c->elastic_ready_failed.load(std::memory_order_acquire) >= r.g || is_lost(r.leader);
  });
  if (!ready || c->elastic_ready.load(std::memory_order_acquire) < r.g)
    throw Error(ready ? ErrorCode::kPeerFailed : ErrorCode::kTimeout,
                r.who + ": rank " + std::to_string(r.leader) + " (the new group's rank 0) " +
                    (!ready ? "did not create the group's control block within " + std::to_string(r.t.timeout().count()) + " ms"
                            : std::string("failed to create the group's control block or died")),
                r.leader);
  void* memory = map_block(r.name, r.bytes);
  if (memory == MAP_FAILED)
    throw Error(ErrorCode::kIo, r.who + ": cannot map the group's control block " + r.name + ": " + std::strerror(errno), r.leader);
  return memory;
}

}  // namespace
}  // namespace detail

std::unique_ptr<Transport> rebuild_group(Transport& old_group, const Membership& m) {
  using namespace detail;
  if (auto* ops = dynamic_cast<ElasticOps*>(&old_group)) return ops->rebuild_group(m);
  ShmTransport& t = elastic_shm(old_group, "rebuild_group");
  const int me = t.rank();
  const std::string who = rank_str(me) + ": rebuild_group";
  if (m.old_num_ranks != t.num_ranks() || m.new_rank < 0 || m.survivors.empty() ||
      m.survivors[static_cast<std::size_t>(m.new_rank)] != me)
    throw Error(ErrorCode::kInvalidArgument, who + ": the membership is not one agree_survivors gave this rank", me);
  t.enter_phase("elastic rebuild");
  t.release_windows();  // nobody touches the old windows any more

  const int P = static_cast<int>(m.survivors.size());
  const std::string prefix = t.prefix() + "e" + std::to_string(m.round) + "-";
  const RebuildCall r{t, m, me, P, m.survivors[0], static_cast<std::uint32_t>(m.round), who, prefix, "/" + prefix + "ctl",
                      block_bytes(P)};
  void* memory = me == r.leader ? create_rebuilt_block(r) : map_rebuilt_block(r);

  std::vector<int> root_ranks(static_cast<std::size_t>(P));
  for (int i = 0; i < P; ++i) root_ranks[static_cast<std::size_t>(i)] = t.root_rank(m.survivors[static_cast<std::size_t>(i)]);
  auto group = std::make_unique<ElasticShmTransport>(static_cast<ControlBlock*>(memory), r.bytes, m.new_rank, t, prefix,
                                                     std::move(root_ranks));
  try {
    group->join("elastic rebuild");
  } catch (...) {
    if (me == r.leader) shm_unlink(r.name.c_str());
    throw;
  }
  if (me == r.leader) shm_unlink(r.name.c_str());  // every member maps it: nothing left in /dev/shm
  t.retire(m.round);  // the old group's buffers now fail at once, naming the rebuild
  return group;
}

std::vector<std::int64_t> sum_over_group(Transport& transport, const std::vector<std::int64_t>& values) {
  using namespace detail;
  if (auto* ops = dynamic_cast<ElasticOps*>(&transport)) return ops->sum_over_group(values);
  ShmTransport& t = elastic_shm(transport, "sum_over_group");
  if (values.empty() || values.size() > kSumWords)
    throw Error(ErrorCode::kInvalidArgument,
                rank_str(t.rank()) + ": sum_over_group takes 1 to " + std::to_string(kSumWords) + " values, got " +
                    std::to_string(values.size()),
                t.rank());
  ControlBlock* c = t.control_block();
  const int P = t.num_ranks(), me = t.rank();
  const char* phase = "elastic sum";
  t.enter_phase(phase);
  // Two parities: a rank can be at most one sum ahead of a peer still reading (it cannot
  // finish sum n+1 before that peer arrived at it, which the peer does after reading sum n).
  const std::uint32_t n = c->ranks()[me].sum_round.load(std::memory_order_relaxed) + 1;
  for (std::size_t i = 0; i < values.size(); ++i) c->ranks()[me].sum_words[n % 2][i].store(values[i], std::memory_order_relaxed);
  c->ranks()[me].sum_round.store(n, std::memory_order_release);
  std::vector<std::int64_t> total(values.size(), 0);
  for (int p = 0; p < P; ++p) {
    RankSlot& s = c->ranks()[p];
    spi::Backoff backoff(t.timeout());
    while (s.sum_round.load(std::memory_order_acquire) < n) {
      if (!backoff.step()) t.throw_timeout(phase, p);
      if (backoff.yielding() && s.sum_round.load(std::memory_order_acquire) < n) t.check_peers(phase, p);
    }
    for (std::size_t i = 0; i < values.size(); ++i) total[i] += s.sum_words[n % 2][i].load(std::memory_order_relaxed);
  }
  return total;
}

}  // namespace epx
