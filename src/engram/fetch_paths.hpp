// How an EngramBuffer's rows move (implementer header): the local and mapped copies, and
// the served path's requests and replies (layout.hpp owns every offset and signal slot).
#pragma once

#include <cstdint>
#include <vector>

#include "fetch_state.hpp"

namespace epx::engram {

/// The served path's running state on one rank: fetches and layers served so far (the
/// signals' epochs), and the staging of the requests and replies this rank puts.
struct ServedState {
  std::uint64_t fetches = 0;
  std::uint64_t layers = 0;
  std::vector<std::vector<std::byte>> requests;  // per owner
  std::vector<std::vector<std::byte>> replies;   // per requester
};

/// Sets s.bases (where each owner's rows can be read here) and the path counters of s.stats.
void plan_rows(FetchState& s);

/// Served path, inside fetch (collective): waits until every owner has finished serving
/// this rank's previous fetch, puts this rank's requests, then serves every requester's.
void start_served(FetchState& s, ServedState& st);

/// Get path, inside fetch (local): one get per remote row (and scale row) straight into its
/// output place, on queue 0; the first hook's quiet completes them (s.gets_pending).
void start_gets(FetchState& s);

/// Layer l of s: local and mapped rows copied (zero rows for -1), served rows waited for
/// and moved from the replies to their places.
void finish_layer(FetchState& s, int l);

}  // namespace epx::engram
