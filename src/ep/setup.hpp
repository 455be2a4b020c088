// What a Buffer fixes when it is built and never changes afterwards: the agreed config,
// the transport and its model interface, the payload policy, the ranks' places (topology,
// visiting order, reply channels) and the window's geometry. Every member is const: a call
// reads them and changes none. Built in one go (setup.cpp) from the config, after every
// rank agreed on it; the window is allocated by the Buffer from `geo` afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "epx/buffer_base.hpp"
#include "epx/config.hpp"
#include "epx/sim/model_transport.hpp"
#include "epx/topology.hpp"
#include "epx/transport.hpp"
#include "geometry.hpp"
#include "payload.hpp"

namespace epx::detail {

struct Setup {
  /// Agrees with every rank on the values (throws on every rank if one's `problem` is not
  /// empty or any value differs; BufferBase::agree).
  using Agree = std::function<void(const std::vector<AgreedValue>& values, const std::string& problem)>;
  /// Collective: checks `config` against the transport and the support table, agrees on it
  /// through `agree`, then lays out the window.
  Setup(Transport& transport, const BufferConfig& config, const Agree& agree);

  bool hierarchical() const noexcept { return config.dataplane.schedule.kind == ScheduleKind::kHierarchical; }
  /// Other-server ranks of my lane, rotated from me: the sources whose rows I relay.
  std::vector<int> relayed_sources() const;

  Transport& transport;
  /// The transport's optional model interface (the simulator), asked for once; null elsewhere.
  sim::ModelTransport* const model;
  /// Whether payload values exist (not on a model-only simulator; payload.hpp): every step
  /// whose only product is payload values asks it.
  const PayloadPolicy payload;
  const BufferConfig config;
  const int rank, P, L, W;
  const std::uint64_t buffer_id;
  const Topology topology;
  const std::vector<int> visit_order;                 // peers in the schedule's order (all rounds)
  const std::vector<int> reply_order;                 // combine's channels: visit_order; hierarchical: my server's ranks
  const std::vector<std::vector<int>> reply_sources;  // [P] sources whose replies travel to a channel's peer
  const std::vector<int> server_members;              // hierarchical: my server's ranks by lane
  /// Hierarchical: relayed rows per relay chunk, both directions (0: serial; send_policy.hpp).
  const std::int64_t relay_chunk_rows;
  const Geometry geo;  // every window region, signal slot and row address (geometry.hpp)
  const std::vector<std::uint16_t> zero_row;  // H bf16 zeros: the reduce's term for a missing bias1

 private:
  struct Draft;  // the members above, filled in order (setup.cpp)
  Setup(Transport& transport, Draft&& d);
};

}  // namespace epx::detail
