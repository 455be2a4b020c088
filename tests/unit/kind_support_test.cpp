// The buffer kinds' support table (epx/spi/kind_support.hpp) walked row by row: every
// (kind, variant) states each protocol once; a row's refusal over a set of transport
// guarantees follows from its `supported` and `needs` alone and names the kind, the variant,
// the protocol and the reason; the pick is tail where signals are ordered, else explicit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "epx/spi/kind_support.hpp"

namespace epx::spi {
namespace {

bool has(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

/// Transports' guarantees as the real ones state them: shm/threads, OpenSHMEM across machines
/// (ordered signals, gets, not mapped), a NIC with neither ordered signals nor mapping.
std::map<std::string, TransportCaps> caps_set() {
  TransportCaps mapped;
  mapped.name = "mapped";
  mapped.peer_memory_mapped = mapped.ordered_signal_per_queue = mapped.put_completes_on_return = true;
  mapped.flagged_puts = mapped.one_sided_get = true;
  TransportCaps shmem;
  shmem.name = "shmem";
  shmem.ordered_signal_per_queue = shmem.flagged_puts = shmem.one_sided_get = true;
  TransportCaps nic;
  nic.name = "nic";
  return {{"mapped", mapped}, {"shmem", shmem}, {"nic", nic}};
}

TEST(KindSupport, EveryVariantStatesEveryProtocolOnce) {
  std::map<std::pair<int, std::string>, std::set<int>> seen;
  for (const KindRule& r : kKindRules) {
    EXPECT_STREQ(r.kind_name, kind_name(r.kind));
    const std::pair<int, std::string> key{static_cast<int>(r.kind), r.variant};
    EXPECT_TRUE(seen[key].insert(static_cast<int>(r.protocol)).second)
        << r.kind_name << " " << r.variant << " " << to_string(r.protocol) << " twice";
    EXPECT_NE(std::string(r.why), "") << r.kind_name << " " << r.variant << " " << to_string(r.protocol);
    if (r.needs != nullptr) {
      EXPECT_NE(std::string(r.needs_text), "");
    }
    EXPECT_EQ(kind_rule(r.kind, r.variant, r.protocol), &r);
  }
  for (const auto& [key, protocols] : seen) EXPECT_EQ(protocols.size(), 3u) << key.second;
  // The kinds' variants (docs/buffers.md, "Completion protocols").
  const std::set<std::pair<int, std::string>> want = {
      {static_cast<int>(Kind::kBucket), "channels"}, {static_cast<int>(Kind::kBucket), "board"},
      {static_cast<int>(Kind::kPP), "slots"},        {static_cast<int>(Kind::kPP), "stream"},
      {static_cast<int>(Kind::kEngram), "mapped"},   {static_cast<int>(Kind::kEngram), "get"},
      {static_cast<int>(Kind::kEngram), "served"}};
  std::set<std::pair<int, std::string>> got;
  for (const auto& [key, p] : seen) got.insert(key);
  EXPECT_EQ(got, want);
}

TEST(KindSupport, RefusalFollowsTheRowAndNamesKindVariantProtocolAndWhy) {
  for (const auto& [name, caps] : caps_set()) {
    for (const KindRule& r : kKindRules) {
      const std::string why = refuse_protocol(r.kind, r.variant, r.protocol, caps);
      const bool runs = r.supported && (r.needs == nullptr || caps.*r.needs);
      EXPECT_EQ(why.empty(), runs) << name << ": " << r.kind_name << " " << r.variant << " " << to_string(r.protocol) << ": " << why;
      if (runs) continue;
      EXPECT_TRUE(has(why, r.kind_name)) << why;
      EXPECT_TRUE(has(why, r.variant)) << why;
      EXPECT_TRUE(has(why, std::string("'") + to_string(r.protocol) + "'")) << why;
      if (!r.supported) {
        EXPECT_TRUE(has(why, r.why)) << why;
      } else {
        EXPECT_TRUE(has(why, r.needs_text) && has(why, caps.name)) << why;
      }
    }
  }
  EXPECT_TRUE(has(refuse_protocol(Kind::kPP, "no such variant", Protocol::kTail, caps_set()["mapped"]), "not in the support table"));
}

TEST(KindSupport, WhatTheKindsGetOnEachTransport) {
  auto caps = caps_set();
  // Shared memory: everything the kinds implement.
  for (Protocol p : {Protocol::kExplicit, Protocol::kTail, Protocol::kFlag}) {
    EXPECT_EQ(refuse_protocol(Kind::kPP, "slots", p, caps["mapped"]), "");
    EXPECT_EQ(refuse_protocol(Kind::kBucket, "board", p, caps["mapped"]), "");
  }
  // The bucket's channels never take flag (the boards do); PP's flag needs mapped peers.
  EXPECT_NE(refuse_protocol(Kind::kBucket, "channels", Protocol::kFlag, caps["mapped"]), "");
  EXPECT_TRUE(has(refuse_protocol(Kind::kPP, "slots", Protocol::kFlag, caps["shmem"]), "mapped"));
  // A NIC without ordered signals: explicit only.
  EXPECT_TRUE(has(refuse_protocol(Kind::kPP, "slots", Protocol::kTail, caps["nic"]), "ordered"));
  EXPECT_EQ(refuse_protocol(Kind::kPP, "slots", Protocol::kExplicit, caps["nic"]), "");
  EXPECT_EQ(refuse_protocol(Kind::kBucket, "channels", Protocol::kExplicit, caps["nic"]), "");
  // The pick: tail where signals are ordered, else explicit; none where nothing travels.
  EXPECT_EQ(pick(Kind::kPP, "slots", caps["mapped"]), Protocol::kTail);
  EXPECT_EQ(pick(Kind::kPP, "slots", caps["nic"]), Protocol::kExplicit);
  EXPECT_EQ(pick(Kind::kBucket, "channels", caps["shmem"]), Protocol::kTail);
  EXPECT_EQ(pick(Kind::kBucket, "channels", caps["nic"]), Protocol::kExplicit);
  EXPECT_EQ(pick(Kind::kEngram, "served", caps["shmem"]), Protocol::kTail);
  EXPECT_EQ(pick(Kind::kEngram, "served", caps["nic"]), Protocol::kExplicit);
  EXPECT_EQ(pick(Kind::kEngram, "get", caps["shmem"]), Protocol::kExplicit);
  EXPECT_EQ(pick(Kind::kEngram, "mapped", caps["mapped"]), std::nullopt);
}

TEST(KindSupport, AskedProtocolIsTheConfigsElseTheEnvironmentsNamedWhenBad) {
  const char* var = "EPX_KIND_SUPPORT_TEST_PROTOCOL";
  ::unsetenv(var);
  EXPECT_EQ(asked_protocol(std::nullopt, var), std::nullopt);
  ::setenv(var, "flag", 1);
  EXPECT_EQ(asked_protocol(std::nullopt, var), Protocol::kFlag);
  EXPECT_EQ(asked_protocol(Protocol::kExplicit, var), Protocol::kExplicit);
  ::setenv(var, "fast", 1);
  try {
    asked_protocol(std::nullopt, var);
    ADD_FAILURE() << "a bad value was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(has(e.what(), var) && has(e.what(), "fast")) << e.what();
  }
  ::unsetenv(var);
}

}  // namespace
}  // namespace epx::spi
