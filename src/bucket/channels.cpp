#include "channels.hpp"

#include <chrono>

#include "epx/spi/wait.hpp"

namespace epx::detail {

namespace {
constexpr std::size_t kPage = 4096;
std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
}  // namespace

std::size_t BucketLayout::slots_offset() const noexcept { return round_up(storage_bytes, kPage); }

std::size_t BucketLayout::slot_offset(int source, int s) const noexcept {
  return slots_offset() + (2 * static_cast<std::size_t>(source) + static_cast<std::size_t>(s)) * slot_bytes();
}

std::size_t BucketLayout::board_offset(int g, int s) const noexcept {
  return slots_offset() + 2 * static_cast<std::size_t>(num_ranks) * slot_bytes() +
         (2 * static_cast<std::size_t>(g) + static_cast<std::size_t>(s)) * board_slot_bytes();
}

std::size_t BucketLayout::window_bytes() const noexcept {
  return slots_offset() + 2 * static_cast<std::size_t>(num_ranks) * slot_bytes() +
         2 * static_cast<std::size_t>(num_boards) * board_slot_bytes();
}

Channels::Channels(Transport& t, const BucketLayout& layout, bool yield, Protocol protocol)
    : t_(t), layout_(layout), credit_(t, 2, BucketLayout::kChannelSignals, yield, protocol), yield_(yield),
      done_sent_(static_cast<std::size_t>(layout.num_ranks)), done_received_(done_sent_.size()) {}

std::size_t Channels::out_slot(int to) const noexcept {
  return layout_.slot_offset(t_.rank(), static_cast<int>(credit_.next_to(to) % 2));
}

void Channels::wait_credit(int to, const char* phase) { credit_.await_slot(to, phase); }

void Channels::send(int to, int queue) { credit_.publish(to, queue); }

const std::byte* Channels::receive(int from, const char* phase) {
  credit_.await_message(from, phase);
  return t_.window() + layout_.slot_offset(from, static_cast<int>(credit_.next_from(from) % 2));
}

void Channels::consume(int from, int queue) {
  credit_.take(from);
  credit_.release(from, credit_.next_from(from), queue);
}

void Channels::send_done(int to, int queue) {
  if (credit_.protocol() == Protocol::kExplicit) t_.quiet(queue);
  t_.signal(to, layout_.done_slot(t_.rank()), ++done_sent_[static_cast<std::size_t>(to)], queue);
}

void Channels::wait_done(int from, const char* phase) {
  const auto t0 = std::chrono::steady_clock::now();
  spi::await_signal(t_, layout_.done_slot(from), ++done_received_[static_cast<std::size_t>(from)], WaitPoint{phase, from},
                    yield_);
  done_wait_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace epx::detail
