// The state a Buffer carries between calls (src/ep/call_state.hpp), alone: which call
// may put its data before the header exchange, over sequences of dispatches and combines
// with and without views, failed exchanges and other handles.
#include "call_state.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace epx::detail {
namespace {

TEST(CallState, FirstCallsExchangeFirst) {
  CallState s;
  EXPECT_FALSE(s.begin_dispatch(true, false));  // nothing proved free yet
  CallState c;
  EXPECT_FALSE(c.begin_combine(true, 1));       // no dispatch before it
}

TEST(CallState, AlternatingCallsGoFirstWithoutViews) {
  CallState s;
  EXPECT_FALSE(s.begin_dispatch(true, false));
  s.dispatch_exchanged(false, 1);
  EXPECT_TRUE(s.begin_combine(true, 1));   // replies first
  s.combine_exchanged(false);
  EXPECT_TRUE(s.begin_dispatch(true, false));  // rows first (cached or fresh)
  s.dispatch_exchanged(false, 1);
  EXPECT_FALSE(s.begin_dispatch(true, false));  // a dispatch after a dispatch waits
  s.dispatch_exchanged(false, 3);
  EXPECT_FALSE(s.begin_combine(true, 1));  // a combine with another handle than the last dispatch's
  s.combine_exchanged(false);
  EXPECT_FALSE(s.begin_combine(true, 3));  // a combine after a combine waits
}

TEST(CallState, ViewsKeepTheExchangeFirst) {
  CallState s;
  EXPECT_FALSE(s.begin_dispatch(true, true));
  EXPECT_TRUE(s.holds_view());
  s.dispatch_exchanged(true, 1);           // some rank (this one) holds a view
  EXPECT_FALSE(s.begin_combine(true, 1));  // someone may pull: push or pull is agreed first
  s.combine_exchanged(true);               // the views are still out
  EXPECT_FALSE(s.begin_dispatch(true, false));
  EXPECT_FALSE(s.holds_view());
  s.dispatch_exchanged(false, 2);
  EXPECT_TRUE(s.begin_combine(true, 2));
  s.combine_exchanged(false);
  EXPECT_TRUE(s.begin_dispatch(true, false));
}

TEST(CallState, AFailedExchangeFreesNothing) {
  CallState s;
  s.begin_dispatch(true, false);
  s.dispatch_exchanged(false, 1);
  EXPECT_TRUE(s.begin_combine(true, 1));
  // The exchange threw (a bad input somewhere): combine_exchanged never ran.
  EXPECT_FALSE(s.begin_dispatch(true, false));
  s.dispatch_exchanged(false, 2);
  EXPECT_FALSE(s.begin_combine(true, 0));  // a bad input on this rank: no handle
  EXPECT_FALSE(s.begin_combine(true, 2));  // and that failed combine freed nothing either
}

TEST(CallState, NotPossibleNeverGoesFirst) {
  CallState s;
  s.begin_dispatch(false, false);
  s.dispatch_exchanged(false, 1);
  EXPECT_FALSE(s.begin_combine(false, 1));  // ring, relay, flag protocol, or no stretches
  s.combine_exchanged(false);
  EXPECT_FALSE(s.begin_dispatch(false, false));
}

// An asynchronous call in flight: every other call is refused on this rank, naming it,
// until it is finished; the refusal changes nothing of the rows-first state.
TEST(CallState, RefusesEveryCallWhileOneIsPending) {
  CallState s;
  EXPECT_NO_THROW(s.refuse_while_pending("dispatch", 2));
  EXPECT_FALSE(s.begin_dispatch(true, false));
  s.dispatch_exchanged(false, 1);
  auto* call = reinterpret_cast<AsyncCall*>(std::uintptr_t{0x1000});  // never dereferenced
  s.begin_async(call, "dispatch (call 1)");
  EXPECT_EQ(s.pending(), call);
  for (const char* what : {"dispatch", "combine"}) {
    try {
      s.refuse_while_pending(what, 2);
      ADD_FAILURE() << what << " accepted while a call is pending";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.origin_rank(), 2);
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("rank 2: ") + what + " refused"), std::string::npos) << m;
      EXPECT_NE(m.find("dispatch (call 1)"), std::string::npos) << m;
    }
  }
  s.end_async();
  EXPECT_EQ(s.pending(), nullptr);
  EXPECT_NO_THROW(s.refuse_while_pending("combine", 2));
  EXPECT_TRUE(s.begin_combine(true, 1));  // still right after that dispatch: replies first
}

}  // namespace
}  // namespace epx::detail
