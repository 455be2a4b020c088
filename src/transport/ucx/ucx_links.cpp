// The ucx transport's links (ucx_group.hpp, Link): puts and signals to peers on other
// machines over TCP connections of the group's own, when UCX itself would carry them over
// TCP (links_refusal says when); their reader threads, acknowledgements and failures.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"
#include "ucx/ucx_group.hpp"
#include "ucx/ucx_lanes.hpp"

namespace epx::detail {

using namespace ucx;

namespace {
// One message on a link: a put (`bytes` follow the header) or an 8-byte store (`value`).
struct LinkMessage {
  std::uint64_t addr;
  std::uint64_t bytes;
  std::uint64_t value;
  std::uint32_t kind;  // kPutMessage or kSetMessage
  std::uint32_t from;
};
constexpr std::uint32_t kPutMessage = 1, kSetMessage = 2, kLinkHello = 0x65707831;  // "epx1"
constexpr std::size_t kAckEveryBytes = std::size_t{1} << 20;

bool read_full(int fd, void* p, std::size_t n) noexcept {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, MSG_WAITALL);
    if (r > 0) c += r, n -= static_cast<std::size_t>(r);
    else if (r < 0 && errno == EINTR) continue;
    else return false;
  }
  return true;
}

// Writes all of `iov` to `fd` (whose other direction another thread may read), waiting for room
// until `deadline`. 0, or the errno of the failure (ETIMEDOUT at the deadline).
int write_full(int fd, iovec* iov, int n, std::chrono::steady_clock::time_point deadline) noexcept {
  while (n > 0) {
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<std::size_t>(n);
    const ssize_t w = ::sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return ETIMEDOUT;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 50)));
      continue;
    }
    auto done = static_cast<std::size_t>(w);
    while (n > 0 && done >= iov->iov_len) done -= iov->iov_len, ++iov, --n;
    if (n > 0) iov->iov_base = static_cast<char*>(iov->iov_base) + done, iov->iov_len -= done;
  }
  return 0;
}

// This host's IPv4 addresses a peer may reach it at: every interface that is up, not the
// loopback, and among UCX_NET_DEVICES when that names devices (the network the user chose).
std::string link_addresses() {
  std::set<std::string> allowed;
  if (const char* d = std::getenv("UCX_NET_DEVICES"); d != nullptr && std::string(d) != "all" && *d != '\0') {
    std::istringstream in(d);
    for (std::string dev; std::getline(in, dev, ',');) allowed.insert(dev.substr(0, dev.find(':')));
  }
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string out;
  for (ifaddrs* a = all; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_UP)) continue;
    if (!allowed.empty() && !allowed.count(a->ifa_name)) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    out += (out.empty() ? "" : ",") + std::string(buf);
  }
  ::freeifaddrs(all);
  return out;
}

int connect_to(const std::string& ip, int port, std::chrono::milliseconds limit) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (errno != EINPROGRESS || ::poll(&p, 1, static_cast<int>(limit.count())) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      ::close(fd);
      return -1;
    }
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void tune_link(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// The listening socket of this rank's links, and what it publishes: "+<port> <ip>,<ip>..."
// (the addresses a peer may reach it at), or "-" and why it has none. -1 with "-...".
int open_listener(int backlog, std::string& mine) {
  const std::string ips = link_addresses();
  if (ips.empty()) return mine = "-no IPv4 address to listen on", -1;
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (listener >= 0 && ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(listener, backlog) == 0 &&
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    return mine = "+" + std::to_string(ntohs(a.sin_port)) + " " + ips, listener;
  mine = std::string("-cannot listen: ") + std::strerror(errno);
  if (listener >= 0) ::close(listener);
  return -1;
}

bool has_rdma_devices() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

// What UCX's endpoint says of itself (ucp_ep_print_info), as text.
std::string endpoint_info(ucp_ep_h ep) {
  char* buf = nullptr;
  std::size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (f == nullptr) return "";
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string out(buf != nullptr ? buf : "", len);
  std::free(buf);
  return out;
}
}  // namespace

// The rule (ucx_group.hpp, uses_link): "" when this rank wants links, else why not.
// EPX_UCX_LINKS=1 forces them, =0 forbids them; unset, they replace UCX's puts only where
// UCX itself would go over TCP: every lane of its endpoint to every peer on another machine
// is its tcp transport. A lane on rc, dc, ud (InfiniBand, RoCE) means UCX's puts are RDMA,
// which links would slow down. An endpoint whose lanes UCX does not list (another format)
// falls back to the machine: links only when it has no RDMA device (/sys/class/infiniband).
std::string UcxGroup::links_refusal() {
  const char* env = std::getenv("EPX_UCX_LINKS");
  if (env != nullptr && std::string(env) == "0") return "EPX_UCX_LINKS=0";
  if (env != nullptr && std::string(env) == "1") return "";
  for (int p = 0; p < size_; ++p) {
    if (same_node(p)) continue;
    const std::string info = endpoint_info(eps_[static_cast<std::size_t>(p)]);
    switch (lanes_verdict(info)) {
      case LanesVerdict::kTcpOnly:
        continue;
      case LanesVerdict::kOther:
        return "UCX reaches " + describe(p) + " by another transport than tcp (" + lane_transports(info).front() + ", ...)";
      case LanesVerdict::kUnknown:
        if (has_rdma_devices()) return "UCX lists no lanes to " + describe(p) + " and this machine has RDMA devices";
    }
  }
  return "";
}

// Collective. Every rank that wants links (links_refusal) listens, publishes its addresses
// and port, connects to every rank on another machine (its messages to that rank) and
// accepts their connections (their messages to it). A rank that does not want them, or
// cannot make them (no address, a refused connection), says so, and then no rank uses links:
// puts and signals go through UCX.
void UcxGroup::connect_links() {
  links_.reset(new Link[static_cast<std::size_t>(size_)]);
  std::string mine = "-" + links_refusal();
  const int listener = mine == "-" ? open_listener(size_, mine) : -1;
  const std::vector<std::string> all = allgather_strings(boot_, mine);
  bool ok = std::all_of(all.begin(), all.end(), [](const std::string& a) { return !a.empty() && a[0] == '+'; });
  int remote = 0;
  for (int p = 0; p < size_; ++p) remote += same_node(p) ? 0 : 1;
  ok = ok && connect_outgoing(all) && accept_incoming(listener, remote);
  if (listener >= 0) ::close(listener);
  const std::vector<std::string> verdicts = allgather_strings(boot_, ok ? "+" : "-");
  ok = std::all_of(verdicts.begin(), verdicts.end(), [](const std::string& v) { return v == "+"; });
  if (!ok) return close_links();
  start_links();
}

// This rank's connection to every rank on another machine, at the first of its addresses
// that answers, opened with the hello that names this rank. False at the first that fails.
bool UcxGroup::connect_outgoing(const std::vector<std::string>& all) {
  for (int p = 0; p < size_; ++p) {
    if (same_node(p)) continue;
    const std::string& a = all[static_cast<std::size_t>(p)];
    const auto space = a.find(' ');
    const int port = std::atoi(a.c_str() + 1);
    std::istringstream ips(a.substr(space + 1));
    int fd = -1;
    for (std::string ip; fd < 0 && std::getline(ips, ip, ',');) fd = connect_to(ip, port, std::chrono::milliseconds(2000));
    const std::uint32_t hello[2] = {kLinkHello, static_cast<std::uint32_t>(rank_)};
    if (fd >= 0 && ::send(fd, hello, sizeof hello, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof hello)) ::close(fd), fd = -1;
    if (fd < 0) return false;
    tune_link(fd);
    links_[static_cast<std::size_t>(p)].out = fd;
  }
  return true;
}

// Every remote rank's connection to this one (they connected before accepting theirs: the
// listen backlog holds them meanwhile); a rank that could not connect leaves the others
// here for 10 s at most before they all go on without links.
bool UcxGroup::accept_incoming(int listener, int remote) {
  const auto deadline = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10));
  for (int got = 0; got < remote; ++got) {
    pollfd pf{listener, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    const int fd = left > 0 && ::poll(&pf, 1, static_cast<int>(left)) == 1 ? ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    std::uint32_t hello[2] = {0, 0};
    timeval tv{2, 0};
    if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const bool valid = fd >= 0 && read_full(fd, hello, sizeof hello) && hello[0] == kLinkHello && hello[1] < static_cast<std::uint32_t>(size_) &&
                       !same_node(static_cast<int>(hello[1])) && links_[hello[1]].in < 0;
    if (!valid) {
      if (fd >= 0) ::close(fd);
      return false;
    }
    timeval none{0, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    tune_link(fd);
    links_[hello[1]].in = fd;
  }
  return true;
}

// Every rank made all its links: they carry the puts and signals to other machines from now on.
void UcxGroup::start_links() {
  links_on_ = true;
  // A child made by fork inherits the connections: it closes its copies at once, so that a
  // rank that dies is seen by its peers (the end of its connections) even while children of
  // it live on.
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { ::pthread_atfork(nullptr, nullptr, &UcxGroup::close_links_in_child); });
  for (int p = 0; p < size_; ++p) {
    if (same_node(p)) continue;
    Link& l = links_[static_cast<std::size_t>(p)];
    l.reader = std::thread([this, p] { read_link(p); });
    l.ack_reader = std::thread([this, p] { read_acks(p); });
  }
}

// In a child made by fork: only this process's copies of the descriptors, no shutdown (that
// would end the parent's connections too). The child's group is never used.
void UcxGroup::close_links_in_child() noexcept {
  for (UcxGroup* g : live_groups().groups) {
    if (!g->links_) continue;
    for (int p = 0; p < g->size_; ++p) {
      Link& l = g->links_[static_cast<std::size_t>(p)];
      if (l.out >= 0) ::close(l.out), l.out = -1;
      if (l.in >= 0) ::close(l.in), l.in = -1;
    }
  }
}

// Shuts the connections (the readers' recv return), joins the readers, closes.
void UcxGroup::close_links() noexcept {
  if (!links_) return;
  links_closing_.store(true, std::memory_order_relaxed);
  for (int p = 0; p < size_; ++p) {
    Link& l = links_[static_cast<std::size_t>(p)];
    if (l.out >= 0) ::shutdown(l.out, SHUT_RDWR);
    if (l.in >= 0) ::shutdown(l.in, SHUT_RDWR);
  }
  for (int p = 0; p < size_; ++p) {
    Link& l = links_[static_cast<std::size_t>(p)];
    if (l.reader.joinable()) l.reader.join();
    if (l.ack_reader.joinable()) l.ack_reader.join();
    if (l.out >= 0) ::close(l.out), l.out = -1;
    if (l.in >= 0) ::close(l.in), l.in = -1;
  }
  links_on_ = false;
}

// A connection to `peer` ended. Its goodbye said first: nothing is lost (it reads nothing
// more, and what it sent is written). Otherwise the peer failed, as UCX's error callback
// says of its endpoint: its waits and flushes fail naming it.
void UcxGroup::link_down(int peer) noexcept {
  Link& l = links_[static_cast<std::size_t>(peer)];
  l.down.store(true, std::memory_order_release);
  if (!links_closing_.load(std::memory_order_relaxed) && !closed(peer)) {
    int ok = 0;
    failed_[static_cast<std::size_t>(peer)].compare_exchange_strong(ok, static_cast<int>(UCS_ERR_CONNECTION_RESET));
  }
  progressed_.fetch_add(1, std::memory_order_seq_cst);
  wake_sleepers();
}

// The peer's messages to this rank, written where they say (their addresses are this rank's
// blocks, from the rkey exchange, as UCX's puts are), in order; acknowledged (the count
// processed) whenever no more is waiting in the socket, so a flush at the peer waits for one
// message at most per burst.
void UcxGroup::read_link(int peer) noexcept {
  Link& l = links_[static_cast<std::size_t>(peer)];
  std::uint64_t processed = 0;
  std::size_t unacked_bytes = 0;
  for (;;) {
    LinkMessage m{};
    if (!read_full(l.in, &m, sizeof m)) break;
    unacked_bytes += sizeof m + m.bytes;
    if (m.kind == kPutMessage) {
      if (!read_full(l.in, reinterpret_cast<void*>(static_cast<std::uintptr_t>(m.addr)), m.bytes)) break;
    } else {
      std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(static_cast<std::uintptr_t>(m.addr))).store(m.value, std::memory_order_release);
    }
    ++processed;
    progressed_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_sleepers();
    pollfd pf{l.in, POLLIN, 0};
    // More is coming: one acknowledgement for the burst, or per kAckEveryBytes of a long one
    // (a flush waits for its own messages, not for the end of a stream other threads send).
    if (unacked_bytes < kAckEveryBytes && ::poll(&pf, 1, 0) == 1) continue;
    unacked_bytes = 0;
    iovec iov{&processed, sizeof processed};
    if (write_full(l.in, &iov, 1, std::chrono::steady_clock::now() + timeout_) != 0) break;
  }
  link_down(peer);
}

void UcxGroup::read_acks(int peer) noexcept {
  Link& l = links_[static_cast<std::size_t>(peer)];
  for (std::uint64_t n = 0; read_full(l.out, &n, sizeof n);) {
    l.acked.store(n, std::memory_order_release);
    progressed_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_sleepers();
  }
  link_down(peer);
}

void UcxGroup::link_send(int peer, std::uint64_t addr, const void* src, std::size_t bytes, std::uint64_t value, const char* what) {
  Link& l = links_[static_cast<std::size_t>(peer)];
  if (closed(peer)) return;
  touched_[static_cast<std::size_t>(peer)].store(true, std::memory_order_relaxed);
  LinkMessage m{addr, src != nullptr ? bytes : 0, value, src != nullptr ? kPutMessage : kSetMessage, static_cast<std::uint32_t>(rank_)};
  iovec iov[2] = {{&m, sizeof m}, {const_cast<void*>(src), src != nullptr ? bytes : 0}};
  int err = 0;
  {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    std::unique_lock<std::timed_mutex> lock(l.send_mu, deadline);
    if (!lock.owns_lock()) err = ETIMEDOUT;  // another thread's message is stuck as long
    else if (l.down.load(std::memory_order_acquire)) err = ECONNRESET;
    else err = write_full(l.out, iov, src != nullptr ? 2 : 1, deadline);
    if (err == 0) l.sent.fetch_add(1, std::memory_order_release);
  }
  if (err == 0 || closed(peer)) return;  // a peer that said goodbye reads nothing more
  broken_.store(true, std::memory_order_relaxed);
  if (err == ETIMEDOUT)
    throw Error(ErrorCode::kTimeout, "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) +
                                         " ms in phase '" + phase() + "' completing puts to " + describe(peer) +
                                         " (ucx transport: its connection took no more bytes: the peer stopped reading, or the link to its machine is down)" +
                                         ucx::tcp_queues(),
                 peer);
  const int s = failed_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed);
  fail_peer(peer, s != 0 ? static_cast<ucs_status_t>(s) : UCS_ERR_CONNECTION_RESET, what);
}

void UcxGroup::await_links(std::uint64_t* lap_ns, bool teardown) {
  std::vector<std::pair<int, std::uint64_t>> pending;  // peer, messages to be acknowledged
  for (int p = 0; p < size_; ++p) {
    if (same_node(p)) continue;
    const Link& l = links_[static_cast<std::size_t>(p)];
    const std::uint64_t sent = l.sent.load(std::memory_order_acquire);
    if (l.acked.load(std::memory_order_acquire) < sent) pending.emplace_back(p, sent);
  }
  if (pending.empty()) return;
  auto since = std::chrono::steady_clock::now();
  spi::Backoff backoff(teardown && broken() ? std::min<std::chrono::milliseconds>(timeout_, kBrokenTeardown) : timeout_, kNetworkSpins);
  const auto done = [&](const std::pair<int, std::uint64_t>& q) {
    const Link& l = links_[static_cast<std::size_t>(q.first)];
    return l.acked.load(std::memory_order_acquire) >= q.second || l.down.load(std::memory_order_acquire);
  };
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      if (!done(*it)) {
        ++it;
        continue;
      }
      const int peer = it->first;
      const bool lost = links_[static_cast<std::size_t>(peer)].acked.load(std::memory_order_acquire) < it->second;
      it = pending.erase(it);
      if (lost && !teardown && !closed(peer)) {
        const int s = failed_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed);
        fail_peer(peer, s != 0 ? static_cast<ucs_status_t>(s) : UCS_ERR_CONNECTION_RESET, "completing puts to");
      }
      if (lap_ns != nullptr) lap_ns[peer] += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - since).count());
      since = now;
    }
    if (pending.empty()) return;
    if (backoff.yielding()) {
      sleep_unless([&] { return std::any_of(pending.begin(), pending.end(), done); });
      if (!backoff.expired()) continue;
    } else if (backoff.step()) {
      continue;
    }
    broken_.store(true, std::memory_order_relaxed);
    if (teardown) return;
    std::string who;
    for (const auto& q : pending) who += (who.empty() ? "" : ", ") + describe(q.first);
    throw Error(ErrorCode::kTimeout,
                "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) + " ms in phase '" + phase() +
                    "' completing puts to " + who + " (ucx transport: the peer stopped reading, or the link to its machine is down)" +
                    ucx::tcp_queues(),
                pending.front().first);
  }
}


}  // namespace epx::detail
