// Credit channels (epx/spi/channel.hpp).
#include "epx/spi/channel.hpp"

#include <atomic>

#include "epx/spi/wait.hpp"

namespace epx::spi {

CreditChannels::CreditChannels(Transport& t, int slots, std::size_t signal_base, bool yield, Protocol protocol)
    : t_(t), P_(t.num_ranks()), slots_(slots), base_(signal_base), yield_(yield), protocol_(protocol),
      sent_(static_cast<std::size_t>(P_), 0), received_(static_cast<std::size_t>(P_), 0) {}

bool CreditChannels::slot_free(int to) const noexcept {
  const std::uint64_t m = next_to(to), s = static_cast<std::uint64_t>(slots_);
  return m < s || t_.read_signal(released_signal(to)) >= m - s + 1;
}

void CreditChannels::await_slot(int to, const char* phase) {
  const std::uint64_t m = next_to(to), s = static_cast<std::uint64_t>(slots_);
  if (m >= s) await_signal(t_, released_signal(to), m - s + 1, WaitPoint{phase, to}, yield_);
}

void CreditChannels::publish(int to, int queue, std::size_t flag_offset) {
  std::uint64_t& m = sent_[static_cast<std::size_t>(to)];
  switch (protocol_) {
    case Protocol::kExplicit:
      t_.quiet(queue);
      t_.signal(to, arrived_signal(t_.rank()), ++m, queue);
      return;
    case Protocol::kTail:
      t_.signal(to, arrived_signal(t_.rank()), ++m, queue);
      return;
    case Protocol::kFlag: {
      // No bytes of its own: the flag alone, stored (release) after this thread's earlier
      // stores into the mapped peer window, and the peer woken if it sleeps on its doorbell.
      static const std::byte none{};
      t_.put_flagged(to, flag_offset, &none, 0, ++m, queue);
      return;
    }
  }
}

std::uint64_t CreditChannels::in_flight(int to) const noexcept {
  return next_to(to) - t_.read_signal(released_signal(to));
}

bool CreditChannels::arrived(int from, std::size_t flag_offset) const noexcept {
  if (protocol_ == Protocol::kFlag)
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(t_.window() + flag_offset))
               .load(std::memory_order_acquire) >= next_from(from) + 1;
  return arrived_count(from) >= next_from(from) + 1;
}

std::uint64_t CreditChannels::arrived_count(int from) const noexcept {
  return protocol_ == Protocol::kFlag ? 0 : t_.read_signal(arrived_signal(from));
}

void CreditChannels::await_message(int from, const char* phase, std::size_t flag_offset) {
  if (protocol_ == Protocol::kFlag) await_flag(t_, flag_offset, next_from(from) + 1, WaitPoint{phase, from}, yield_);
  else await_signal(t_, arrived_signal(from), next_from(from) + 1, WaitPoint{phase, from}, yield_);
}

void CreditChannels::release(int from, std::uint64_t count, int queue) {
  t_.signal(from, released_signal(t_.rank()), count, queue);
}

}  // namespace epx::spi
