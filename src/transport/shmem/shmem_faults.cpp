// The shmem transport's faults (shmem_transport.hpp): the watchdog that ends a rank stuck
// in shmem_quiet / shmem_fence, the line a rank writes when the launcher ends it (SIGTERM),
// and the errors that name the peer a wait was for (its timeout, or a member known gone).
#include "shmem/shmem_transport.hpp"

#include <shmem.h>

#include <dlfcn.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "epx/error.hpp"
#include "shmem/shmem_elastic.hpp"
#include "shmem/shmem_runtime.hpp"

namespace epx::detail {

namespace {

// The transport whose rank the SIGTERM line describes (the one that installed the handler),
// and the disposition it replaced.
std::atomic<const ShmemTransport*> g_term_transport{nullptr};
struct sigaction g_old_term {};

}  // namespace

// Where the launcher lets survivors live, a shmem_quiet with puts to a PE that just died
// returns only once UCX's keepalive declares that endpoint dead (UCX_KEEPALIVE_INTERVAL; at
// load ~25 on 2 cores more than 6 s was seen with 1 s): twice the timeout lets a survivor
// heal instead of being ended, at the price of a cut link ending it later.
std::chrono::milliseconds ShmemTransport::watch_limit() const noexcept {
  return launcher_keeps_survivors() ? 2 * timeout_ : timeout_;
}

void ShmemTransport::watchdog_loop() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!stop_watch_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    for (const Blocking& b : blocking_)
      if (now - b.since > watch_limit()) watchdog_fire(b);
  }
}

void ShmemTransport::watchdog_fire(const Blocking& b) {
  ShmemRuntime::mark_failed();
  std::string peers;
  for (int p = 0; p < num_ranks_; ++p)
    if (b.peer == p || (b.peer < 0 && outstanding_[static_cast<std::size_t>(p)].load()))
      peers += (peers.empty() ? "" : ", ") + describe_peer(p);
  const std::string msg = "epx: rank " + std::to_string(rank_) + ": timed out after " + std::to_string(watch_limit().count()) +
                          " ms in phase '" + last_phase_.load() + "' waiting for " + (peers.empty() ? "the other ranks" : peers) +
                          " to complete puts (" + b.call +
                          " blocks in the OpenSHMEM runtime, which cannot be interrupted: ending this process)\n";
  std::fwrite(msg.data(), 1, msg.size(), stderr);
  std::fflush(stderr);
  // Where the launcher lets survivors live (they may heal), Open MPI ends the job only when
  // told: a process that just vanishes leaves it waiting for the dead PE. Ask it to abort
  // (from another thread: this one may not come back), and vanish a second later anyway.
  if (launcher_keeps_survivors()) {
    std::thread([] { shmem_global_exit(1); }).detach();
    const timespec pause{1, 0};
    nanosleep(&pause, nullptr);
  }
  std::_Exit(1);
}

std::string ShmemTransport::describe_peer(int peer) const {
  if (peer < 0 || peer >= num_ranks_) return "the other ranks";
  const int node = node_of_rank_[static_cast<std::size_t>(peer)];
  const bool same = node == node_of_rank_[static_cast<std::size_t>(rank_)];
  return "rank " + std::to_string(peer) + " (node " + std::to_string(node) + (same ? ", this node)" : ", another machine)");
}

// Replaces SIGTERM's default action or liboshmem's handler, which does nothing (Open MPI
// 4.1's oshmem_shmem_init.c installs it "to replace other unpredictable handlers", so a
// rank ignores the SIGTERM its daemon sends and dies of the SIGKILL that follows
// odls_base_sigkill_timeout later, silently); any other handler (the application's) is left
// alone. One transport at a time: the first one made.
bool ShmemTransport::replaceable_term_action(const struct sigaction& old) {
  if ((old.sa_flags & SA_SIGINFO) != 0) return false;
  if (old.sa_handler == SIG_DFL) return true;
  if (old.sa_handler == SIG_IGN) return false;
  Dl_info info{};
  return dladdr(reinterpret_cast<void*>(old.sa_handler), &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "liboshmem") != nullptr;
}

void ShmemTransport::install_term_note() {
  term_head_ = "epx: rank " + std::to_string(rank_) + " (node " + std::to_string(node_of_rank_[static_cast<std::size_t>(rank_)]) +
               ") ended by the launcher (SIGTERM) in phase '";
  term_while_ = "' while waiting for ";
  term_after_ = "' (not in a wait; the last one was for ";
  term_peer_.clear();
  for (int p = -1; p < num_ranks_; ++p) term_peer_.push_back(describe_peer(p));
  const ShmemTransport* none = nullptr;
  if (!g_term_transport.compare_exchange_strong(none, this)) return;
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) != 0 || !replaceable_term_action(old)) {
    g_term_transport.store(nullptr);
    return;
  }
  struct sigaction sa {};
  sa.sa_handler = &ShmemTransport::on_term;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;  // the handler's raise() then ends the process at once
  g_old_term = old;
  sigaction(SIGTERM, &sa, nullptr);
}

void ShmemTransport::remove_term_note() noexcept {
  if (g_term_transport.load() != this) return;
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_term_transport.store(nullptr);
}

// Async-signal-safe: reads atomics and strings built before the handler was installed,
// copies them with memcpy into a stack buffer, one write(2), then the default action.
void ShmemTransport::on_term(int sig) noexcept {
  const int saved_errno = errno;
  if (const ShmemTransport* t = g_term_transport.load(std::memory_order_acquire)) {
    char buf[1024];
    std::size_t n = 0;
    const auto add = [&](const char* s, std::size_t len) {
      len = std::min(len, sizeof buf - 1 - n);  // room for the newline
      std::memcpy(buf + n, s, len);
      n += len;
    };
    const auto add_str = [&](const char* s) {
      std::size_t len = 0;
      while (s != nullptr && s[len] != '\0' && len < 200) ++len;
      add(s, len);
    };
    const auto add_peer = [&](int peer) {
      if (peer < -1 || peer >= t->num_ranks_) peer = -1;
      const std::string& who = t->term_peer_[static_cast<std::size_t>(peer + 1)];
      add(who.data(), who.size());
    };
    add(t->term_head_.data(), t->term_head_.size());
    add_str(t->last_phase_.load(std::memory_order_relaxed));
    if (t->waiting_.load(std::memory_order_relaxed) > 0) {
      add(t->term_while_.data(), t->term_while_.size());
      add_peer(t->last_peer_.load(std::memory_order_relaxed));
    } else if (t->blocked_.load(std::memory_order_relaxed) > 0) {  // where the watchdog would end it after the timeout
      add("' in ", 5);
      add_str(t->blocked_call_.load(std::memory_order_relaxed));
      add(" completing puts to ", 20);
      const int peer = t->blocked_peer_.load(std::memory_order_relaxed);
      bool any = false;
      for (int p = 0; p < t->num_ranks_; ++p)
        if (peer == p || (peer < 0 && t->outstanding_[static_cast<std::size_t>(p)].load(std::memory_order_relaxed))) {
          if (any) add(", ", 2);
          add_peer(p), any = true;
        }
      if (!any) add_peer(-1);
    } else {
      add(t->term_after_.data(), t->term_after_.size());
      add_peer(t->last_peer_.load(std::memory_order_relaxed));
      add(")", 1);
    }
    buf[n++] = '\n';
    [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, buf, n);
  }
  // The daemon forwards the line only if it reads the pipe before it sees this process end
  // (measured: without a pause, 1 of 6 daemon-kill runs lost a rank's line). Well inside
  // the SIGKILL that follows after odls_base_sigkill_timeout (1 s).
  const timespec pause{0, 200'000'000};
  nanosleep(&pause, nullptr);
  errno = saved_errno;
  ::signal(sig, SIG_DFL);  // SA_RESETHAND did too; liboshmem's handler is not put back: the rank ends
  raise(sig);
}
// Where survivors may heal: a member whose process a PE of its machine saw gone (announced
// in the control words, or seen here) dooms the call; say so at once instead of after the
// timeout, naming it, so the survivors agree and rebuild within milliseconds of the death.
void ShmemTransport::check_members(const WaitPoint& where) {
  ShmemControl& c = *control_;
  for (int p = 0; p < num_ranks_; ++p) {
    if (p == rank_) continue;
    const int q = pe(p);
    if (c.load(c.gone(q)) == 0) {
      if (!c.seen_dead(q)) continue;
      // Every other member learns it (nothing more to the dead PE: a put UCX cannot deliver
      // stays in flight until its keepalive declares the endpoint dead, holding up every
      // shmem_quiet of this PE meanwhile).
      c.announce_gone(q, pe_);
    }
    ShmemRuntime::mark_failed();
    throw Error(ErrorCode::kPeerFailed,
                "rank " + std::to_string(rank_) + ": " + describe_peer(p) + " died (its process is gone, seen on its machine) " +
                    "while this rank waited in phase '" + where.phase + "'" +
                    (where.peer >= 0 && where.peer != p ? " for " + describe_peer(where.peer) : std::string()) +
                    " (shmem transport)",
                p);
  }
}

bool ShmemTransport::member_known_gone() const noexcept {
  if (control_ == nullptr) return false;
  const ShmemControl& c = *control_;
  try {
    for (int p = 0; p < num_ranks_; ++p)
      if (p != rank_ && c.known_dead(pe(p))) return true;
  } catch (...) {
    // Nothing known: the teardown goes on as for a live group.
  }
  return false;
}

void ShmemTransport::fail_timeout(const WaitPoint& where) {
  ShmemRuntime::mark_failed();
  const std::string who = describe_peer(where.peer);
  throw Error(ErrorCode::kTimeout,
              "rank " + std::to_string(rank_) + ": timed out after " + std::to_string(timeout_.count()) +
                  " ms in phase '" + where.phase + "' waiting for " + who + " (shmem transport)",
              where.peer);
}

}  // namespace epx::detail
