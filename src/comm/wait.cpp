// The one wait on a peer-written word (epx/spi/wait.hpp).
#include "epx/spi/wait.hpp"

#include <atomic>
#include <string>

#include "epx/error.hpp"
#include "epx/spi/backoff.hpp"

namespace epx::spi {

void await_signal(Transport& t, std::size_t slot, std::uint64_t target, const WaitPoint& where, bool yield) {
  if (!peek([&] { return t.read_signal(slot) >= target; }, yield)) t.wait_signal(slot, target, where);
}

void await_flag(Transport& t, std::size_t offset, std::uint64_t target, const WaitPoint& where, bool yield) {
  auto* word = reinterpret_cast<std::uint64_t*>(t.window() + offset);
  if (!peek([&] { return std::atomic_ref<std::uint64_t>(*word).load(std::memory_order_acquire) >= target; }, yield))
    t.wait_flag(offset, target, where);
}

void await_word(Transport& t, const std::byte* word, std::uint64_t target, const WaitPoint& where, bool yield) {
  std::atomic_ref<std::uint64_t> w(*reinterpret_cast<std::uint64_t*>(const_cast<std::byte*>(word)));
  auto ready = [&] { return w.load(std::memory_order_acquire) >= target; };
  if (peek(ready, yield)) return;
  t.enter_phase(where.phase);
  Backoff backoff(t.timeout(), wait_spins(t.num_ranks()));
  while (!ready()) {
    if (backoff.step()) continue;
    if (ready()) return;
    throw Error(ErrorCode::kTimeout,
                "rank " + std::to_string(t.rank()) + ": " + where.phase + ": rank " + std::to_string(where.peer) +
                    " did not write its word within " + std::to_string(t.timeout().count()) + " ms (it waits for " +
                    std::to_string(target) + ", holds " + std::to_string(w.load(std::memory_order_acquire)) + ")",
                where.peer);
  }
}

}  // namespace epx::spi
