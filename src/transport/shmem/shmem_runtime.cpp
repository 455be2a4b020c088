// The shmem transport's runtime side (shmem_runtime.hpp, shmem_transport.hpp): the one
// OpenSHMEM runtime of the process and the blocks of its heap, the bootstrap over it, and
// connect(kShmem) (the node map, the agreed heap, the elastic words and their reserve).
#include "shmem/shmem_runtime.hpp"

#include <shmem.h>

#include <stdlib.h>  // on_exit
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "epx/error.hpp"
#include "epx/spi/resources.hpp"
#include "shmem/shmem_elastic.hpp"
#include "shmem/shmem_settings.hpp"
#include "shmem/shmem_transport.hpp"

namespace epx::detail {

// One OpenSHMEM runtime per process: started by the first shmem_bootstrap(), finalised when
// the last bootstrap / transport holding it is gone. After a failure (a wait that timed
// out) or a loss the collective calls of teardown (shmem_free, shmem_finalize) are skipped:
// they would wait for the peer that is gone (after a loss the survivors end the job
// themselves: shmem_elastic.cpp), and so is liboshmem's at a non-zero exit.
std::mutex& ShmemRuntime::mu() {
  static std::mutex m;
  return m;
}
std::weak_ptr<ShmemRuntime>& ShmemRuntime::current() {
  static std::weak_ptr<ShmemRuntime> c;
  return c;
}

namespace {

// liboshmem's exit handler (Open MPI 4.1) finalises the runtime whatever the exit status:
// a barrier over every PE, which never completes once a PE died or a link was cut. This one,
// registered after it and so run before it, ends a process that exits non-zero after a
// failure there: the launcher sees the status and ends the job. Where the launcher lets
// survivors live it ends the job only when told (a process that just vanishes leaves it
// waiting, even once every process is gone): shmem_global_exit, from another thread, with
// a bound. After the survivors agreed on a loss end_job, registered later still, runs first.
void skip_finalize_after_failure(int status, void*) {
  if (status == 0 || !ShmemRuntime::failed()) return;
  std::fflush(nullptr);
  if (launcher_keeps_survivors()) {
    std::thread([status] { shmem_global_exit(status); }).detach();
    const timespec pause{5, 0};
    nanosleep(&pause, nullptr);
  }
  _exit(status);
}

}  // namespace

std::shared_ptr<ShmemRuntime> ShmemRuntime::acquire(const ShmemOptions& options) {
  std::lock_guard<std::mutex> lock(mu());
  if (auto live = current().lock()) return live;
  if (started_)
    throw Error(ErrorCode::kUnsupported,
                "shmem bootstrap: the OpenSHMEM runtime of this process was already finalised (it cannot start twice)");
  // What epx needs from Open MPI, where the launcher has not set it (shmem_settings.hpp):
  // read by shmem_init_thread, so set before it.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const std::uint64_t memory = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : UINT64_MAX;
  ShmemSettings settings = decide_shmem_settings(options.heap_bytes, [](const char* n) { return std::getenv(n); }, memory);
  for (const auto& [name, value] : settings.set) setenv(name.c_str(), value.c_str(), 1);
  int provided = -1;
  if (shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided) != 0)
    throw Error(ErrorCode::kUnsupported, "shmem bootstrap: shmem_init_thread failed (was the process started by oshrun?)");
  started_ = true;
  on_exit(&skip_finalize_after_failure, nullptr);
  auto rt = std::shared_ptr<ShmemRuntime>(new ShmemRuntime(std::move(settings)));
  if (provided < SHMEM_THREAD_MULTIPLE) {
    shmem_finalize();
    throw Error(ErrorCode::kUnsupported, "shmem bootstrap: the OpenSHMEM runtime offers thread level " +
                                             std::to_string(provided) + ", epx's workers need SHMEM_THREAD_MULTIPLE");
  }
  current() = rt;
  return rt;
}

ShmemRuntimeInfo ShmemRuntime::info() {
  std::lock_guard<std::mutex> lock(mu());
  auto live = current().lock();
  if (!live) throw Error(ErrorCode::kUnsupported, "shmem_runtime_info: no OpenSHMEM runtime runs in this process (call shmem_bootstrap() first)");
  ShmemRuntimeInfo i;
  i.heap_bytes = live->settings_.heap_bytes;
  i.heap_from = live->settings_.heap_from;
  for (const auto& [name, value] : live->settings_.set) i.set_by_epx.push_back(name + "=" + value);
  return i;
}

ShmemRuntime::~ShmemRuntime() {
  if (!failed() && !lost()) shmem_finalize();
}

void ShmemRuntime::register_block(std::byte* base, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  blocks_[base] = Block{bytes, false};
}

void ShmemRuntime::unregister_block(std::byte* base) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  blocks_.erase(base);
}

void ShmemRuntime::orphan_block(std::byte* base) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  auto it = blocks_.find(base);
  if (it == blocks_.end()) return;
  it->second.orphan = true;
  // One piece with an orphaned neighbour that touches it (the pieces reuse_block split).
  if (auto next = std::next(it); next != blocks_.end() && next->second.orphan && it->first + it->second.bytes == next->first) {
    it->second.bytes += next->second.bytes;
    blocks_.erase(next);
  }
  if (it != blocks_.begin())
    if (auto prev = std::prev(it); prev->second.orphan && prev->first + prev->second.bytes == it->first) {
      prev->second.bytes += it->second.bytes;
      blocks_.erase(it);
    }
}

std::byte* ShmemRuntime::reuse_block(std::size_t bytes, std::size_t* got) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  auto best = blocks_.end();
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
    if (it->second.orphan && it->second.bytes >= bytes && (best == blocks_.end() || it->second.bytes < best->second.bytes))
      best = it;
  if (best == blocks_.end()) return nullptr;
  best->second.orphan = false;
  // A block much bigger than asked is split: the rest stays free for the next window.
  constexpr std::size_t kPiece = std::size_t{64} << 10;
  const std::size_t take = (bytes + 4095) / 4096 * 4096;
  if (best->second.bytes >= take + kPiece) {
    blocks_[best->first + take] = Block{best->second.bytes - take, true};
    best->second.bytes = take;
  }
  *got = best->second.bytes;
  return best->first;
}

std::string ShmemRuntime::orphans() const {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  std::string s;
  int n = 0;
  for (const auto& [base, b] : blocks_)
    if (b.orphan) s += (n++ ? ", " : "") + format_bytes(b.bytes);
  return n == 0 ? std::string("none") : std::to_string(n) + ": " + s;
}

std::shared_ptr<ShmemControl> ShmemRuntime::control() const {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  return control_;
}

void ShmemRuntime::set_control(std::shared_ptr<ShmemControl> c) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  control_ = std::move(c);
}

void ShmemRuntime::set_pes(std::vector<int> node_of_pe, std::vector<bool> mapped_pe) {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  node_of_pe_ = std::move(node_of_pe);
  mapped_pe_ = std::move(mapped_pe);
}

int ShmemRuntime::node_of_pe(int pe) const {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  return node_of_pe_.at(static_cast<std::size_t>(pe));
}

bool ShmemRuntime::mapped_pe(int pe) const {
  std::lock_guard<std::mutex> lock(blocks_mu_);
  return mapped_pe_.at(static_cast<std::size_t>(pe));
}

namespace {

class ShmemBootstrap final : public Bootstrap {
 public:
  explicit ShmemBootstrap(std::shared_ptr<ShmemRuntime> rt)
      : rt_(std::move(rt)), rank_(shmem_my_pe()), size_(shmem_n_pes()) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const char* name() const noexcept override { return "shmem"; }
  void barrier() override {
    refuse_after_loss("barrier");
    shmem_barrier_all();
  }

  // Each rank puts its blob into every PE's symmetric buffer; barrier_all completes the puts.
  void allgather(const void* in, void* out, std::size_t bytes) override {
    refuse_after_loss("allgather");
    if (bytes == 0) return shmem_barrier_all();
    const std::size_t slot = (bytes + 7) / 8 * 8;
    auto* buf = static_cast<std::byte*>(shmem_malloc(slot * static_cast<std::size_t>(size_)));  // collective
    if (buf == nullptr)
      throw Error(ErrorCode::kCapacityExceeded, "rank " + std::to_string(rank_) + ": shmem bootstrap: shmem_malloc(" +
                                                    std::to_string(slot * static_cast<std::size_t>(size_)) +
                                                    " bytes) for an all-gather failed (symmetric heap full?)");
    for (int p = 0; p < size_; ++p) shmem_putmem(buf + slot * static_cast<std::size_t>(rank_), in, bytes, p);
    shmem_barrier_all();
    for (int p = 0; p < size_; ++p)
      std::memcpy(static_cast<std::byte*>(out) + bytes * static_cast<std::size_t>(p), buf + slot * static_cast<std::size_t>(p), bytes);
    shmem_free(buf);  // collective (a barrier): nobody still reads or writes buf
  }

 private:
  // Both are calls over every PE, which cannot complete once a PE died.
  void refuse_after_loss(const char* call) const {
    if (ShmemRuntime::lost())
      throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": shmem bootstrap: " + call +
                                               " runs over every PE of the job, and PEs were lost (a group was rebuilt "
                                               "without them): use the rebuilt group",
                  rank_);
  }
  std::shared_ptr<ShmemRuntime> rt_;
  int rank_;
  int size_;
};

// EPX_SHMEM_ELASTIC_RESERVE=SIZE (the heap's syntax: 512M, 2G): a block of the heap kept
// free from the start for the windows of groups rebuilt after a loss, which can take no new
// block (shmem_malloc would wait for the dead PEs) and otherwise only reuse the old group's.
// Its pages cost memory only once such a window touches them. The same on every PE (checked).
void reserve_for_rebuilds(Bootstrap& bootstrap, ShmemRuntime& rt, std::size_t heap) {
  const char* text = std::getenv("EPX_SHMEM_ELASTIC_RESERVE");
  const int me = shmem_my_pe(), n = shmem_n_pes();
  std::uint64_t want = 0;
  if (text != nullptr && *text != '\0') {
    want = parse_heap_size(text);
    if (want == 0) want = UINT64_MAX;  // not a size: every PE learns it below
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(n));
  bootstrap.allgather(&want, all.data(), sizeof want);
  const std::string who = "rank " + std::to_string(me) + ": shmem: EPX_SHMEM_ELASTIC_RESERVE";
  for (int p = 0; p < n; ++p) {
    if (all[static_cast<std::size_t>(p)] == UINT64_MAX)
      throw Error(ErrorCode::kInvalidArgument, who + " of rank " + std::to_string(p) +
                                                   " is not a size (a number, optionally followed by K, M, G or T)", p);
    if (all[static_cast<std::size_t>(p)] != want)
      throw Error(ErrorCode::kInvalidArgument, who + " differs between the ranks (" + std::to_string(want) + " bytes here, " +
                                                   std::to_string(all[static_cast<std::size_t>(p)]) + " on rank " +
                                                   std::to_string(p) + "): give every rank the same (oshrun -x)", p);
  }
  if (want == 0) return;
  constexpr std::size_t kSlack = std::size_t{8} << 20;
  if (heap != 0 && rt.heap_in_use().load() + want + kSlack > heap)
    throw Error(ErrorCode::kCapacityExceeded, who + "=" + text + " does not fit in the symmetric heap of " + format_bytes(heap) +
                                                  " per PE (" + rt.heap_from() + ")", me);
  auto* block = static_cast<std::byte*>(shmem_malloc(want));  // collective; untouched
  if (block == nullptr)
    throw Error(ErrorCode::kCapacityExceeded, who + ": shmem_malloc(" + format_bytes(want) + ") failed (" + rt.heap_from() + ")", me);
  rt.register_block(block, want);
  rt.orphan_block(block);  // free, for reuse_block only (which runs only after a loss)
  rt.heap_in_use() += want;  // the heap left for the windows before a loss
}

}  // namespace

std::unique_ptr<Transport> connect_shmem(Bootstrap& bootstrap, const ConnectOptions& options) {
  auto rt = ShmemRuntime::acquire();
  const int me = shmem_my_pe(), n = shmem_n_pes();
  if (bootstrap.rank() != me || bootstrap.size() != n)
    throw Error(ErrorCode::kInvalidArgument, "connect(shmem): the '" + std::string(bootstrap.name()) + "' bootstrap has rank " +
                                                 std::to_string(bootstrap.rank()) + " of " + std::to_string(bootstrap.size()) +
                                                 ", the OpenSHMEM runtime PE " + std::to_string(me) + " of " +
                                                 std::to_string(n) + " (use epx::shmem_bootstrap())");
  if (ShmemRuntime::lost())
    throw Error(ErrorCode::kUnsupported, "connect(shmem): PEs of this job were lost (a group was rebuilt without them), and a "
                                         "connect runs over every PE: use the rebuilt group");
  const NodeMap nodes = discover_nodes(bootstrap);
  const int spares = job_spares(bootstrap, n);
  // The heap every PE can count on: the smallest (nodes with less memory get a smaller
  // default); 0 if any PE does not know its own.
  std::uint64_t mine = rt->heap_bytes();
  std::vector<std::uint64_t> heaps(static_cast<std::size_t>(n));
  bootstrap.allgather(&mine, heaps.data(), sizeof mine);
  const std::uint64_t agreed = *std::min_element(heaps.begin(), heaps.end());
  // The elastic words, once per process, while every PE lives (shmem_malloc is collective:
  // every PE's first connect makes them), and the reserve for groups rebuilt after a loss.
  if (!rt->control()) {
    rt->set_control(std::make_shared<ShmemControl>(me, n));
    reserve_for_rebuilds(bootstrap, *rt, static_cast<std::size_t>(agreed));
  }
  auto all = std::make_unique<ShmemTransport>(std::move(rt), nodes, options.timeout, static_cast<std::size_t>(agreed));
  if (spares == 0) return all;
  return ShmemTransport::split_spares(std::move(all), spares);
}

}  // namespace epx::detail

namespace epx {

bool shmem_available() noexcept { return true; }

std::unique_ptr<Bootstrap> shmem_bootstrap(const ShmemOptions& options) {
  return std::make_unique<detail::ShmemBootstrap>(detail::ShmemRuntime::acquire(options));
}

ShmemRuntimeInfo shmem_runtime_info() { return detail::ShmemRuntime::info(); }

}  // namespace epx
