// epx/schedule.hpp — the order in which a rank's workers visit destinations, and which
// queue each channel uses. Pure functions of the topology table: no transport, no data.
//
//   flat          destinations 0..P-1, one round
//   rotated       destination (rank + i) mod P, one round (no rank hits rank 0 first)
//   grouped:W     ranks form P/W groups of W; round r (0 <= r < P/W) sends from my group
//                 g to group (g + r) mod (P/W) — in every round each target group receives
//                 from exactly one source group — visiting that group's W members rotated
//                 by my index in my group, so inside a round the W sources of a group hit
//                 W distinct targets at each step. Groups: the table's `group` field when
//                 every group has exactly W ranks, else consecutive runs of W ranks in the
//                 table's (frame, row, column, rank) order. W must divide P.
//   hierarchical  a token crossing servers goes once to the same-lane rank of the target
//                 server (its relay), which forwards it inside the server. The visiting
//                 order is: my own server's ranks rotated, then each other server's relay
//                 (servers rotated from mine). Needs a table with more than one server
//                 whose servers all have the same size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "epx/topology.hpp"

namespace epx {

enum class ScheduleKind { kFlat, kRotated, kGrouped, kHierarchical };

struct Schedule {
  ScheduleKind kind = ScheduleKind::kRotated;
  int group_width = 0;  ///< grouped:W only
};

/// "flat" | "rotated" | "grouped:W" | "hierarchical"; throws kInvalidArgument otherwise.
Schedule parse_schedule(const std::string& text);
std::string to_string(const Schedule& schedule);

/// Destinations in visiting order, grouped into rounds; every rank 0..P-1 appears exactly
/// once over all rounds (hierarchical: every rank of my server and one relay per other
/// server). Throws kInvalidArgument when the schedule does not fit the table (W does not
/// divide P, hierarchical without servers, ...), naming what was expected.
std::vector<std::vector<int>> peer_rounds(const Schedule& schedule, const Topology& topology, int rank);

/// hierarchical: the rank in `dst`'s server with the lane of `src` (dst's own server: dst).
int relay_rank(const Topology& topology, int src, int dst);

/// How channels (a worker's visit to one destination) are spread over queues.
enum class QueueSplitKind { kRatio, kRoundRobin, kBytes };

struct QueueSplit {
  QueueSplitKind kind = QueueSplitKind::kRoundRobin;
  std::vector<int> ratio;  ///< kRatio: one positive weight per queue, e.g. {3, 1}
};

/// "1:1" / "3:1" / "1:3" / any a:b:... (kRatio), "rr", "bytes"; throws kInvalidArgument.
QueueSplit parse_queue_split(const std::string& text);
std::string to_string(const QueueSplit& split);

/// Queue of each channel, channels given in visiting order with their planned bytes.
///   kRoundRobin  channel i -> i mod Q
///   kRatio       consecutive channels fill the queues in proportion to the weights,
///                interleaved: with 3:1, channels 0,1,2 -> queue 0, channel 3 -> queue 1, ...
///   kBytes       each channel, in order, to the queue with the fewest planned bytes so
///                far (ties: the lowest queue)
/// Throws kInvalidArgument if a ratio's length differs from `queues` or queues < 1.
std::vector<int> assign_queues(const QueueSplit& split, int queues, const std::vector<std::uint64_t>& channel_bytes);

}  // namespace epx
