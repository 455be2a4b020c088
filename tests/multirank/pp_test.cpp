// PPBuffer across P ranks (docs/spec.md §9): seeded random programs of sends to random peers with at
// most the in-flight bound outstanding, every byte checked against the reference's message
// function (tests/reference/pp_engram.hpp), under every completion protocol a transport
// runs (PPConfig::protocol), also over puts that land late (deferred_put_transport.hpp);
// the errors of send and recv, and the protocols the support table refuses.
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "deferred_put_transport.hpp"
#include "pp_engram_checks.hpp"

namespace epx::testing {
namespace {

struct ProgramCase {
  TransportKind kind;
  const char* links;  // "all" | "ring" | "chain"
  int inflight;
  std::size_t chunk_bytes = 0;  // small chunks: messages of >= 4 chunks stream on mapped transports
  bool planned = false;         // receives into tensors planned in the buffer's window
  std::optional<Protocol> protocol{};  // PPConfig::protocol (unset: the table's pick)
  int deferred = 0;  // 0: the transport itself; 1, 2: under a DeferredPutTransport, its signals unordered / ordered
};

class PPRandom : public ::testing::TestWithParam<ProgramCase> {};

TEST_P(PPRandom, EveryByteOfEveryMessageInOrder) {
  const ProgramCase c = GetParam();
  const int P = 4;
  const std::string name = c.links;
  const auto links = name == "ring" ? pp_ring_links(P) : name == "chain" ? pp_chain_links(P, 2)
                                                                         : std::vector<std::pair<int, int>>{};
  const std::uint64_t max_bytes = 5000;
  for (std::uint64_t seed : {1u, 2u}) {
    const ref::PPProgram prog = ref::pp_random_program(P, c.inflight, max_bytes, 240, seed, both_ways(links));
    LaunchOptions lo;
    lo.num_ranks = P;
    lo.transport = c.kind;
    lo.timeout = std::chrono::milliseconds(20000);
    launch(lo, [&](Transport& world) {
      std::optional<DeferredPutTransport> deferred;
      if (c.deferred) deferred.emplace(world, c.deferred == 2, false);
      Transport& t = deferred ? static_cast<Transport&>(*deferred) : world;
      PPBuffer pp(t, {.num_max_tensor_bytes = max_bytes, .num_max_inflight_tensors = c.inflight, .links = links,
                      .chunk_bytes = c.chunk_bytes, .protocol = c.protocol},
                  c.planned ? pp_receive_plan(max_bytes) : BufferAllocator{});
      run_program(pp, prog, t.rank(), c.planned);
      for (int q = 0; q < P; ++q) {
        std::uint64_t sent = 0;
        for (const auto& e : prog.ranks[static_cast<std::size_t>(t.rank())]) sent += e.send && e.peer == q;
        if (pp.stats(q).sent != sent) fail(t.rank(), "stats(" + std::to_string(q) + ").sent is wrong");
      }
      pp.destroy();
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, PPRandom,
                         ::testing::Values(ProgramCase{TransportKind::kThreads, "all", 2},
                                           ProgramCase{TransportKind::kThreads, "ring", 1},
                                           ProgramCase{TransportKind::kShm, "all", 3},
                                           ProgramCase{TransportKind::kShm, "chain", 2},
                                           ProgramCase{TransportKind::kSim, "all", 2},
                                           ProgramCase{TransportKind::kSim, "ring", 3},
                                           ProgramCase{TransportKind::kThreads, "all", 2, 256},
                                           ProgramCase{TransportKind::kShm, "all", 1, 192},
                                           ProgramCase{TransportKind::kShm, "ring", 3, 256},
                                           ProgramCase{TransportKind::kSim, "all", 2, 256},
                                           ProgramCase{TransportKind::kThreads, "all", 2, 0, true},
                                           ProgramCase{TransportKind::kThreads, "ring", 1, 256, true},
                                           ProgramCase{TransportKind::kShm, "all", 3, 192, true},
                                           ProgramCase{TransportKind::kShm, "chain", 1, 0, true},
                                           ProgramCase{TransportKind::kSim, "all", 2, 256, true},
                                           // the completion protocols (PPConfig::protocol)
                                           ProgramCase{TransportKind::kThreads, "all", 2, 0, false, Protocol::kFlag},
                                           ProgramCase{TransportKind::kShm, "all", 3, 0, false, Protocol::kFlag},
                                           ProgramCase{TransportKind::kShm, "ring", 3, 256, false, Protocol::kFlag},
                                           ProgramCase{TransportKind::kThreads, "all", 2, 192, true, Protocol::kFlag},
                                           ProgramCase{TransportKind::kShm, "chain", 1, 0, true, Protocol::kFlag},
                                           ProgramCase{TransportKind::kThreads, "all", 2, 256, false, Protocol::kExplicit},
                                           ProgramCase{TransportKind::kSim, "all", 2, 0, false, Protocol::kExplicit},
                                           ProgramCase{TransportKind::kShm, "all", 1, 192, true, Protocol::kTail},
                                           // puts that land late: explicit (the pick without ordered signals), tail
                                           ProgramCase{TransportKind::kThreads, "all", 2, 0, false, std::nullopt, 1},
                                           ProgramCase{TransportKind::kThreads, "ring", 3, 0, false, Protocol::kExplicit, 2},
                                           ProgramCase{TransportKind::kThreads, "all", 2, 0, false, Protocol::kTail, 2}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.kind)) + "_" + info.param.links + "_" +
                                  std::to_string(info.param.inflight) +
                                  (info.param.chunk_bytes ? "_chunks" + std::to_string(info.param.chunk_bytes) : "") +
                                  (info.param.planned ? "_planned" : "") +
                                  (info.param.protocol ? std::string("_") + to_string(*info.param.protocol) : "") +
                                  (info.param.deferred ? (info.param.deferred == 2 ? "_deferred_ordered" : "_deferred") : "");
                         });

template <class F>
void expect_error(int r, ErrorCode code, const std::vector<std::string>& words, F&& call) {
  try {
    call();
  } catch (const Error& e) {
    if (e.code() != code) fail(r, std::string("error code ") + to_string(e.code()) + ", want " + to_string(code) + ": " + e.what());
    for (const auto& w : words)
      if (std::string(e.what()).find(w) == std::string::npos) fail(r, "the error does not say '" + w + "': " + e.what());
    return;
  }
  fail(r, "no error was raised");
}

TEST(PPErrors, ByteCountMismatchNamesBothCountsThePeerAndTheMessageWhichStays) {
  for (TransportKind kind : kDataTransports) {
    LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [](Transport& t) {
      PPBuffer pp(t, {.num_max_tensor_bytes = 256, .num_max_inflight_tensors = 2});
      const int r = t.rank();
      if (r == 0) {
        pp.send(bytes_view(ref::pp_message(0, 1, 0, 100)), 1);
        pp.send(bytes_view(ref::pp_message(0, 1, 1, 7)), 1);
      } else {
        std::vector<std::uint8_t> small(80);
        expect_error(r, ErrorCode::kShapeMismatch, {"rank 1", "rank 0", "message 0", "100 bytes", "has 80"},
                     [&] { pp.recv(bytes_out(small), 0); });
        std::vector<std::uint8_t> right(100);
        pp.recv(bytes_out(right), 0);  // the message stayed first
        expect_bits(r, "message 0 after the mismatch", right.data(), ref::pp_message(0, 1, 0, 100));
        PPView v = pp.recv_view(0);
        expect_bits(r, "message 1", v.data, ref::pp_message(0, 1, 1, 7));
        PPView copy = v;
        pp.release(v);
        expect_error(r, ErrorCode::kBadHandle, {"not a held view"}, [&] { pp.release(copy); });
      }
      pp.destroy();
    });
  }
}

TEST(PPErrors, OversizeAndBadPeersAreRefusedBeforeAnythingMoves) {
  LaunchOptions lo{.num_ranks = 3, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [](Transport& t) {
    PPBuffer pp(t, {.num_max_tensor_bytes = 64, .num_max_inflight_tensors = 1, .links = {{0, 1}}});
    const int r = t.rank();
    if (r == 0) {
      expect_error(r, ErrorCode::kCapacityExceeded, {"65 bytes", "at most 64", "nothing was sent"},
                   [&] { pp.send(bytes_view(std::vector<std::uint8_t>(65)), 1); });
      expect_error(r, ErrorCode::kInvalidArgument, {"rank 2", "not linked"},
                   [&] { pp.send(bytes_view(std::vector<std::uint8_t>(1)), 2); });
      expect_error(r, ErrorCode::kInvalidArgument, {"dst_rank 3", "outside 0..2"},
                   [&] { pp.send(bytes_view(std::vector<std::uint8_t>(1)), 3); });
      pp.send(bytes_view(ref::pp_message(0, 1, 0, 64)), 1);
    } else if (r == 1) {
      std::vector<std::uint8_t> got(64);
      pp.recv(bytes_out(got), 0);  // message 0 is the valid one: the refused sends moved nothing
      expect_bits(r, "message 0", got.data(), ref::pp_message(0, 1, 0, 64));
    } else {
      expect_error(r, ErrorCode::kInvalidArgument, {"not linked"}, [&] { pp.recv_view(0); });
    }
    pp.destroy();
  });
}

TEST(PPErrors, FullSlotsTimeOutNamingThePeerWhoseReceivesAreBehind) {
  for (TransportKind kind : kTransports) {
    LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(400)};
    launch(lo, [](Transport& t) {
      PPBuffer pp(t, {.num_max_tensor_bytes = 16, .num_max_inflight_tensors = 2});
      const std::vector<std::uint8_t> m(16, 7);
      if (t.rank() == 0) {
        pp.send(bytes_view(m), 1);
        pp.send(bytes_view(m), 1);
        if (pp.in_flight(1) != 2) fail(0, "in_flight(1) != 2");
        try {
          pp.send(bytes_view(m), 1);
          fail(0, "the third send did not time out");
        } catch (const Error& e) {
          const std::string w = e.what();
          if (e.code() != ErrorCode::kTimeout || e.origin_rank() != 1 || w.find("rank 1's receives are behind") == std::string::npos ||
              w.find("all 2 slots") == std::string::npos)
            fail(0, "unexpected error: " + w);
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(650));
        std::vector<std::uint8_t> got(16);
        pp.recv(bytes_out(got), 0);
        pp.recv(bytes_out(got), 0);
      }
      pp.destroy();
    });
  }
}

TEST(PPViews, ReleasedOutOfOrderTheSlotsFreeInOrder) {
  for (TransportKind kind : kDataTransports) {
    LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [](Transport& t) {
      PPBuffer pp(t, {.num_max_tensor_bytes = 32, .num_max_inflight_tensors = 3});
      const int r = t.rank();
      if (r == 0) {
        for (std::uint64_t n = 0; n < 6; ++n) pp.send(bytes_view(ref::pp_message(0, 1, n, 32)), 1);
      } else {
        std::vector<PPView> v;
        for (int k = 0; k < 3; ++k) v.push_back(pp.recv_view(0));
        expect_error(r, ErrorCode::kInvalidArgument, {"views not released", "messages 0..2"}, [&] { pp.recv_view(0); });
        pp.release(v[2]);
        pp.release(v[1]);
        expect_error(r, ErrorCode::kBadHandle, {"not a held view"}, [&] { pp.release(v[1]); });
        if (pp.stats(0).received != 3) fail(r, "stats(0).received != 3");
        std::vector<std::uint8_t> first(32);
        std::memcpy(first.data(), v[0].data, 32);
        pp.release(v[0]);  // now rank 0's sends 3..5 can go
        expect_bits(r, "message 0", first.data(), ref::pp_message(0, 1, 0, 32));
        for (std::uint64_t n = 3; n < 6; ++n) {
          std::vector<std::uint8_t> got(32);
          pp.recv(bytes_out(got), 0);
          expect_bits(r, "message " + std::to_string(n), got.data(), ref::pp_message(0, 1, n, 32));
        }
      }
      pp.destroy();
    });
  }
}

TEST(PPErrors, ConfigThatDiffersFailsEveryRankNamingIt) {
  LaunchOptions lo{.num_ranks = 3, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [](Transport& t) {
    const int r = t.rank();
    expect_error(r, ErrorCode::kInvalidArgument, {"rank 2", "num_max_inflight_tensors"}, [&] {
      PPBuffer pp(t, {.num_max_tensor_bytes = 32, .num_max_inflight_tensors = r == 2 ? 3 : 2});
    });
    expect_error(r, ErrorCode::kInvalidArgument, {"num_max_inflight_tensors = 0"},
                 [&] { PPBuffer pp(t, {.num_max_tensor_bytes = 32, .num_max_inflight_tensors = 0}); });
  });
}

// A protocol the transport cannot run is refused on every rank at construction, naming the
// kind, the protocol and the guarantee it lacks (epx/spi/kind_support.hpp); a protocol that
// differs between ranks is a config difference.
TEST(PPErrors, AProtocolTheTransportCannotRunIsRefusedNamingWhy) {
  LaunchOptions lo{.num_ranks = 2, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [](Transport& world) {
    const int r = world.rank();
    DeferredPutTransport unordered(world, false, true);
    expect_error(r, ErrorCode::kUnsupported, {"rank " + std::to_string(r), "pp (slots)", "'tail'", "ordered", "deferred"}, [&] {
      PPBuffer pp(unordered, {.num_max_tensor_bytes = 64, .num_max_inflight_tensors = 1, .links = {}, .chunk_bytes = 0, .protocol = Protocol::kTail});
    });
    expect_error(r, ErrorCode::kUnsupported, {"pp (slots)", "'flag'", "mapped", "deferred"}, [&] {
      PPBuffer pp(unordered, {.num_max_tensor_bytes = 64, .num_max_inflight_tensors = 1, .links = {}, .chunk_bytes = 0, .protocol = Protocol::kFlag});
    });
    expect_error(r, ErrorCode::kInvalidArgument, {"rank 1", "protocol", "flag vs tail"}, [&] {
      PPBuffer pp(world, {.num_max_tensor_bytes = 64, .num_max_inflight_tensors = 1, .links = {}, .chunk_bytes = 0, .protocol = r == 1 ? Protocol::kFlag : Protocol::kTail});
    });
  });
  LaunchOptions sim{.num_ranks = 2, .transport = TransportKind::kSim, .timeout = std::chrono::milliseconds(20000)};
  launch(sim, [](Transport& t) {  // the simulator states mapped caps but lends no peer window
    expect_error(t.rank(), ErrorCode::kUnsupported, {"pp.create", "'flag'", "mapped"},
                 [&] { PPBuffer pp(t, {.num_max_tensor_bytes = 64, .num_max_inflight_tensors = 1, .links = {}, .chunk_bytes = 0, .protocol = Protocol::kFlag}); });
  });
}

TEST(PPErrors, AWindowTooBigForMemorySuggestsLinks) {
  LaunchOptions lo{.num_ranks = 2, .transport = TransportKind::kThreads, .timeout = std::chrono::milliseconds(20000)};
  launch(lo, [](Transport& t) {
    expect_error(t.rank(), ErrorCode::kCapacityExceeded, {"PPConfig::links"}, [&] {
      PPBuffer pp(t, {.num_max_tensor_bytes = std::size_t{1} << 46, .num_max_inflight_tensors = 64});
    });
  });
}

// PP and Engram buffers on the ranks of an EP buffer, used in turns and destroyed out of
// order: none touches the others' memory or signals.
TEST(PPEngramNextToOtherBuffers, EveryBufferStaysCorrect) {
  for (TransportKind kind : kDataTransports) {
    const int P = 4;
    const EPCheck check(P);
    const EngramConfig ec = engram_config(DType::kBF16);
    const auto prog = ref::pp_random_program(P, 2, 3000, 120, 9);
    LaunchOptions lo{.num_ranks = P, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      const int r = t.rank();
      Buffer ep(t, config_for(check.p));
      PPBuffer pp(t, {.num_max_tensor_bytes = 3000, .num_max_inflight_tensors = 2});
      const EngramSizes z = EngramBuffer::get_storage_size_hint(P, ec);
      EngramBuffer engram(t, z.num_bytes, z.num_storage_bytes);
      engram.set_config(ec);
      write_engram_shards(engram, ec, r);
      check.run(ep, r);
      run_program(pp, prog, r);
      fetch_and_check(engram, ec, P, r, 17, 1, false);
      check.run(ep, r);
      pp.destroy();  // the others go on
      fetch_and_check(engram, ec, P, r, 20, 2, true);
      check.run(ep, r);
      engram.destroy();
    });
  }
}

// A receive waiting before its message is sent takes it through the ring from the first
// chunk (stats().streamed); a waiting receive of another byte count is not taken (the sender
// puts every byte into the slot, the receive fails, the message stays); a receive that timed
// out is withdrawn and the message then comes through the slot.
TEST(PPStream, WaitingReceivesTakeTheRingOthersTheSlot) {
  const std::size_t N = 4000;  // 63 chunks of 64 bytes: the ring wraps many times
  const PPConfig config{.num_max_tensor_bytes = N, .num_max_inflight_tensors = 1, .chunk_bytes = 64};
  auto settle = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  for (TransportKind kind : {TransportKind::kThreads, TransportKind::kShm}) {
    LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      PPBuffer pp(t, config);
      const int r = t.rank();
      if (r == 0) {
        settle(300);  // rank 1 waits in recv: the send claims its post at chunk 0
        pp.send(bytes_view(ref::pp_message(0, 1, 0, N)), 1);
        if (pp.stats(1).streamed != 1) fail(r, "message 0 did not stream");
        settle(300);  // rank 1 waits with a tensor of N - 1 bytes: no claim
        pp.send(bytes_view(ref::pp_message(0, 1, 1, N)), 1);
        if (pp.stats(1).streamed != 1) fail(r, "message 1 streamed into a receive of another size");
      } else {
        std::vector<std::uint8_t> got(N, 0xee), small(N - 1);
        pp.recv(bytes_out(got), 0);
        expect_bits(r, "message 0", got.data(), ref::pp_message(0, 1, 0, N));
        expect_error(r, ErrorCode::kShapeMismatch, {"message 1", "4000 bytes"}, [&] { pp.recv(bytes_out(small), 0); });
        pp.recv(bytes_out(got), 0);
        expect_bits(r, "message 1", got.data(), ref::pp_message(0, 1, 1, N));
      }
      pp.destroy();
    });
    lo.timeout = std::chrono::milliseconds(300);
    launch(lo, [&](Transport& t) {
      PPBuffer pp(t, config);
      const int r = t.rank();
      std::vector<std::uint8_t> got(N, 0xee), none;
      if (r == 0) {
        settle(250);
        pp.recv(bytes_out(none), 1);  // after rank 1's receive timed out
        pp.send(bytes_view(ref::pp_message(0, 1, 0, N)), 1);
        if (pp.stats(1).streamed != 0) fail(r, "message 0 streamed into a withdrawn receive");
      } else {
        expect_error(r, ErrorCode::kTimeout, {"message 0", "did not arrive"}, [&] { pp.recv(bytes_out(got), 0); });
        pp.send(bytes_view(none), 0);
        pp.recv(bytes_out(got), 0);
        expect_bits(r, "message 0", got.data(), ref::pp_message(0, 1, 0, N));
      }
      pp.destroy();
    });
  }
}

// A receive that comes while its message is being put into the slot joins it: the chunks
// from then on go through the ring (any chunk may be the first; every byte is checked).
TEST(PPStream, AReceiveThatComesDuringTheSendJoinsIt) {
  const std::size_t N = std::size_t{4} << 20;
  for (TransportKind kind : {TransportKind::kThreads, TransportKind::kShm}) {
    LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      PPBuffer pp(t, {.num_max_tensor_bytes = N, .num_max_inflight_tensors = 2, .chunk_bytes = 64});
      std::vector<std::uint8_t> got(N);
      for (std::uint64_t n = 0; n < 6; ++n) {
        if (t.rank() == 0) {
          pp.send(bytes_view(ref::pp_message(0, 1, n, N)), 1);
          continue;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100 << n));
        pp.recv(bytes_out(got), 0);
        expect_bits(1, "message " + std::to_string(n), got.data(), ref::pp_message(0, 1, n, N));
      }
      pp.destroy();
    });
  }
}

// A receive into a planned tensor that waits before its message is sent gets the bytes
// straight from the sender (stats().direct), small (one plain copy) or streamed (from chunk
// 0, or from the chunk the sender was at when it saw the post); a planned receive of another
// byte count is not claimed (the message stays, docs/spec.md §9); the bytes around the tensor's span
// stay as they were.
TEST(PPPlanned, AWaitingPlannedReceiveIsWrittenByTheSender) {
  const std::size_t N = 4000;  // 63 chunks of 64 bytes
  auto settle = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  for (TransportKind kind : {TransportKind::kThreads, TransportKind::kShm}) {
    for (std::size_t chunk : {std::size_t{0}, std::size_t{64}}) {  // 0: 4000 bytes is small; 64: it streams
      LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
      launch(lo, [&](Transport& t) {
        BufferAllocator plan;
        plan.allocate("x", {static_cast<std::int64_t>(N + 64)}, DType::kFP8E4M3);
        PPBuffer pp(t, {.num_max_tensor_bytes = N, .num_max_inflight_tensors = 2, .chunk_bytes = chunk}, plan);
        const int r = t.rank();
        if (r == 0) {
          settle(300);  // rank 1 waits in recv into its planned tensor
          pp.send(bytes_view(ref::pp_message(0, 1, 0, N)), 1);
          if (pp.stats(1).direct != 1) fail(r, "message 0 was not written into the planned tensor");
          settle(300);  // rank 1 waits with a planned tensor of N - 1 bytes: no claim
          pp.send(bytes_view(ref::pp_message(0, 1, 1, N)), 1);
          if (pp.stats(1).direct != 1) fail(r, "message 1 was written into a planned receive of another size");
          pp.send(bytes_view(ref::pp_message(0, 1, 2, N)), 1);  // rank 1 is not waiting yet: the slot
          if (pp.stats(1).direct != 1) fail(r, "message 2 was written into a receive not posted");
        } else {
          auto* x = static_cast<std::uint8_t*>(pp.tensor("x").data);
          std::memset(x, 0xee, N + 64);
          auto at = [&](std::size_t off, std::size_t n) { return MutableView{x + off, DType::kFP8E4M3, {static_cast<std::int64_t>(n)}}; };
          pp.recv(at(32, N), 0);
          expect_bits(r, "message 0", x + 32, ref::pp_message(0, 1, 0, N));
          for (std::size_t i : {std::size_t{0}, std::size_t{31}, N + 32, N + 63})
            if (x[i] != 0xee) fail(r, "byte " + std::to_string(i) + " outside the received span was written");
          expect_error(r, ErrorCode::kShapeMismatch, {"rank 1", "rank 0", "message 1", "4000 bytes", "has 3999"},
                       [&] { pp.recv(at(0, N - 1), 0); });
          pp.recv(at(1, N), 0);  // the message stayed first
          expect_bits(r, "message 1", x + 1, ref::pp_message(0, 1, 1, N));
          settle(200);  // message 2 is in its slot: copied from there
          pp.recv(at(0, N), 0);
          expect_bits(r, "message 2", x, ref::pp_message(0, 1, 2, N));
          if (pp.stats(0).received != 3) fail(r, "stats(0).received != 3");
        }
        pp.destroy();
      });
    }
  }
}

// A planned receive that comes while a large message is being put into the slot joins it:
// the sender writes the rest into the tensor, the receiver copies the chunks before.
TEST(PPPlanned, AReceiveThatComesDuringTheSendJoinsIt) {
  const std::size_t N = std::size_t{4} << 20;
  for (TransportKind kind : {TransportKind::kThreads, TransportKind::kShm}) {
    LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [&](Transport& t) {
      BufferAllocator plan;
      plan.allocate("x", {static_cast<std::int64_t>(N)}, DType::kFP8E4M3);
      PPBuffer pp(t, {.num_max_tensor_bytes = N, .num_max_inflight_tensors = 2, .chunk_bytes = 64}, plan);
      const MutableView x = pp.tensor("x");
      for (std::uint64_t n = 0; n < 6; ++n) {
        if (t.rank() == 0) {
          pp.send(bytes_view(ref::pp_message(0, 1, n, N)), 1);
          continue;
        }
        std::memset(x.data, 0, N);
        std::this_thread::sleep_for(std::chrono::microseconds(100 << n));
        pp.recv(x, 0);
        expect_bits(1, "message " + std::to_string(n), x.data, ref::pp_message(0, 1, n, N));
      }
      pp.destroy();
    });
  }
}

// The planned tensors: a name not planned names the plan's; a receive tensor that starts in
// the planned region and ends past it is refused naming rank and peer (nothing moves: the
// message then arrives whole); plans that differ fail every rank; the window grows by the plan.
TEST(PPPlanned, ErrorsNameRankPeerAndPlan) {
  for (TransportKind kind : kDataTransports) {
    LaunchOptions lo{.num_ranks = 2, .transport = kind, .timeout = std::chrono::milliseconds(20000)};
    launch(lo, [](Transport& t) {
      BufferAllocator plan;
      plan.allocate("act", {100}, DType::kBF16);
      const PPConfig config{.num_max_tensor_bytes = 256, .num_max_inflight_tensors = 1};
      PPBuffer pp(t, config, plan);
      const int r = t.rank();
      if (PPBuffer::get_buffer_size_hint(2, config, plan) < PPBuffer::get_buffer_size_hint(2, config) + kBufferAlignment)
        fail(r, "the size hint does not count the plan");
      expect_error(r, ErrorCode::kInvalidArgument, {"rank " + std::to_string(r), "pp.tensor", "'grads'", "act"},
                   [&] { pp.tensor("grads"); });
      if (r == 0) {
        pp.send(bytes_view(ref::pp_message(0, 1, 0, 200)), 1);
      } else {
        const MutableView act = pp.tensor("act");
        if (act.nbytes() != 200 || pp.storage() == nullptr || act.data != pp.storage())
          fail(r, "tensor('act') is not the start of the planned storage");
        auto* end = pp.storage() + pp.storage_bytes();
        expect_error(r, ErrorCode::kInvalidArgument, {"rank 1", "rank 0", "ends past", "nothing was received"},
                     [&] { pp.recv(MutableView{end - 100, DType::kFP8E4M3, {200}}, 0); });
        pp.recv(act, 0);
        expect_bits(r, "message 0", act.data, ref::pp_message(0, 1, 0, 200));
      }
      pp.destroy();
    });
    launch(lo, [](Transport& t) {
      BufferAllocator plan;
      plan.allocate("act", {t.rank() == 0 ? 100 : 101}, DType::kBF16);
      expect_error(t.rank(), ErrorCode::kInvalidArgument, {"plan entry 0"},
                   [&] { PPBuffer pp(t, {.num_max_tensor_bytes = 256, .num_max_inflight_tensors = 1}, plan); });
    });
  }
}

}  // namespace
}  // namespace epx::testing
