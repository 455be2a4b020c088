// Credit channels (epx/spi/channel.hpp).
#include "epx/spi/channel.hpp"

#include "epx/spi/wait.hpp"

namespace epx::spi {

CreditChannels::CreditChannels(Transport& t, int slots, std::size_t signal_base, bool yield)
    : t_(t), P_(t.num_ranks()), slots_(slots), base_(signal_base), yield_(yield),
      sent_(static_cast<std::size_t>(P_), 0), received_(static_cast<std::size_t>(P_), 0) {}

bool CreditChannels::slot_free(int to) const noexcept {
  const std::uint64_t m = next_to(to), s = static_cast<std::uint64_t>(slots_);
  return m < s || t_.read_signal(released_signal(to)) >= m - s + 1;
}

void CreditChannels::await_slot(int to, const char* phase) {
  const std::uint64_t m = next_to(to), s = static_cast<std::uint64_t>(slots_);
  if (m >= s) await_signal(t_, released_signal(to), m - s + 1, WaitPoint{phase, to}, yield_);
}

void CreditChannels::publish(int to, int queue) {
  std::uint64_t& m = sent_[static_cast<std::size_t>(to)];
  t_.signal(to, arrived_signal(t_.rank()), ++m, queue);
}

std::uint64_t CreditChannels::in_flight(int to) const noexcept {
  return next_to(to) - t_.read_signal(released_signal(to));
}

bool CreditChannels::arrived(int from) const noexcept { return arrived_count(from) >= next_from(from) + 1; }

std::uint64_t CreditChannels::arrived_count(int from) const noexcept { return t_.read_signal(arrived_signal(from)); }

void CreditChannels::await_message(int from, const char* phase) {
  await_signal(t_, arrived_signal(from), next_from(from) + 1, WaitPoint{phase, from}, yield_);
}

void CreditChannels::release(int from, std::uint64_t count, int queue) {
  t_.signal(from, released_signal(t_.rank()), count, queue);
}

}  // namespace epx::spi
