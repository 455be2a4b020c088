// The engine's one owner of window geometry (src/ep/geometry.hpp), tested alone: no two
// regions overlap and every one fits the window; signal-slot groups are disjoint and fill
// exactly num_signals(); rows go where the plan says on both sides (a sender's row for d
// is the receiver's row of that source, direct and rows first); ring and reply-ring rows
// stay inside their region; output blocks lie in the output pool, their scales after their rows.
#include "geometry.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

namespace epx::detail {
namespace {

struct Span {
  const char* name;
  std::size_t begin, end;
};

GeometryShape shape(int P, int W, Protocol protocol, bool hierarchical, std::int64_t ring_rows, std::int64_t recv_rows = 0) {
  BufferConfig c;
  c.num_experts = 4 * P;
  c.hidden = 256;
  c.num_topk = 4;
  c.max_tokens_per_rank = 37;
  c.max_recv_rows = recv_rows;
  c.ring_rows = ring_rows;
  c.dataplane.protocol = protocol;
  if (hierarchical) c.dataplane.schedule.kind = ScheduleKind::kHierarchical;
  const int lanes = hierarchical && P % 2 == 0 ? 2 : 1;
  return GeometryShape::of(c, P, W, hierarchical ? P / lanes : 1, lanes);
}

// Every region of the window as [begin, end), sized from the shape.
std::vector<Span> regions(const Geometry& g) {
  const GeometryShape& s = g.shape();
  const std::size_t H = static_cast<std::size_t>(s.hidden), P = static_cast<std::size_t>(s.num_ranks);
  const std::size_t row = 2 * H, scale = H / 128 * sizeof(float);
  const auto recv = static_cast<std::size_t>(g.recv_rows()), reply = static_cast<std::size_t>(g.reply_rows());
  const auto relay = static_cast<std::size_t>(g.relay_rows());
  const std::size_t data_rows = s.ring_rows > 0 ? P * static_cast<std::size_t>(s.ring_rows) : recv;
  std::vector<Span> v = {
      {"headers", g.header(0, 0), g.header(1, s.num_ranks - 1) + g.header_bytes()},
      {"meta", g.region(Region::kMeta), g.region(Region::kMeta) + recv * g.meta_bytes()},
      {"relay records", g.region(Region::kRelayRecord), g.region(Region::kRelayRecord) + relay * g.relay_record_bytes()},
      {"data", g.region(Region::kData), g.region(Region::kData) + data_rows * row},
      {"replies", g.region(Region::kReplies), g.region(Region::kReplies) + reply * row},
      {"scales", g.region(Region::kScales), g.region(Region::kScales) + recv * scale},
      {"relay", g.region(Region::kRelay), g.region(Region::kRelay) + relay * row},
      {"relay scales", g.region(Region::kRelayScales), g.region(Region::kRelayScales) + relay * scale},
      {"relay replies", g.region(Region::kRelayReplies),
       g.region(Region::kRelayReplies) + relay * static_cast<std::size_t>(s.lanes) * row},
      {"outputs", g.region(Region::kOutputs), g.region(Region::kOutputs) + g.output_pool_bytes()},
  };
  if (s.flag_protocol) {
    const std::size_t rec = kFlagBlock * (flag_blocks(row) + flag_blocks(scale));
    v.push_back({"flag meta", g.flag_block(Region::kMeta, 0),
                 g.flag_block(Region::kMeta, 0) + recv * kFlagBlock * flag_blocks(g.meta_bytes())});
    v.push_back({"flag rows", g.flag_block(Region::kData, 0), g.flag_block(Region::kData, 0) + recv * rec});
    v.push_back({"flag replies", g.flag_block(Region::kReplies, 0),
                 g.flag_block(Region::kReplies, 0) + reply * kFlagBlock * flag_blocks(row)});
  }
  return v;
}

class GeometryTest : public ::testing::TestWithParam<std::tuple<int, int, Protocol, bool, std::int64_t>> {};

TEST_P(GeometryTest, RegionsAreDisjointAndInsideTheWindow) {
  const auto [P, W, protocol, hier, ring] = GetParam();
  const Geometry g(shape(P, W, protocol, hier, ring));
  std::vector<Span> v = regions(g);
  v.erase(std::remove_if(v.begin(), v.end(), [](const Span& s) { return s.end == s.begin; }), v.end());
  std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_LE(v[i].end, g.total_bytes()) << v[i].name;
    if (i > 0) {
      EXPECT_LE(v[i - 1].end, v[i].begin) << v[i - 1].name << " overlaps " << v[i].name;
    }
  }
  // Control below payload_begin, rows from there on (the model interface's payload region).
  for (const Span& s : v) {
    const std::string n = s.name;
    const bool control = n == "headers" || n == "meta" || n == "relay records" || n == "flag meta";
    if (control) {
      EXPECT_LE(s.end, g.payload_begin()) << n;
    } else {
      EXPECT_GE(s.begin, g.payload_begin()) << n;
    }
  }
  // Flag blocks of consecutive rows do not share bytes; a row's scale blocks follow its data blocks.
  if (protocol == Protocol::kFlag) {
    EXPECT_EQ(g.flag_block(Region::kScales, 0), g.flag_block(Region::kData, 0) + flag_blocks(512) * kFlagBlock);
    EXPECT_GT(g.flag_block(Region::kData, 1), g.flag_block(Region::kScales, 0));
  }
}

TEST_P(GeometryTest, SignalGroupsAreDisjointAndCountedOnce) {
  const auto [P, W, protocol, hier, ring] = GetParam();
  const Geometry g(shape(P, W, protocol, hier, ring));
  std::set<std::size_t> seen;
  auto add = [&](std::size_t slot, const char* what) {
    EXPECT_LT(slot, g.num_signals()) << what;
    EXPECT_TRUE(seen.insert(slot).second) << what << " slot " << slot << " used twice";
  };
  for (int s = 0; s < P; ++s) {
    add(g.header_signal(s), "header");
    for (int w = 0; w < W; ++w)
      add(g.dispatch_signal(s, w), "dispatch"), add(g.combine_signal(s, w), "combine"), add(g.relay_chunk_signal(s, w), "relay chunk");
    add(g.forward_signal(s), "forward");
    add(g.ring_tail_signal(s), "ring tail");
    add(g.ring_credit_signal(s), "ring credit");
    add(g.pull_done_signal(s), "pull done");
  }
  const std::size_t stride = protocol == Protocol::kTail ? 64 : 1;
  // Completion slots of the tail protocol sit a 512-byte line apart; headers are dense.
  EXPECT_EQ(g.num_signals(), static_cast<std::size_t>(P) * (1 + (3 * static_cast<std::size_t>(W) + 4) * stride));
  if (stride > 1 && W > 1) {
    EXPECT_EQ(g.dispatch_signal(0, 1) - g.dispatch_signal(0, 0), stride);
  }
}

TEST_P(GeometryTest, RingRowsStayInTheirRegion) {
  const auto [P, W, protocol, hier, ring] = GetParam();
  const Geometry g(shape(P, W, protocol, hier, ring));
  if (ring == 0) {  // unbounded: a reply row per (token, destination) of a source, a receive row per possible row
    EXPECT_EQ(g.reply_rows(), g.shape().max_tokens * std::min(g.shape().num_topk, P));
    EXPECT_EQ(g.recv_rows(), P * g.shape().max_tokens);
    return;
  }
  std::set<std::int64_t> rows;
  for (int s = 0; s < P; ++s)
    for (std::int64_t i = 0; i < 3 * ring; ++i) {
      const std::int64_t r = g.ring_row(s, i);
      EXPECT_GE(r, s * ring);
      EXPECT_LT(r, (s + 1) * ring);
      if (i < ring) {
        EXPECT_TRUE(rows.insert(r).second);
      }
    }
  EXPECT_EQ(rows.size(), static_cast<std::size_t>(P * ring));
  std::set<std::int64_t> reply;
  for (std::int64_t round = 0; round < 2; ++round)
    for (int d = 0; d < P; ++d)
      for (std::int64_t t = 0; t < g.reply_round_tokens(); ++t) {
        const std::int64_t r = g.reply_ring_row(round, d) + t;
        EXPECT_LT(r, g.reply_rows());
        EXPECT_TRUE(reply.insert(r).second) << "round " << round << " rank " << d;
        EXPECT_EQ(g.reply_ring_row(round + 2, d), g.reply_ring_row(round, d));  // halves alternate
      }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GeometryTest,
                         ::testing::Combine(::testing::Values(1, 4, 8), ::testing::Values(1, 3),
                                            ::testing::Values(Protocol::kExplicit, Protocol::kTail, Protocol::kFlag),
                                            ::testing::Values(false, true), ::testing::Values(std::int64_t{0}, std::int64_t{6})));

// A plan of 3 ranks written by hand: the sender's row for d (its planned slot, or rows first
// its stretch) is the row the receiver reads for that source; replies come back to the
// position the source's reduce reads.
TEST(Geometry, SendAndReceiveSidesAgree) {
  const int P = 3;
  const Geometry g(shape(P, 1, Protocol::kExplicit, false, 0));
  ASSERT_TRUE(g.has_stretches());
  // tokens[s][d]: rows source s sends to d.
  const std::int64_t tokens[P][P] = {{2, 0, 5}, {1, 4, 0}, {3, 3, 3}};
  std::vector<HandleState> h(P);
  for (int me = 0; me < P; ++me) {
    HandleState& x = h[static_cast<std::size_t>(me)];
    x.rank = me;
    x.send_base.assign(P, 0);
    x.reply_base.assign(P, 0);
    x.recv_begin.assign(P + 1, 0);
    x.plan.segment_begin.assign(P + 1, 0);
    for (int d = 0; d < P; ++d) {
      for (int s = 0; s < me; ++s) x.send_base[static_cast<std::size_t>(d)] += tokens[s][d];
      x.plan.segment_begin[static_cast<std::size_t>(d) + 1] = x.plan.segment_begin[static_cast<std::size_t>(d)] + static_cast<std::int32_t>(tokens[me][d]);
    }
    for (int s = 0; s < P; ++s) {
      for (int d = 0; d < me; ++d) x.reply_base[static_cast<std::size_t>(s)] += tokens[s][d];
      x.recv_begin[static_cast<std::size_t>(s) + 1] = x.recv_begin[static_cast<std::size_t>(s)] + tokens[s][me];
    }
  }
  for (bool rows_first : {false, true}) {
    for (int d = 0; d < P; ++d) {
      std::set<std::int64_t> used;
      for (int s = 0; s < P; ++s)
        for (std::int64_t p = 0; p < tokens[s][d]; ++p) {
          const HandleState& sender = h[static_cast<std::size_t>(s)];
          const HandleState& receiver = h[static_cast<std::size_t>(d)];
          const std::int64_t r = receiver.recv_begin[static_cast<std::size_t>(s)] + p;  // received row (compact order)
          const std::int64_t at = g.send_row(sender, d, p, rows_first);
          EXPECT_EQ(at, g.recv_row(receiver, s, r, rows_first)) << "s " << s << " d " << d << " p " << p;
          EXPECT_TRUE(used.insert(at).second);
          EXPECT_LT(at, g.recv_rows());
          // Its reply goes back to the row the source's reduce reads for (d, p).
          EXPECT_EQ(g.reply_row(receiver, s, r), g.replied_row(sender, d, p));
        }
    }
  }
}

}  // namespace
}  // namespace epx::detail

namespace epx::detail {
namespace {

// The output pool: auto = one output of the largest size (bf16 rows, or FP8 rows + scales);
// a block's rows and scales stay inside the block, which Geometry sizes in whole pages.
TEST(GeometryOutputs, BlocksFitThePoolAndKeepScalesAfterRows) {
  for (const int hidden : {256, 7168}) {
    BufferConfig c;
    c.num_experts = 16;
    c.hidden = hidden;
    c.num_topk = 4;
    c.max_tokens_per_rank = 37;
    const Geometry g(GeometryShape::of(c, 4, 1, 1, 1));
    const std::int64_t rows = g.recv_rows();
    const auto H = static_cast<std::size_t>(hidden), scale = H / 128 * sizeof(float);
    EXPECT_EQ(g.output_pool_bytes(), std::max(Geometry::output_block_bytes(rows, 2 * H, 0), Geometry::output_block_bytes(rows, H, scale)));
    EXPECT_EQ(g.output_pool_bytes() % 4096, 0u);
    for (const auto& [row, sc] : {std::pair{2 * H, std::size_t{0}}, std::pair{H, scale}}) {
      for (const std::int64_t n : {std::int64_t{1}, rows / 3, rows}) {
        const std::size_t bytes = Geometry::output_block_bytes(n, row, sc);
        EXPECT_EQ(bytes % 4096, 0u);
        const Landing l = g.output_block(g.output_pool_bytes() - bytes, n, row);  // the pool's last block
        EXPECT_TRUE(l.block);
        EXPECT_EQ(l.data, g.region(Region::kOutputs) + g.output_pool_bytes() - bytes);
        EXPECT_GE(l.scales, Geometry::landed_row(l, Region::kData, n, row));  // scales after the rows
        EXPECT_EQ(l.scales % 64, 0u);
        EXPECT_LE(Geometry::landed_row(l, Region::kScales, n, sc), l.data + bytes);
        EXPECT_EQ(Geometry::landed_row(l, Region::kData, 2, row), l.data + 2 * row);
      }
    }
    const Landing area = g.receive_area();
    EXPECT_FALSE(area.block);
    EXPECT_EQ(Geometry::landed_row(area, Region::kData, 5, 2 * H), g.row(Region::kData, 5, 2 * H));
    EXPECT_EQ(Geometry::landed_row(area, Region::kScales, 5, scale), g.row(Region::kScales, 5, scale));
    c.output_pool_bytes = 0;
    EXPECT_EQ(Geometry(GeometryShape::of(c, 4, 1, 1, 1)).output_pool_bytes(), 0u);
    c.output_pool_bytes = 5000;
    EXPECT_EQ(Geometry(GeometryShape::of(c, 4, 1, 1, 1)).output_pool_bytes(), 8192u);
  }
}

}  // namespace
}  // namespace epx::detail
