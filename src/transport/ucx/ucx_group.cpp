// The ucx transport's group (ucx_group.hpp): context, worker, endpoints, flushes with a deadline,
// the peers' liveness and the bootstrap exchanges. The links are in ucx_links.cpp.
#include "ucx/ucx_group.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"
#include "epx/spi/copy.hpp"
#include "epx/spi/resources.hpp"

namespace epx::detail {

using namespace ucx;

namespace ucx {
// This process's established TCP connections and what their kernel queues hold
// (/proc/net/tcp), for a timeout's message: bytes still queued say the network or the
// peer's kernel holds them; empty queues, that UCX on one side or the other never sent them
// (or their acknowledgements). "" when there is nothing to tell.
std::string tcp_queues() {
  std::set<unsigned long> mine;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) mine.insert(std::strtoul(target.c_str() + 8, nullptr, 10));
  }
  const auto addr = [](const std::string& hex) {  // "0100C90A:AF4A": 10.201.0.1:44874
    if (hex.size() != 13) return hex;
    const unsigned long ip = std::strtoul(hex.substr(0, 8).c_str(), nullptr, 16);
    return std::to_string(ip & 0xff) + "." + std::to_string((ip >> 8) & 0xff) + "." + std::to_string((ip >> 16) & 0xff) +
           "." + std::to_string(ip >> 24) + ":" + std::to_string(std::strtoul(hex.substr(9).c_str(), nullptr, 16));
  };
  std::ifstream f("/proc/net/tcp");
  std::string line, out;
  std::getline(f, line);  // the header
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, st, queues, timer, retransmits, uid, timeout;
    unsigned long inode = 0;
    if (!(in >> sl >> local >> remote >> st >> queues >> timer >> retransmits >> uid >> timeout >> inode)) continue;
    if (!mine.count(inode) || st != "01" || queues.size() != 17) continue;  // 01: established
    out += (out.empty() ? "" : "; ") + addr(local) + "->" + addr(remote) + " send-q " +
           std::to_string(std::strtoul(queues.substr(0, 8).c_str(), nullptr, 16)) + " recv-q " +
           std::to_string(std::strtoul(queues.substr(9).c_str(), nullptr, 16)) + " retransmits " +
           std::to_string(std::strtoul(retransmits.c_str(), nullptr, 16));
  }
  return out.empty() ? "" : " [this rank's TCP connections: " + out + "]";
}

// Never destroyed: exit() still reads it.
LiveGroups& live_groups() {
  static auto* groups = new LiveGroups;
  return *groups;
}
}  // namespace ucx

UcxGroup::UcxGroup(Bootstrap& boot, const ConnectOptions& options)
    : boot_(boot), rank_(boot.rank()), size_(boot.size()), timeout_(options.timeout), hook_(options.wait_hook) {
  const auto P = static_cast<std::size_t>(size_);
  node_of_rank_ = discover_nodes(boot).node_of_rank;
  for (int p = 0; p < size_; ++p) remote_peers_ = remote_peers_ || !same_node(p);
  const char* map = std::getenv("EPX_UCX_MAP_PEERS");
  map_peers_ = map == nullptr || std::string(map) != "0";
  hosts_ = allgather_strings(boot, hostname());
  const ProcessIdentity mine = ProcessIdentity::self();
  lives_.resize(P);
  suspect_since_.reset(new std::atomic<std::int64_t>[P]);
  for (std::size_t p = 0; p < P; ++p) suspect_since_[p] = 0;
  boot.allgather(&mine, lives_.data(), sizeof mine);
  peer_state_.reset(new PeerState[P]);
  failed_.reset(new std::atomic<int>[P]);
  touched_.reset(new std::atomic<bool>[P]);
  gets_.reset(new std::atomic<bool>[P]);
  for (std::size_t p = 0; p < P; ++p)
    peer_state_[p] = {this, static_cast<int>(p)}, failed_[p] = 0, touched_[p] = false, gets_[p] = false;
  caps_.name = "ucx";
  caps_.ordered_signal_per_queue = true;  // ucp_worker_fence before the signal's put
  caps_.max_queues = 64;                  // queues are labels here: a flush completes all of them
  caps_.flagged_puts = true;              // bytes, fence, the flag's put
  caps_.one_sided_get = true;             // ucp_get_nbx, completed by the flush
  try {
    connect_endpoints(start_worker());
    map_goodbye_block();  // also on one machine: the left words
    if (remote_peers_) connect_links();
  } catch (...) {
    close_links();
    close_endpoints();
    for (ucp_rkey_h k : goodbye_rkeys_)
      if (k != nullptr) ucp_rkey_destroy(k);
    if (goodbye_memh_ != nullptr) ucp_mem_unmap(context_, goodbye_memh_);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
    throw;
  }
  if (!remote_peers_) return;
  start_progress();
  owner_ = ::getpid();
  std::lock_guard<std::mutex> lock(live_groups().mu);
  live_groups().groups.push_back(this);
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(&UcxGroup::goodbye_at_exit); });
}

// A process that exits with a group alive (its owner never destroyed it: a Python program
// that ends without destroy_process_group) says the group's goodbye from exit(): its peers'
// last puts to it then end as complete instead of failing on the connections the exit
// closes. The progress thread stops first (UCX's own teardown follows the handlers).
void UcxGroup::goodbye_at_exit() noexcept {
  std::lock_guard<std::mutex> lock(live_groups().mu);
  for (UcxGroup* g : live_groups().groups) {
    if (g->owner_ != ::getpid()) continue;  // inherited by fork: the parent's group
    g->stop_progress();
    g->say_goodbye();
  }
}

void UcxGroup::start_progress() {
  // Asleep on the worker's event fd between rounds (not counted among the sleepers that
  // progress() wakes: it is woken by what arrives, and its own progress wakes them).
  progress_thread_ = std::thread([this] {
    while (!progress_stop_.load(std::memory_order_relaxed)) {
      progress();
      if (!wakeup_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(kSleepMs));
        continue;
      }
      // Armed (nothing left to progress), the fd wakes this thread when a socket has bytes or
      // room for queued sends, the keepalive is due, or stop_progress() signals.
      const ucs_status_t s = ucp_worker_arm(worker_);
      if (s == UCS_OK && !progress_stop_.load(std::memory_order_relaxed)) {
        pollfd p{efd_, POLLIN, 0};
        ::poll(&p, 1, links_on_ ? kIdleLinksMs : kSleepMs);
      } else if (s != UCS_OK && s != UCS_ERR_BUSY) {
        std::this_thread::sleep_for(std::chrono::milliseconds(kSleepMs));
      }
    }
  });
}

void UcxGroup::sleep_while(std::uint32_t seen) noexcept {
  const timespec limit{kSleepMs / 1000, (kSleepMs % 1000) * 1000000L};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&progressed_), FUTEX_WAIT_PRIVATE, seen, &limit, nullptr, 0);
}

void UcxGroup::wake_sleepers() noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&progressed_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

void UcxGroup::stop_progress() noexcept {
  if (!progress_thread_.joinable()) return;
  progress_stop_.store(true, std::memory_order_relaxed);
  if (wakeup_) ucp_worker_signal(worker_);
  progress_thread_.join();
}

UcxGroup::~UcxGroup() {
  if (remote_peers_) {
    std::lock_guard<std::mutex> lock(live_groups().mu);
    auto& v = live_groups().groups;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  stop_progress();  // the teardown's flushes progress the worker themselves
  say_goodbye();
  close_links();
  close_endpoints();
  for (ucp_rkey_h k : goodbye_rkeys_)
    if (k != nullptr) ucp_rkey_destroy(k);
  for (ucp_mem_h m : kept_) ucp_mem_unmap(context_, m);
  if (goodbye_memh_ != nullptr) ucp_mem_unmap(context_, goodbye_memh_);
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

// How a rank closes (once: the group's end, or exit() with the group alive). First this
// rank's own puts and signals complete at their targets (a peer may still wait for them);
// then it sets its word in every other machine's ranks' goodbye blocks and completes those
// puts too, while its blocks are all still mapped (a peer's late put lands harmlessly).
// Only then do the connections close, so a peer that sees its operation to this rank fail
// finds the word already set (it was written before the acknowledgement this rank waited
// for) and takes the operation as complete. A peer that vanished without this (killed, its
// link cut) leaves the word unset: its peers' calls fail naming it. Errors end nothing here:
// a peer that is gone cannot receive anything anyway.
void UcxGroup::say_goodbye() noexcept {
  if (said_goodbye_.exchange(true)) return;
  try {
    flush(nullptr, true);
  } catch (const Error&) {
  }
  if (goodbye_memh_ == nullptr) return;
  static const std::uint64_t kSaid = 1;
  for (int p = 0; p < size_; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (p == rank_ || same_node(p) || failed_[up].load(std::memory_order_relaxed) != 0 || closed(p)) continue;
    ucp_request_param_t prm{};
    ucs_status_ptr_t r = ucp_put_nbx(ep(p), &kSaid, sizeof kSaid, goodbye_remote_[up] + static_cast<std::uint64_t>(rank_) * sizeof kSaid,
                                     goodbye_rkeys_[up], &prm);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // the flush below waits for it
  }
  try {
    flush(nullptr, true);
  } catch (const Error&) {
  }
}

// Every rank's goodbye block (2P words, allocated and registered by UCX as the windows are):
// its address and rkey go to every rank, which unpacks every peer's; a same-machine peer's
// block is mapped here too (UCX's sysv/posix memory: ucp_rkey_ptr), where tell_left stores
// its left word directly (its endpoint, without peer error handling, is no path to a peer
// that may be dying).
void UcxGroup::map_goodbye_block() {
  const auto P = static_cast<std::size_t>(size_);
  goodbye_remote_.assign(P, 0);
  goodbye_rkeys_.assign(P, nullptr);
  std::string mine;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = round_page(2 * P * sizeof(std::uint64_t));  // the goodbye words, then the left words
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t s = ucp_mem_map(context_, &mp, &goodbye_memh_);
  if (s != UCS_OK) {
    goodbye_memh_ = nullptr;
    mine = "!ucp_mem_map: " + status_text(s);
  } else {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    ucp_mem_query(goodbye_memh_, &attr);
    goodbye_ = static_cast<std::uint64_t*>(attr.address);
    std::memset(goodbye_, 0, 2 * P * sizeof(std::uint64_t));
    left_ = goodbye_ + P;
    void* packed = nullptr;
    std::size_t packed_size = 0;
    s = ucp_rkey_pack(context_, goodbye_memh_, &packed, &packed_size);
    if (s != UCS_OK) {
      mine = "!ucp_rkey_pack: " + status_text(s);
    } else {
      const auto addr = reinterpret_cast<std::uint64_t>(goodbye_);
      mine = "+";
      mine.append(reinterpret_cast<const char*>(&addr), sizeof addr);
      mine.append(static_cast<const char*>(packed), packed_size);
      ucp_rkey_buffer_release(packed);
    }
  }
  const std::vector<std::string> all = allgather_strings(boot_, mine);
  for (int p = 0; p < size_; ++p) {
    const std::string& blob = all[static_cast<std::size_t>(p)];
    if (blob.size() < 1 + sizeof(std::uint64_t) || blob[0] != '+')
      throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank_) + ": ucx: rank " + std::to_string(p) +
                                            " cannot register its goodbye block: " + (blob.empty() ? "(nothing sent)" : blob.substr(1)), p);
  }
  peer_blocks_.assign(P, nullptr);
  for (int p = 0; p < size_; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (p == rank_) continue;
    const std::string& blob = all[up];
    std::memcpy(&goodbye_remote_[up], blob.data() + 1, sizeof(std::uint64_t));
    s = ucp_ep_rkey_unpack(eps_[up], blob.data() + 1 + sizeof(std::uint64_t), &goodbye_rkeys_[up]);
    if (s != UCS_OK) {
      goodbye_rkeys_[up] = nullptr;
      if (same_node(p)) continue;  // no notice to this peer: its waits for this rank time out
      throw Error(ErrorCode::kPeerFailed, "rank " + std::to_string(rank_) + ": ucx: cannot unpack the goodbye block's rkey of " + describe(p) +
                                              ": " + status_text(s), p);
    }
    void* at = nullptr;
    if (same_node(p) && ucp_rkey_ptr(goodbye_rkeys_[up], goodbye_remote_[up], &at) == UCS_OK)
      peer_blocks_[up] = static_cast<std::uint64_t*>(at);
  }
}

bool UcxGroup::closed(int peer) const noexcept {
  return goodbye_ != nullptr && std::atomic_ref<std::uint64_t>(goodbye_[static_cast<std::size_t>(peer)]).load(std::memory_order_acquire) != 0;
}

void UcxGroup::make_context() {
  // UCX's TCP transport with bigger segments than its defaults (8K to send, 64K to receive),
  // where the user set none: epx's puts across machines are runs of whole rows. Measured
  // between two namespaces (veth), 4 MiB in 1 MiB puts + quiet: 0.7-0.76 GB/s instead of
  // 0.21-0.26, an 8-byte put + signal one way (ping-pong / 2) 68-75 us instead of 90-115 (the
  // shmem transport sets the same). Through the environment, not overwriting: UCX reads its
  // transports' settings there, and ucp_config_modify warns of them as unknown keys.
  setenv("UCX_TCP_TX_SEG_SIZE", "64K", 0);
  setenv("UCX_TCP_RX_SEG_SIZE", "512K", 0);
  // UCX 1.13's TCP transport can leave bytes unread in a socket's receive queue while its
  // worker progresses (seen under load across namespace machines: recv-q 217 for 60 s, then
  // a flush that never completes); a keepalive message every second brings new data, and so a
  // new read, to every connection (docs/transport.md, "The mid-run stall"). UCX's default is 20 s.
  setenv("UCX_KEEPALIVE_INTERVAL", "1s", 0);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": ucx: ucp_config_read failed: " + status_text(s));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  // WAKEUP with peers on other machines: the progress thread sleeps on the worker's event fd,
  // woken when bytes reach UCX's sockets, and wakes the threads waiting for them
  // (UcxGroup::sleep_unless).
  params.features = UCP_FEATURE_RMA | (remote_peers_ ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 0;
  params.estimated_num_eps = static_cast<std::size_t>(size_);
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    context_ = nullptr;
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": ucx: ucp_init failed: " + status_text(s) +
                                             " (UCX_TLS / UCX_NET_DEVICES name no usable transport?)");
  }
}

void UcxGroup::make_worker() {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;  // the engine's workers put and quiet from several threads
  ucs_status_t s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) {
    worker_ = nullptr;
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": ucx: ucp_worker_create failed: " + status_text(s));
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
  if (ucp_worker_query(worker_, &attr) != UCS_OK || attr.thread_mode != UCS_THREAD_MODE_MULTI)
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) +
                                             ": ucx: the worker is not thread-safe (UCS_THREAD_MODE_MULTI), which epx's "
                                             "workers need: this UCX was built without --enable-mt");
  const char* sleep = std::getenv("EPX_UCX_SLEEP");
  if (remote_peers_ && (sleep == nullptr || std::string(sleep) != "0")) {
    s = ucp_worker_get_efd(worker_, &efd_);
    if (s != UCS_OK)
      throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) + ": ucx: ucp_worker_get_efd failed: " + status_text(s));
    wakeup_ = true;
  }
}

// Every rank publishes its worker's address ("+" address), or "!" + why it has none: a rank
// whose UCX cannot start fails every rank with its message instead of leaving them waiting
// in the bootstrap. Returns every rank's address.
std::vector<std::string> UcxGroup::start_worker() {
  std::string mine;
  try {
    make_context();
    make_worker();
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    const ucs_status_t s = ucp_worker_get_address(worker_, &address, &length);
    if (s != UCS_OK) throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank_) + ": ucx: ucp_worker_get_address failed: " + status_text(s));
    mine = "+" + std::string(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
  } catch (const Error& e) {
    mine = "!" + std::to_string(static_cast<int>(e.code())) + " " + e.what();
  }
  std::vector<std::string> all = allgather_strings(boot_, mine);
  for (int p = 0; p < size_; ++p) {
    const std::string& a = all[static_cast<std::size_t>(p)];
    if (!a.empty() && a[0] == '+') continue;
    const auto space = a.find(' ');
    const int code = a.size() > 1 ? std::atoi(a.c_str() + 1) : static_cast<int>(ErrorCode::kInternal);
    throw Error(static_cast<ErrorCode>(code), space == std::string::npos ? a : a.substr(space + 1), p);
  }
  for (std::string& a : all) a.erase(0, 1);
  return all;
}

// Each rank makes an endpoint to every other. Error handling: PEER (a lost peer fails its
// endpoint instead of aborting the process) to other machines; NONE to this machine's ranks,
// because UCX 1.13 offers its shared-memory transports only without it: with PEER a
// same-machine put went over TCP loopback (measured, 2 ranks: 0.3 GB/s and 75 us per put +
// signal, against 6.4 GB/s and 18 us over sysv/posix). A same-machine peer that dies is seen
// through /proc instead (check_alive).
//
// The connections are wired up lazily, by the first operation (both sides progress then).
void UcxGroup::connect_endpoints(const std::vector<std::string>& all) {
  eps_.assign(static_cast<std::size_t>(size_), nullptr);
  std::vector<int> peers;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) peers.push_back(p);
  make_endpoints(all, peers);
}

void UcxGroup::make_endpoints(const std::vector<std::string>& all, const std::vector<int>& peers) {
  for (int p : peers) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(all[static_cast<std::size_t>(p)].data());
    ep.err_mode = same_node(p) ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxGroup::on_error;
    ep.err_handler.arg = &peer_state_[static_cast<std::size_t>(p)];
    const ucs_status_t s = ucp_ep_create(worker_, &ep, &eps_[static_cast<std::size_t>(p)]);
    if (s != UCS_OK) {
      eps_[static_cast<std::size_t>(p)] = nullptr;
      throw Error(ErrorCode::kPeerFailed, "rank " + std::to_string(rank_) + ": ucx: cannot make an endpoint to " + describe(p) +
                                              ": " + status_text(s) + " (no common transport: see UCX_TLS / UCX_NET_DEVICES)", p);
    }
  }
}

// Forced: the flush before it delivered what this rank sent; a peer still connected sees the
// connection close (its endpoint to this rank fails, which matters only if it waits for this
// rank again).
void UcxGroup::close_endpoints() noexcept {
  for (ucp_ep_h& ep : eps_) {
    if (ep == nullptr) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(r)) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_);
      ucp_request_free(r);
    }
    ep = nullptr;
  }
}

void UcxGroup::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* st = static_cast<PeerState*>(arg);
  int ok = 0;
  st->group->failed_[static_cast<std::size_t>(st->peer)].compare_exchange_strong(ok, static_cast<int>(status));
}

void UcxGroup::note(const char* phase) noexcept {
  if (phase == nullptr || phase_ptr_.exchange(phase, std::memory_order_relaxed) == phase) return;
  try {
    std::lock_guard<std::mutex> lock(phase_mu_);
    phase_ = *phase != '\0' ? phase : "(unnamed)";
  } catch (...) {
    // Out of memory for a phase name: the messages keep the previous one.
  }
}

std::string UcxGroup::phase() const {
  std::lock_guard<std::mutex> lock(phase_mu_);
  return phase_;
}

void UcxGroup::fence(int) {
  // Worker-wide (every thread's earlier operations, to every peer): a superset of what the
  // ordered signal needs, and UCX offers no cheaper per-endpoint fence.
  const ucs_status_t s = ucp_worker_fence(worker_);
  if (s != UCS_OK) throw Error(ErrorCode::kInternal, "rank " + std::to_string(rank_) + ": ucx: ucp_worker_fence failed: " + status_text(s));
}

void UcxGroup::settle(ucs_status_ptr_t r, int peer, const char* what, bool is_get) {
  if (r == nullptr) return;
  if (UCS_PTR_IS_ERR(r)) {
    if (!is_get && closed(peer)) return;  // it said goodbye: it reads nothing more
    fail_peer(peer, UCS_PTR_STATUS(r), what);
  }
  ucp_request_free(r);  // completes internally; the next flush waits for it
}

void UcxGroup::fail_peer(int peer, ucs_status_t status, const char* what) const {
  broken_.store(true, std::memory_order_relaxed);
  if (const int lost = left_because(peer); lost >= 0) {
    // The peer had left its call because `lost` failed (and ended since): the cause is named.
    tell_left(lost);
    throw Error(ErrorCode::kPeerFailed,
                "rank " + std::to_string(rank_) + ": ucx: " + describe(lost) + " failed: " + what + " " + describe(peer) +
                    " failed in phase '" + phase() + "' after it left the call on that failure: " + status_text(status),
                lost);
  }
  tell_left(peer);
  throw Error(ErrorCode::kPeerFailed,
              "rank " + std::to_string(rank_) + ": ucx: " + what + " " + describe(peer) + " failed in phase '" + phase() +
                  "': " + status_text(status) +
                  (closed(peer) ? " (the peer closed its group: its program ended or destroyed the group)"
                                : " (the peer ended or died without closing its group, or the link to its machine is down)"),
              peer);
}

std::string UcxGroup::describe(int peer) const {
  if (peer < 0 || peer >= size_) return "the other ranks";
  const auto p = static_cast<std::size_t>(peer);
  const bool same = same_node(peer);
  return "rank " + std::to_string(peer) + " (node " + std::to_string(node_of_rank_[p]) + " '" + hosts_[p] + "', " +
         (same ? "this machine)" : "another machine)");
}

// One flush request per peer this worker talked to; each completion is that peer's lap.
// `teardown`: peers whose endpoint failed are skipped and errors end nothing (a peer that
// ended first closed its connections; the others must still get this rank's last signals).
// After a failure too (the group's, with every block still mapped), for at most
// kBrokenTeardown: a put this rank leaves unacknowledged when it closes its connections ends
// its target inside UCX 1.13 (ucp_put_handler's "Fatal: unexpected error" when the
// acknowledgement cannot be sent), measured in the killed-rank test as a survivor's abort in
// 1 of ~15 runs without this flush.
void UcxGroup::flush(std::uint64_t* lap_ns, bool teardown) {
  if (links_on_) await_links(lap_ns, teardown);
  std::vector<Pending> pending;
  ucp_request_param_t prm{};
  for (int p = 0; p < size_; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (p == rank_ || !touched_[up].load(std::memory_order_relaxed)) continue;
    if (teardown && failed_[up].load(std::memory_order_relaxed) != 0) continue;
    // Cleared before the flush: a get issued meanwhile is checked by the next one.
    const bool gets = gets_[up].exchange(false, std::memory_order_relaxed);
    ucs_status_ptr_t r = ucp_ep_flush_nbx(eps_[up], &prm);
    if (UCS_PTR_IS_ERR(r) && !teardown && lost_to(p, gets)) {
      for (const Pending& q : pending) ucp_request_free(q.request);
      fail_peer(p, UCS_PTR_STATUS(r), "completing puts to");
    }
    if (UCS_PTR_IS_PTR(r)) pending.push_back({p, r, gets});
  }
  if (!pending.empty()) await_flushes(pending, lap_ns, teardown);
}

void UcxGroup::await_flushes(std::vector<Pending>& pending, std::uint64_t* lap_ns, bool teardown) {
  auto since = std::chrono::steady_clock::now();
  // The one wait policy (spi::Backoff): spin, then yield, until the deadline.
  spi::Backoff backoff(teardown && broken() ? std::min<std::chrono::milliseconds>(timeout_, kBrokenTeardown) : timeout_,
                       kNetworkSpins);
  while (!pending.empty()) {
    ucp_worker_progress(worker_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      const ucs_status_t s = ucp_request_check_status(it->request);
      if (s == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(it->request);
      const int peer = it->peer;
      const bool gets = it->gets;
      it = pending.erase(it);
      if (s != UCS_OK && !teardown && lost_to(peer, gets)) {
        for (const Pending& q : pending) ucp_request_free(q.request);
        fail_peer(peer, s, "completing puts to");
      }
      if (lap_ns != nullptr) lap_ns[peer] += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - since).count());
      since = now;
    }
    if (pending.empty()) return;
    // Waiting for a peer on another machine: asleep (sleep_unless: its acknowledgements, or room
    // in a full socket for the puts still queued, wake the progress thread, which wakes this
    // one); otherwise the backoff's yield.
    const bool sleep = backoff.yielding() && std::any_of(pending.begin(), pending.end(), [&](const Pending& q) { return sleeps_for(q.peer); });
    if (sleep) sleep_unless([&] {
      return std::any_of(pending.begin(), pending.end(), [](const Pending& q) { return ucp_request_check_status(q.request) != UCS_INPROGRESS; });
    });
    if (sleep ? backoff.expired() : !backoff.step()) {
      std::string who;
      for (const Pending& q : pending) who += (who.empty() ? "" : ", ") + describe(q.peer), ucp_request_free(q.request);
      broken_.store(true, std::memory_order_relaxed);
      if (teardown) return;
      throw Error(ErrorCode::kTimeout,
                  "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) + " ms in phase '" +
                      phase() + "' completing puts to " + who +
                      " (ucx transport: the peer stopped progressing, or the link to its machine is down)" + tcp_queues(),
                  pending.front().peer);
    }
  }
}

void UcxGroup::check_waiting(const WaitPoint& where, bool yielding, const std::uint64_t* word, std::uint64_t at_least) {
  check_left(where, word, at_least);  // first: a peer that left, then closed, names the cause
  if (where.peer >= 0 && where.peer < size_ && where.peer != rank_) {
    const int s = failed_[static_cast<std::size_t>(where.peer)].load(std::memory_order_relaxed);
    const bool gone = closed(where.peer);
    // The word again, after the failure or goodbye was seen: what the peer put before either
    // is in this rank's memory by then (its puts complete before its goodbye is sent).
    if ((s != 0 || gone) &&
        std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(word)).load(std::memory_order_acquire) < at_least) {
      note(where.phase);
      if (!gone) fail_peer(where.peer, static_cast<ucs_status_t>(s), "the wait for");
      broken_.store(true, std::memory_order_relaxed);
      tell_left(where.peer);
      throw Error(ErrorCode::kPeerFailed,
                  "rank " + std::to_string(rank_) + ": ucx: " + describe(where.peer) +
                      " closed its group (its program ended or destroyed the group) while this rank waited for it in phase '" +
                      where.phase + "'",
                  where.peer);
    }
  }
  if (!yielding) return;
  check_alive(where);
  if (!hook_) return;
  thread_local auto last = std::chrono::steady_clock::time_point{};
  const auto now = std::chrono::steady_clock::now();
  if (now - last < kHookEvery) return;
  last = now;
  hook_();
}

void UcxGroup::check_alive(const WaitPoint& where) {
  const int peer = where.peer;
  if (peer < 0 || peer >= size_ || peer == rank_ || !same_node(peer)) return;
  const ProcessIdentity& l = lives_[static_cast<std::size_t>(peer)];
  if (!l.checkable()) return;  // another pid namespace: the timeout decides
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::int64_t next = next_life_check_.load(std::memory_order_relaxed);
  if (now < next || !next_life_check_.compare_exchange_strong(next, now + std::chrono::nanoseconds(std::chrono::milliseconds(20)).count()))
    return;
  const ProcessIdentity::Seen seen = l.look();
  std::atomic<std::int64_t>& suspect = suspect_since_[static_cast<std::size_t>(peer)];
  if (!l.ended(seen)) return suspect.store(0, std::memory_order_relaxed);
  // Death is final: seen again 100 ms later it is reported (a single /proc look was
  // measured to miss a live peer under load, rarely).
  const std::int64_t since = suspect.load(std::memory_order_relaxed);
  if (since == 0) return suspect.store(now, std::memory_order_relaxed);
  if (now - since < std::chrono::nanoseconds(std::chrono::milliseconds(100)).count()) return;
  broken_.store(true, std::memory_order_relaxed);
  tell_left(peer);
  throw Error(ErrorCode::kPeerFailed,
              "rank " + std::to_string(rank_) + ": ucx: " + describe(peer) + " (pid " + std::to_string(l.pid) + ": " + l.describe(seen) +
                  ") died while this rank waited for it in phase '" + where.phase + "'",
              peer);
}

// This rank leaves its call because `lost` failed: every rank that may wait for it learns so
// at once (its left word here, which check_left reads) instead of waiting a whole timeout for
// signals this rank will not send. Once per group. To another machine a put, as the
// goodbye's, completed by the teardown's flush; to this machine's ranks a store into their
// mapped block (none where UCX could not map it: those wait for their timeout).
void UcxGroup::tell_left(int lost) const noexcept {
  if (goodbye_memh_ == nullptr || lost < 0 || lost >= size_ || told_left_.exchange(true)) return;
  left_value_ = static_cast<std::uint64_t>(lost) + 1;
  for (int p = 0; p < size_; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (p == rank_ || p == lost) continue;
    if (same_node(p)) {
      if (std::uint64_t* block = peer_blocks_[up])
        std::atomic_ref<std::uint64_t>(block[static_cast<std::size_t>(size_ + rank_)]).store(left_value_, std::memory_order_release);
      continue;
    }
    if (failed_[up].load(std::memory_order_relaxed) != 0 || closed(p)) continue;
    touched_[up].store(true, std::memory_order_relaxed);
    ucp_request_param_t prm{};
    const std::uint64_t at = goodbye_remote_[up] + (static_cast<std::uint64_t>(size_) + static_cast<std::uint64_t>(rank_)) * sizeof left_value_;
    ucs_status_ptr_t r = ucp_put_nbx(eps_[up], &left_value_, sizeof left_value_, at, goodbye_rkeys_[up], &prm);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
  }
}

int UcxGroup::left_because(int peer) const noexcept {
  if (left_ == nullptr || peer < 0 || peer >= size_ || peer == rank_) return -1;
  const std::uint64_t v = std::atomic_ref<std::uint64_t>(left_[static_cast<std::size_t>(peer)]).load(std::memory_order_acquire);
  return v == 0 || v > static_cast<std::uint64_t>(size_) || v - 1 == static_cast<std::uint64_t>(rank_) ? -1 : static_cast<int>(v - 1);
}

// The awaited peer left the call because a rank failed, and its word is
// still short: the wait fails at once, naming the lost rank as the cause (kPeerFailed).
void UcxGroup::check_left(const WaitPoint& where, const std::uint64_t* word, std::uint64_t at_least) {
  const int lost = left_because(where.peer);
  if (lost < 0 || std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(word)).load(std::memory_order_acquire) >= at_least) return;
  note(where.phase);
  broken_.store(true, std::memory_order_relaxed);
  tell_left(lost);
  throw Error(ErrorCode::kPeerFailed,
              "rank " + std::to_string(rank_) + ": ucx: " + describe(lost) + " failed: " + describe(where.peer) +
                  " left the call on its failure while this rank waited for it in phase '" + where.phase + "'",
              lost);
}

void UcxGroup::fail_timeout(const WaitPoint& where) const {
  broken_.store(true, std::memory_order_relaxed);
  throw Error(ErrorCode::kTimeout,
              "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) + " ms in phase '" +
                  where.phase + "' waiting for " + describe(where.peer) + " (ucx transport)" +
                  (remote_peers_ ? tcp_queues() : std::string()),
              where.peer);
}

std::vector<std::string> UcxGroup::exchange(const std::string& mine) {
  if (progress_thread_.joinable()) return allgather_strings(boot_, mine);  // it progresses meanwhile
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      ucp_worker_progress(worker_);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  struct Join {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Join() {
      stop = true;
      t.join();
    }
  } join{stop, helper};
  return allgather_strings(boot_, mine);
}

}  // namespace epx::detail
