// The one wait on a peer-written word (epx/spi/wait.hpp).
#include "epx/spi/wait.hpp"

#include <atomic>

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

}  // namespace epx::spi
