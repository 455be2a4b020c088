#include "ucx/ucx_transport.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"
#include "epx/spi/copy.hpp"
#include "epx/spi/resources.hpp"
#include "process_identity.hpp"
#include "ucx/ucx_group.hpp"

namespace epx::detail {

using namespace ucx;

UcxTransport::UcxTransport(std::shared_ptr<UcxGroup> group) : group_(std::move(group)) {}

UcxTransport::~UcxTransport() {
  release();
  for (ucp_mem_h m : retired_) group_->keep_mapped(m);
}

int UcxTransport::rank() const noexcept { return group_->rank(); }
int UcxTransport::num_ranks() const noexcept { return group_->size(); }
const TransportCaps& UcxTransport::caps() const noexcept { return group_->caps(); }
std::chrono::milliseconds UcxTransport::timeout() const noexcept { return group_->timeout(); }
void UcxTransport::enter_phase(const char* phase) noexcept { group_->note(phase); }

std::unique_ptr<Transport> UcxTransport::open_endpoint() { return std::make_unique<UcxTransport>(group_); }

// A peer on another machine may still put into this block after this rank released it: a
// failed peer, or a slower one still sending the last signals of a call this rank already
// finished (UCX writes whatever arrives while the worker progresses, unchecked, so an
// unmapped block would take them as a segfault or as writes into whatever is mapped there
// next). With such peers the block stays mapped: until every rank has joined this
// endpoint's next allocation (each released its own rkeys after completing its puts), else
// until the group's end, after its goodbye.
void UcxTransport::release() noexcept {
  if (memh_ == nullptr) return;
  try {
    if (!group_->broken()) group_->flush(nullptr, true);  // nothing of this block is still read by a get or a put in flight
  } catch (const Error&) {
  }
  for (ucp_rkey_h& k : rkeys_)
    if (k != nullptr) ucp_rkey_destroy(k), k = nullptr;
  rkeys_.clear();
  mapped_.clear();
  if (group_->broken()) {
    group_->keep_mapped(memh_);
  } else if (group_->has_remote_peers()) {
    try {
      retired_.push_back(memh_);
    } catch (...) {
      group_->keep_mapped(memh_);
    }
  } else {
    ucp_mem_unmap(group_->context(), memh_);
  }
  memh_ = nullptr;
  base_ = nullptr;
  block_bytes_ = window_bytes_ = num_signals_ = 0;
}

void UcxTransport::allocate(std::size_t window_bytes, std::size_t num_signals) {
  release();
  if (window_bytes == 0 && num_signals == 0) return;
  make_block(window_bytes, num_signals);
}

// UCX allocates the block (UCP_MEM_MAP_ALLOCATE): shared memory that its same-machine
// transports map. Returns what this rank publishes: "+" address, packed rkey; or "!" why it
// has none, so that a rank that cannot allocate fails every rank alike instead of leaving
// them waiting.
std::string UcxTransport::map_block(std::size_t bytes) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t s = ucp_mem_map(group_->context(), &mp, &memh_);
  if (s != UCS_OK) {
    memh_ = nullptr;
    return "!ucp_mem_map of " + format_bytes(bytes) + ": " + status_text(s);
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  ucp_mem_query(memh_, &attr);
  base_ = static_cast<std::byte*>(attr.address);
  std::memset(base_, 0, bytes);  // zeroed and pre-faulted before any peer learns the rkey
  void* packed = nullptr;
  std::size_t packed_size = 0;
  s = ucp_rkey_pack(group_->context(), memh_, &packed, &packed_size);
  if (s != UCS_OK) return "!ucp_rkey_pack: " + status_text(s);
  const auto addr = reinterpret_cast<std::uint64_t>(base_);
  std::string mine = "+";
  mine.append(reinterpret_cast<const char*>(&addr), sizeof addr);
  mine.append(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  return mine;
}

// Two all-gathers: the blocks, then whether every rank holds every peer's rkey. The second
// keeps a rank from going on (and perhaps dying) while a peer still attaches to its block:
// UCX 1.13 crashes in ucp_ep_rkey_unpack's error path when the segment is gone.
void UcxTransport::make_block(std::size_t window_bytes, std::size_t num_signals) {
  const int P = num_ranks(), me = rank();
  signal_offset_ = round_page(window_bytes);
  block_bytes_ = signal_offset_ + (num_signals + static_cast<std::size_t>(P)) * sizeof(std::uint64_t);
  const std::vector<std::string> all = group_->exchange(map_block(block_bytes_));
  for (ucp_mem_h m : retired_) ucp_mem_unmap(group_->context(), m);  // every rank is past its release now
  retired_.clear();
  std::string why;  // "C..." (no block) or "P..." (no rkey) when this rank cannot go on
  for (int p = 0; p < P && why.empty(); ++p) {
    const std::string& blob = all[static_cast<std::size_t>(p)];
    if (blob.size() < 1 + sizeof(std::uint64_t) || blob[0] != '+')
      why = "Crank " + std::to_string(p) + " cannot register its window: " + (blob.empty() ? "(nothing sent)" : blob.substr(1));
  }
  if (why.empty()) why = unpack_rkeys(all);
  const std::vector<std::string> verdicts = group_->exchange(why.empty() ? "+" : "!" + why);
  for (int p = 0; p < P; ++p) {
    const std::string& v = verdicts[static_cast<std::size_t>(p)];
    if (v == "+") continue;
    release();
    const bool capacity = v.size() > 1 && v[1] == 'C';
    throw Error(capacity ? ErrorCode::kCapacityExceeded : ErrorCode::kPeerFailed,
                "rank " + std::to_string(me) + ": ucx: allocate failed on rank " + std::to_string(p) + ": " + (v.size() > 2 ? v.substr(2) : v),
                capacity ? p : -1);
  }
  window_bytes_ = window_bytes;
  num_signals_ = num_signals;
  barrier_epoch_ = 0;
}

// Every peer's block address and rkey; "" or "P" + why not.
std::string UcxTransport::unpack_rkeys(const std::vector<std::string>& all) {
  const int P = num_ranks(), me = rank();
  rkeys_.assign(static_cast<std::size_t>(P), nullptr);
  remote_base_.assign(static_cast<std::size_t>(P), 0);
  mapped_.assign(static_cast<std::size_t>(P), nullptr);
  mapped_[static_cast<std::size_t>(me)] = base_;
  for (int p = 0; p < P; ++p) {
    const std::string& blob = all[static_cast<std::size_t>(p)];
    std::memcpy(&remote_base_[static_cast<std::size_t>(p)], blob.data() + 1, sizeof(std::uint64_t));
    if (p == me) continue;
    const ucs_status_t s = ucp_ep_rkey_unpack(group_->ep(p), blob.data() + 1 + sizeof(std::uint64_t), &rkeys_[static_cast<std::size_t>(p)]);
    if (s != UCS_OK) {
      rkeys_[static_cast<std::size_t>(p)] = nullptr;
      return "Pcannot unpack the rkey of " + group_->describe(p) + ": " + status_text(s);
    }
    // A same-machine peer's block mapped here (UCX's sysv/posix memory): puts become copies
    // and signals release stores, without UCX's per-call cost. Measured, 4 ranks, dispatch +
    // combine of 64 tokens x 2048, median of 6 runs on a loaded 2-core box: 1.20 ms mapped,
    // 1.86 ms through UCX's sysv/posix, 1.44 ms on shm.
    void* at = nullptr;
    if (group_->map_peers() && group_->same_node(p) &&
        ucp_rkey_ptr(rkeys_[static_cast<std::size_t>(p)], remote_base_[static_cast<std::size_t>(p)], &at) == UCS_OK)
      mapped_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(at);
  }
  return "";
}

void UcxTransport::check_range(const char* what, int peer, std::size_t offset, std::size_t bytes) const {
  if (base_ != nullptr && peer >= 0 && peer < num_ranks() && offset <= block_bytes_ && bytes <= block_bytes_ - offset) return;
  throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank()) + ": ucx: " + what + " of " + std::to_string(bytes) +
                                               " bytes at offset " + std::to_string(offset) + " to rank " + std::to_string(peer) +
                                               " is outside the block of " + std::to_string(block_bytes_) + " bytes");
}

void UcxTransport::put(int peer, std::size_t offset, const void* src, std::size_t bytes, int) {
  if (bytes == 0) return;
  check_range("put", peer, offset, bytes);
  const auto p = static_cast<std::size_t>(peer);
  if (std::byte* dst = mapped_[p]) {
    bulk_copy(dst + offset, src, bytes);
    // Over TCP the other machines' puts into this rank (and this rank's own in flight) move
    // only while it progresses: now and then during a stretch of copies too.
    thread_local std::size_t copied = 0;
    if (group_->has_remote_peers() && (copied += bytes) >= kProgressEveryBytes) copied = 0, group_->progress();
    return;
  }
  if (group_->closed(peer)) return;  // it said goodbye: it reads nothing more
  if (group_->uses_link(peer)) return group_->link_send(peer, remote_base_[p] + offset, src, bytes, 0, "a put to");
  ucp_request_param_t prm{};
  group_->settle(ucp_put_nbx(group_->ep(peer), src, bytes, remote_base_[p] + offset, rkeys_[p], &prm), peer, "a put to");
}

void UcxTransport::get(int peer, std::size_t offset, void* dst, std::size_t bytes, int) {
  if (bytes == 0) return;
  check_range("get", peer, offset, bytes);
  const auto p = static_cast<std::size_t>(peer);
  if (const std::byte* src = mapped_[p]) return static_cast<void>(std::memcpy(dst, src + offset, bytes));
  group_->note_get(peer);
  ucp_request_param_t prm{};
  group_->settle(ucp_get_nbx(group_->ep(peer), dst, bytes, remote_base_[p] + offset, rkeys_[p], &prm), peer, "a get from", true);
}

void UcxTransport::ordered_set(int peer, std::size_t offset, std::uint64_t value) {
  check_range("signal", peer, offset, sizeof value);
  if (std::byte* dst = mapped_[static_cast<std::size_t>(peer)]) {
    // Earlier puts to a mapped peer were copies (bulk_copy ends with a store fence).
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(dst + offset)).store(value, std::memory_order_release);
    return;
  }
  if (group_->closed(peer)) return;     // it said goodbye: it reads nothing more
  if (group_->uses_link(peer))  // after every earlier message on the link: its order is the stream's
    return group_->link_send(peer, remote_base_[static_cast<std::size_t>(peer)] + offset, nullptr, 0, value, "a signal to");
  group_->fence(peer);  // earlier puts to `peer` complete before what follows
  // The value must outlive the put, which may wait for room in UCX's send queue: a heap word
  // that the completion callback frees (or this call, if it completed at once).
  auto* word = new std::uint64_t(value);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<std::uint64_t*>(user_data);
    ucp_request_free(request);
  };
  prm.user_data = word;
  const auto p = static_cast<std::size_t>(peer);
  ucs_status_ptr_t r = ucp_put_nbx(group_->ep(peer), word, sizeof *word, remote_base_[p] + offset, rkeys_[p], &prm);
  if (UCS_PTR_IS_PTR(r)) return;  // the callback frees the word and the request
  delete word;
  group_->settle(r, peer, "a signal to");
}

void UcxTransport::signal(int peer, std::size_t slot, std::uint64_t value, int) {
  ordered_set(peer, signal_offset_ + slot * sizeof(std::uint64_t), value);
}

void UcxTransport::put_flagged(int peer, std::size_t offset, const void* src, std::size_t bytes, std::uint64_t flag, int queue) {
  put(peer, offset, src, bytes, queue);
  ordered_set(peer, offset + bytes, flag);
}

std::uint64_t* UcxTransport::signal_word(std::size_t slot) const noexcept {
  return reinterpret_cast<std::uint64_t*>(base_ + signal_offset_) + slot;
}

std::uint64_t UcxTransport::read_signal(std::size_t slot) noexcept {
  group_->progress();
  return std::atomic_ref<std::uint64_t>(*signal_word(slot)).load(std::memory_order_acquire);
}

void UcxTransport::wait_word(std::uint64_t* word, std::uint64_t at_least, const WaitPoint& where) {
  group_->note(where.phase);
  std::atomic_ref<std::uint64_t> w(*word);
  if (w.load(std::memory_order_acquire) >= at_least) return;
  spi::Backoff backoff(group_->timeout(), kNetworkSpins);
  const bool sleeps = group_->sleeps_for(where.peer);
  const auto ready = [&] { return w.load(std::memory_order_acquire) >= at_least; };
  for (;;) {
    group_->progress();  // over TCP a peer's put lands only while this rank progresses
    if (ready()) break;
    group_->check_waiting(where, backoff.yielding(), word, at_least);
    if (sleeps && backoff.yielding()) {
      // A peer on another machine: asleep on the worker's event fd instead of yielding (its
      // bytes wake this thread as soon as they reach the socket).
      group_->sleep_unless(ready);
      if (backoff.expired()) group_->fail_timeout(where);
    } else if (!backoff.step()) {
      group_->fail_timeout(where);
    }
  }
  // The acquire load that saw the value orders the puts before it (no fence: the sanitizer
  // build refuses std::atomic_thread_fence).
}

void UcxTransport::wait_signal(std::size_t slot, std::uint64_t at_least, const WaitPoint& where) {
  wait_word(signal_word(slot), at_least, where);
}

void UcxTransport::wait_flag(std::size_t offset, std::uint64_t at_least, const WaitPoint& where) {
  wait_word(reinterpret_cast<std::uint64_t*>(base_ + offset), at_least, where);
}

void UcxTransport::quiet(int) { group_->flush(nullptr); }

void UcxTransport::quiet_timed(int, std::uint64_t* lap_ns) { group_->flush(lap_ns); }

void UcxTransport::barrier(const char* phase) {
  // A transport whose buffers each opened an endpoint has no block of its own until its first
  // barrier: then one with the barrier's slots only (collective, as the barrier is).
  if (base_ == nullptr) make_block(0, 0);
  ++barrier_epoch_;
  const int P = num_ranks(), me = rank();
  for (int p = 0; p < P; ++p) signal(p, num_signals_ + static_cast<std::size_t>(me), barrier_epoch_, 0);
  for (int p = 0; p < P; ++p) wait_signal(num_signals_ + static_cast<std::size_t>(p), barrier_epoch_, WaitPoint{phase, p});
}

std::unique_ptr<Transport> connect_ucx(Bootstrap& bootstrap, const ConnectOptions& options) {
  return std::make_unique<UcxTransport>(std::make_shared<UcxGroup>(bootstrap, options));
}

}  // namespace epx::detail

namespace epx {
bool ucx_available() noexcept { return true; }
}  // namespace epx
