// The "Add a buffer kind" recipe of docs/engine.md, followed once outside the library:
// ExchangeBuffer, every rank's block to every other rank (an all-gather of one block), in
// about sixty lines: a class over BufferBase (its own endpoint, agree for the config,
// agree_call for each call's verdict, allocate, destroy), its layout (where source j's
// message slot lies), and its messages over spi::CreditChannels, whose waits are
// spi::await_signal — no wait loop of its own. Checked: the math of several calls in a row
// through one message slot per pair (so every call but the first waits for its slot's
// release), on threads and shm; a wrong block size on one rank is an error on every rank,
// naming that rank; a config that differs between ranks and a call after destroy() fail
// in the base's words.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "epx/buffer_base.hpp"
#include "epx/spi/channel.hpp"
#include "epx/spi/cpu_relax.hpp"
#include "recipe_support.hpp"

namespace epx::testing {
namespace {

class ExchangeBuffer final : public BufferBase {
 public:
  /// Collective. `block_bytes`: every call's block; `slots`: messages a pair may have in flight.
  ExchangeBuffer(Transport& t, std::size_t block_bytes, int slots = 1)
      : BufferBase(t, "exchange"), bytes_(block_bytes), slots_(slots) {
    std::string problem;
    if (block_bytes == 0 || block_bytes % 8 != 0)
      problem = "exchange.create: block_bytes must be a positive multiple of 8, got " + std::to_string(block_bytes);
    if (slots < 1) problem = "exchange.create: slots must be at least 1, got " + std::to_string(slots);
    agree({{"block_bytes", std::to_string(block_bytes)}, {"slots", std::to_string(slots)}}, problem);
    allocate(static_cast<std::size_t>(num_ranks()) * static_cast<std::size_t>(slots_) * bytes_,
             spi::CreditChannels::num_signals(num_ranks()));
    channels_.emplace(endpoint("construct"), slots_, 0, spi::ranks_outnumber_cpus(num_ranks()), Protocol::kExplicit);
  }

  /// Collective: every rank's `mine` (`bytes` each) into `all`, by rank.
  void exchange(const void* mine, std::size_t bytes, void* all) {
    Transport& t = endpoint("exchange");
    std::optional<CallProblem> problem;
    if (bytes != bytes_)
      problem = CallProblem{ErrorCode::kInvalidArgument,
                            "block has " + std::to_string(bytes) + " bytes, the buffer was built for " + std::to_string(bytes_)};
    agree_call("exchange", problem);
    const int P = num_ranks(), me = rank();
    auto* out = static_cast<std::byte*>(all);
    std::memcpy(out + static_cast<std::size_t>(me) * bytes_, mine, bytes_);
    for (int k = 1; k < P; ++k) {  // rotated: rank r sends to r + 1 first, so no peer is everyone's first
      const int to = (me + k) % P;
      channels_->await_slot(to, "exchange slot");
      t.put(to, slot_offset(me, channels_->next_to(to)), mine, bytes_, 0);
      channels_->publish(to);
    }
    for (int k = 1; k < P; ++k) {
      const int from = (me + P - k) % P;
      channels_->await_message(from, "exchange block");
      std::memcpy(out + static_cast<std::size_t>(from) * bytes_, window() + slot_offset(from, channels_->next_from(from)), bytes_);
      channels_->take(from);
      channels_->release(from, channels_->next_from(from));
    }
  }

 private:
  // The layout: source j's message m at slot m % slots of j's inbox.
  std::size_t slot_offset(int source, std::uint64_t message) const noexcept {
    return (static_cast<std::size_t>(source) * static_cast<std::size_t>(slots_) + message % static_cast<std::uint64_t>(slots_)) * bytes_;
  }

  std::size_t bytes_;
  int slots_;
  std::optional<spi::CreditChannels> channels_;
};

constexpr std::size_t kFloats = 24;

float value(int rank, std::size_t i, int call) { return static_cast<float>(rank * 1000 + call * 100) + static_cast<float>(i) * 0.25f; }

class RecipeKind : public ::testing::TestWithParam<TransportKind> {};

TEST_P(RecipeKind, ExchangesEveryBlockCallAfterCall) {
  launch({kCaseRanks, GetParam(), std::chrono::milliseconds(20000)}, [](Transport& t) {
    ExchangeBuffer ex(t, kFloats * sizeof(float));
    for (int call = 0; call < 5; ++call) {
      std::vector<float> mine(kFloats), all(kFloats * kCaseRanks, -1.0f), want;
      for (std::size_t i = 0; i < kFloats; ++i) mine[i] = value(t.rank(), i, call);
      for (int r = 0; r < kCaseRanks; ++r)
        for (std::size_t i = 0; i < kFloats; ++i) want.push_back(value(r, i, call));
      ex.exchange(mine.data(), mine.size() * sizeof(float), all.data());
      expect_bits(t.rank(), "call " + std::to_string(call) + ": all", all.data(), want);
    }
    ex.destroy();
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, RecipeKind, ::testing::Values(TransportKind::kThreads, TransportKind::kShm),
                         [](const auto& info) { return info.param == TransportKind::kThreads ? "threads" : "shm"; });

TEST(RecipeKindErrors, WrongBlockOnOneRankFailsEveryRank) {
  expect_error_on_every_rank(
      [](Transport& t) {
        ExchangeBuffer ex(t, kFloats * sizeof(float));
        std::vector<float> mine(kFloats + (t.rank() == 2 ? 2 : 0)), all(kFloats * kCaseRanks);
        ex.exchange(mine.data(), mine.size() * sizeof(float), all.data());
      },
      ErrorCode::kInvalidArgument, "rank 2: exchange: block has 104 bytes, the buffer was built for 96");
}

TEST(RecipeKindErrors, ConfigThatDiffersFailsEveryRank) {
  expect_error_on_every_rank([](Transport& t) { ExchangeBuffer ex(t, t.rank() == 3 ? 64 : 96); }, ErrorCode::kInvalidArgument,
                             "rank 3: exchange config differs from rank 0's: block_bytes = 64 vs 96");
}

TEST(RecipeKindErrors, CallAfterDestroyIsRefused) {
  expect_error_on_every_rank(
      [](Transport& t) {
        ExchangeBuffer ex(t, 64);
        ex.destroy();
        std::vector<std::byte> block(64), all(64 * kCaseRanks);
        ex.exchange(block.data(), block.size(), all.data());
      },
      ErrorCode::kInvalidArgument, "exchange.exchange: the buffer was destroyed");
}

}  // namespace
}  // namespace epx::testing
