// The layouts of PPBuffer and EngramBuffer (src/pp/layout.hpp, src/engram/layout.hpp) and
// the references of tests/reference/pp_engram.hpp: what needs no transport.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "engram/layout.hpp"
#include "epx/error.hpp"
#include "pp/layout.hpp"
#include "reference/pp_engram.hpp"

namespace epx {
namespace {

TEST(PPLayout, SlotsOfEveryPairAreDisjointAndInsideTheWindow) {
  for (const auto& links : {std::vector<std::pair<int, int>>{}, std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {3, 3}}}) {
    const pp::Layout l(4, 1000, 3, links);
    EXPECT_EQ(l.slot_bytes(), 1088u);  // 64-byte header + 1000, rounded up to 64
    for (int d = 0; d < 4; ++d) {
      std::set<std::size_t> seen;
      for (int s : l.peers_of(d))
        for (std::uint64_t n = 0; n < 3; ++n) {
          const std::size_t off = l.slot_offset(d, s, n);
          EXPECT_TRUE(seen.insert(off).second) << d << " " << s << " " << n;
          EXPECT_LE(off + l.slot_bytes(), l.window_bytes());
          EXPECT_EQ(off, l.slot_offset(d, s, n + 3));  // a FIFO of 3 slots
        }
    }
  }
}

// With messages of at least 4 chunks the window has, after the slots, three cache lines per
// rank (post, produced, consumed) and a ring of 4 chunks per linked rank: all disjoint, inside
// the window; smaller messages need no rings.
TEST(PPLayout, StreamingLinesAndRingsAreDisjointFromTheSlots) {
  for (const auto& links : {std::vector<std::pair<int, int>>{}, std::vector<std::pair<int, int>>{{0, 1}, {1, 2}}}) {
    const pp::Layout l(4, 1000, 2, links, 128);
    EXPECT_EQ(l.chunk_bytes(), 128u);
    EXPECT_EQ(l.stream_min_bytes(), 512u);
    for (int d = 0; d < 4; ++d) {
      std::vector<std::pair<std::size_t, std::size_t>> spans;  // [begin, end)
      for (int s : l.peers_of(d)) {
        for (std::uint64_t n = 0; n < 2; ++n) spans.emplace_back(l.slot_offset(d, s, n), l.slot_offset(d, s, n) + l.slot_bytes());
        for (std::uint64_t k = 0; k < pp::kRingChunks; ++k) {
          spans.emplace_back(l.ring_offset(d, s, k), l.ring_offset(d, s, k) + 128);
          EXPECT_EQ(l.ring_offset(d, s, k), l.ring_offset(d, s, k + pp::kRingChunks));
        }
      }
      for (int p = 0; p < 4; ++p)
        for (std::size_t line : {l.post_offset(p), l.produced_offset(p), l.consumed_offset(p)}) {
          EXPECT_EQ(line % 64, 0u);
          spans.emplace_back(line, line + 64);
        }
      std::sort(spans.begin(), spans.end());
      for (std::size_t i = 0; i < spans.size(); ++i) {
        EXPECT_LE(spans[i].second, l.window_bytes());
        if (i > 0) {
          EXPECT_LE(spans[i - 1].second, spans[i].first) << "rank " << d << ": overlap at " << spans[i].first;
        }
      }
    }
  }
  EXPECT_EQ(pp::Layout(4, 511, 2, {}, 128).stream_min_bytes(), 0u);  // under 4 chunks: no rings
  EXPECT_EQ(pp::Layout(4, 511, 2, {}, 128).window_bytes(), 4u * 2u * 576u + 4u * 192u);  // the control lines stay
  EXPECT_THROW(pp::Layout(4, 1000, 2, {}, 100), Error);  // not a multiple of 64
}

// The planned tensors' region comes last, at a multiple of 4096, past every slot, control
// line and ring; the window ends with it.
TEST(PPLayout, ThePlannedRegionComesLastAligned) {
  for (std::size_t max : {std::size_t{1000}, std::size_t{100}}) {
    const pp::Layout plain(4, max, 2, {}, 128), l(4, max, 2, {}, 128, 5000);
    EXPECT_EQ(l.user_offset() % 4096, 0u);
    EXPECT_GE(l.user_offset(), plain.window_bytes());
    EXPECT_LT(l.user_offset(), plain.window_bytes() + 4096);
    EXPECT_EQ(l.window_bytes(), l.user_offset() + 5000);
    EXPECT_EQ(l.user_bytes(), 5000u);
    EXPECT_EQ(plain.user_bytes(), 0u);
  }
}

TEST(PPLayout, LinksAreSymmetricAndWindowFollowsTheMostLinkedRank) {
  const pp::Layout l(4, 64, 2, {{0, 1}, {1, 2}});
  EXPECT_TRUE(l.linked(1, 0) && l.linked(0, 1) && l.linked(2, 1));
  EXPECT_FALSE(l.linked(0, 2) || l.linked(3, 3) || l.linked(0, 0));
  EXPECT_EQ(l.peers_of(1), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.window_bytes(), 2u * 2u * 128u + 4u * 192u);  // rank 1: 2 peers x 2 slots x 128 B, control lines
  EXPECT_EQ(pp::Layout(4, 64, 2, {}).window_bytes(), 4u * 2u * 128u + 4u * 192u);
  try {
    pp::Layout(4, 64, 2, {{0, 4}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("{0, 4}"), std::string::npos) << e.what();
  }
}

TEST(PPLayout, HugeSizesSaturateInsteadOfWrapping) {
  const pp::Layout l(1024, std::size_t{1} << 62, 64, {});
  EXPECT_EQ(l.window_bytes(), SIZE_MAX);
}

EngramConfig small_engram(DType dt) {
  EngramConfig c;
  c.num_entries_per_layer = {5, 9, 1};
  c.hidden = dt == DType::kBF16 ? 40 : 256;
  c.num_max_tokens = 7;
  c.num_entries_per_token = 3;
  c.dtype = dt;
  return c;
}

TEST(EngramLayout, RegionsAreAlignedDisjointAndInsideTheirParts) {
  for (DType dt : {DType::kBF16, DType::kFP8E4M3}) {
    const engram::Layout l(3, small_engram(dt));
    EXPECT_EQ(l.sf_packs(), dt == DType::kBF16 ? 0 : 2);
    EXPECT_EQ(l.max_rows(), 3u * 7u * 3u);
    std::vector<std::pair<std::size_t, std::size_t>> fetch, store;  // [begin, end)
    for (int i = 0; i < 3; ++i) {
      fetch.emplace_back(l.out_offset(i), l.out_offset(i) + 21 * l.row_bytes());
      fetch.emplace_back(l.out_sf_offset(i), l.out_sf_offset(i) + 21 * l.sf_row_bytes());
      store.emplace_back(l.row_offset(0, i, 0), l.row_offset(0, i, l.entries(i)));
      store.emplace_back(l.sf_offset(0, i, 0), l.sf_offset(0, i, l.entries(i)));
    }
    for (int q = 0; q < 3; ++q)
      fetch.emplace_back(l.request_offset(q), l.request_offset(q) + engram::Layout::request_meta_bytes(3) + 4 * l.max_rows());
    fetch.emplace_back(l.reply_offset(0), l.reply_offset(l.max_rows()));
    fetch.emplace_back(l.reply_sf_offset(0), l.reply_sf_offset(l.max_rows()));
    for (auto* regions : {&fetch, &store}) {
      std::sort(regions->begin(), regions->end());
      for (std::size_t i = 0; i < regions->size(); ++i) {
        EXPECT_EQ((*regions)[i].first % 64, 0u);
        if (i > 0) {
          EXPECT_LE((*regions)[i - 1].second, (*regions)[i].first);
        }
      }
    }
    for (const auto& f : fetch) EXPECT_LE(f.second, l.num_bytes());
    for (const auto& f : store) EXPECT_LE(f.second, l.num_storage_bytes());
    EXPECT_EQ(l.row_offset(1000, 1, 2), 1000 + l.row_offset(0, 1, 0) + 2 * l.row_bytes());
  }
}

TEST(EngramLayout, ConfigProblemsNameTheField) {
  auto problem = [](auto edit) {
    EngramConfig c = small_engram(DType::kFP8E4M3);
    edit(c);
    return engram::config_problem(c);
  };
  EXPECT_EQ(problem([](EngramConfig&) {}), "");
  EXPECT_NE(problem([](EngramConfig& c) { c.num_entries_per_layer.clear(); }).find("layers"), std::string::npos);
  EXPECT_NE(problem([](EngramConfig& c) { c.num_entries_per_layer.assign(129, 1); }).find("1..128"), std::string::npos);
  EXPECT_NE(problem([](EngramConfig& c) { c.num_entries_per_layer[1] = 0; }).find("num_entries_per_layer[1]"),
            std::string::npos);
  EXPECT_NE(problem([](EngramConfig& c) { c.hidden = 200; }).find("hidden % 128"), std::string::npos);
  EXPECT_NE(problem([](EngramConfig& c) { c.num_sf_packs = 4; }).find("num_sf_packs = 4"), std::string::npos);
  EXPECT_NE(problem([](EngramConfig& c) { c.dtype = DType::kF32; }).find("dtype"), std::string::npos);
  EXPECT_NE(problem([](EngramConfig& c) { c.num_max_tokens = 0; }).find("num_max_tokens"), std::string::npos);
  EXPECT_NE(problem([](EngramConfig& c) { c.dtype = DType::kBF16, c.num_sf_packs = 2; }).find("bf16"), std::string::npos);
}

TEST(PPReference, RandomProgramKeepsTheInflightBoundAndReceivesEverything) {
  const int P = 4, M = 2;
  const ref::PPProgram prog = ref::pp_random_program(P, M, 300, 400, 7);
  std::map<std::pair<int, int>, std::vector<std::uint64_t>> sent, got;
  std::uint64_t zero = 0, full = 0;
  for (int r = 0; r < P; ++r)
    for (const auto& e : prog.ranks[static_cast<std::size_t>(r)]) {
      auto& v = e.send ? sent[{r, e.peer}] : got[{e.peer, r}];
      EXPECT_EQ(e.seq, v.size());
      v.push_back(e.nbytes);
      zero += e.send && e.nbytes == 0;
      full += e.send && e.nbytes == 300;
    }
  EXPECT_EQ(sent, got);  // every message received, sizes agree
  EXPECT_GT(zero, 0u);
  EXPECT_GT(full, 0u);
  // the bound, over the global order
  std::vector<std::size_t> next(P);
  std::map<std::pair<int, int>, int> outstanding;
  int most = 0;
  for (int r : prog.order) {
    const auto& e = prog.ranks[static_cast<std::size_t>(r)][next[static_cast<std::size_t>(r)]++];
    int& o = outstanding[e.send ? std::pair{r, e.peer} : std::pair{e.peer, r}];
    o += e.send ? 1 : -1;
    EXPECT_GE(o, 0);
    EXPECT_LE(o, M);
    most = std::max(most, o);
  }
  EXPECT_EQ(most, M);
  EXPECT_EQ(ref::pp_message(1, 2, 3, 20).size(), 20u);
  EXPECT_NE(ref::pp_message(1, 2, 3, 20), ref::pp_message(2, 1, 3, 20));
}

TEST(EngramReference, GatherIndexesTheWholeTable) {
  const std::vector<std::uint8_t> table = {1, 2, 3, 4, 5, 6};  // 3 rows of 2 bytes
  EXPECT_EQ(ref::engram_gather(table, 2, {2, -1, 0}), (std::vector<std::uint8_t>{5, 6, 0, 0, 1, 2}));
  EXPECT_EQ(ref::engram_gather_scales({0.5f, 1.5f, 2.5f}, 1, {-1, 1}), (std::vector<float>{0.0f, 1.5f}));
  EXPECT_THROW(ref::engram_gather(table, 2, {3}), std::invalid_argument);
}

}  // namespace
}  // namespace epx
