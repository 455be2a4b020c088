// epx/topology.hpp — where each rank sits: server, frame, row, column, lane, group.
//
// Schedules read positions from this table; none derives a physical position from rank
// arithmetic. Sources of a table:
//   "builtin:flat"          one server holding every rank (lane = rank, group 0)
//   "builtin:servers:N"     servers of N consecutive ranks (lane = position in the server)
//   "builtin:supernode128"  128 ranks: 2 frames of 64; a frame is 8 rows of 8 (a row is
//                           a server of 8, lane = column); groups are 4x4 blocks of a
//                           frame (16 ranks), 8 groups
//   any other string        a JSON file, format in docs/schedules.md:
//     {"name": "...", "ranks": [{"rank": 0, "server": 0, "frame": 0, "row": 0,
//                                "column": 0, "lane": 0, "group": 0}, ...]}
//     "rank" must list 0..P-1 once each; "group" is optional (default: server).
#pragma once

#include <string>
#include <vector>

namespace epx {

struct RankPlace {
  int server = 0;  ///< node / server id (ranks sharing fast local links)
  int frame = 0;   ///< frame (cabinet) id
  int row = 0;     ///< row inside the frame
  int column = 0;  ///< column inside the row
  int lane = 0;    ///< position inside the server: hierarchical relays pair equal lanes
  int group = 0;   ///< the table's natural group (e.g. a 4x4 block of a supernode frame)
};

struct Topology {
  std::string name;              ///< "builtin:..." or the file path
  std::vector<RankPlace> ranks;  ///< [P], indexed by rank
  int num_ranks() const noexcept { return static_cast<int>(ranks.size()); }
};

/// The table named by `spec` (see above) for `num_ranks` ranks. Throws
/// epx::Error(kInvalidArgument) naming the spec when it is unknown, unreadable, malformed,
/// or describes a different number of ranks than `num_ranks` (and what it describes).
Topology load_topology(const std::string& spec, int num_ranks);

/// Parses the JSON format above; `where` names the source in error messages.
Topology parse_topology_json(const std::string& text, const std::string& where);

/// The table as JSON in the format above (round-trips through parse_topology_json).
std::string to_json(const Topology& topology);

}  // namespace epx
