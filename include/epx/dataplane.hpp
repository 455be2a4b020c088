// epx/dataplane.hpp — how a Buffer moves rows: topology, peer schedule, queues, put
// aggregation and completion protocol. Part of BufferConfig (every rank passes the same).
// Every combination gives bit-identical results (docs/spec.md); they differ in order, put
// count and synchronisation, which is what `epx bench --sweep` measures.
#pragma once

#include <cstddef>
#include <string>

#include "epx/schedule.hpp"

namespace epx {

/// How a receiver learns that a sender's rows have landed.
///   kExplicit  puts, quiet(queue) on every queue used, then one signal per destination
///              (relies on: quiet completes puts; a signal after quiet is seen after them)
///   kTail      relaxed puts, then one ordered signal per (destination, queue) right after
///              that destination's puts, each signal slot in its own 512-byte line
///              (relies on: caps().ordered_signal_per_queue)
///   kFlag      data-as-flag: rows travel in 512-byte blocks, 480 B payload + an 8-byte
///              epoch flag (+ padding), the receiver polls each block's flag; no separate
///              signal, and a stale block from an earlier call can never pass for new data
///              (relies on: caps().flagged_puts). Rows are unpacked once on arrival, so
///              zero-copy output (recv_in_window) is refused.
enum class Protocol { kExplicit, kTail, kFlag };

/// "explicit" | "tail" | "flag"; throws kInvalidArgument otherwise.
Protocol parse_protocol(const std::string& text);
const char* to_string(Protocol protocol) noexcept;

/// How a dispatch worker orders its sends over its tokens (every policy gives the same bits;
/// each destination still gets its rows in ascending slot order):
///   kAuto   chosen per call from P, the row size and the transport's put costs
///           (TransportCaps::put_overhead_ns, put_gbps): blocks as for kBlock at 256 KiB,
///           grown until each destination's share of a block makes puts whose fixed cost is
///           small against their wire time (docs/engine.md, "send policy"); whole when one
///           block would hold all the worker's tokens
///   kWhole  destination after destination over all the worker's tokens: one run each
///   kBlock  the worker's tokens in blocks of `block_bytes` of rows, each block to every
///           destination before the next (a block's x rows are read once for their ~K copies)
/// A rank's own choice: ranks may differ (it changes only the order of its puts).
enum class SendPolicyKind { kAuto, kWhole, kBlock };
struct SendPolicy {
  SendPolicyKind kind = SendPolicyKind::kAuto;
  std::size_t block_bytes = 0;  ///< kBlock: bytes of x rows (data + scales) per block, > 0
};

/// The order of combine's float32 additions (docs/spec.md §4).
///   kFlat       a token's partials added at its source in the flat order (default)
///   kNodeFirst  hierarchical schedule only: a token's partials summed inside each server
///               (node) first — at the relay, so each token's reply crosses once per server
///               pair, as DeepEP's internode combine does — then the servers' sums added at
///               the source in ascending server order ("combine reduced inside each node
///               first"). Bit-exact to that order, which differs from the flat one.
enum class CombineOrder { kFlat, kNodeFirst };
/// "flat" | "node-first"; throws kInvalidArgument otherwise.
CombineOrder parse_combine_order(const std::string& text);
const char* to_string(CombineOrder order) noexcept;

/// What an expanded combine sends back (docs/spec.md §4's sums are the same bits either way).
///   kPartials    one row per (token, destination rank): the expert rank sums the token's
///                slots it holds into the partial p_G and puts that (default)
///   kSelections  one row per (token, expert) selection: the expert rank puts every slot's
///                y row as it is (DeepEP's low-latency combine), and the source forms each
///                p_G from them (from 0.0f in ascending k, rounded to bf16; one unweighted
///                slot passes unchanged) before adding the groups in docs/spec.md §4's order. K rows
///                a token on the wire instead of one per rank it reached; the reply area
///                holds max_tokens_per_rank x K rows. Direct path only (not hierarchical,
///                not ring_rows), explicit or tail protocol; the compact layout's rows are
///                per (token, rank) already, so it sends them as with kPartials.
enum class CombineReplies { kPartials, kSelections };
/// "partials" | "selections"; throws kInvalidArgument otherwise.
CombineReplies parse_combine_replies(const std::string& text);
const char* to_string(CombineReplies replies) noexcept;

struct DataPlaneOptions {
  std::string topology = "builtin:flat";  ///< see epx/topology.hpp
  Schedule schedule{};                    ///< default: rotated
  int queues = 1;                         ///< 1, 2 or 4 (<= the transport's max_queues)
  QueueSplit queue_split{};               ///< default: round-robin
  /// Consecutive rows to the same peer merged into one put up to this many bytes; 0 = off
  /// (one put per row). A single row larger than the limit is still one put.
  std::size_t aggregate_bytes = std::size_t{1} << 20;
  Protocol protocol = Protocol::kExplicit;
  SendPolicy send_policy{};               ///< default: auto
  CombineOrder combine_order = CombineOrder::kFlat;  ///< kNodeFirst needs schedule hierarchical
  CombineReplies combine_replies = CombineReplies::kPartials;  ///< kSelections: direct path, expanded layout
  /// With an output pool: a combine right after the dispatch whose handle it uses pushes its
  /// replies before the header exchange (one synchronisation instead of the pull's two,
  /// for two more passes over the replies: put, then read back) when every rank's dispatch
  /// output holds at most this many bytes; larger combines exchange headers first and pull
  /// where they can. 0 = never (with a pool). Without a pool, or (limit > 0) on a transport
  /// whose peers are not mapped (nobody can pull), replies go first whenever the call allows
  /// it (docs/engine.md). Measured on the 2-core box of BENCHMARKS.md ("What we tried": small
  /// calls and synchronisation; 8 ranks, H 7168): replies first is faster at 1 token per rank
  /// (~140 KB per rank's output), even at 2 and slower from 4 (at 128 tokens, 9.8 MB, 2x slower).
  std::size_t replies_first_max_bytes = std::size_t{160} << 10;
  /// A call's puts and copies of 8 KiB and more use streaming (non-temporal) stores only
  /// when the payload this rank writes in the call (dispatch: the rows it sends; combine:
  /// the replies it pushes) is at least this many bytes; a smaller call writes through the
  /// cache, where its readers (the receivers' epilogue, the combine's reads of y) find the
  /// rows soon after. 0 = always stream (epx/spi/copy.hpp). Measured on the 2-core box of
  /// BENCHMARKS.md ("What we tried": small calls and synchronisation; 8 ranks, H 7168): cached
  /// stores make the round trip faster up to ~1.2 MB per rank (16 tokens: 1.5x), even at
  /// ~2.4 MB, and streaming ones from ~4.9 MB (128 tokens: the dispatch 2x slower without them).
  std::size_t stream_min_call_bytes = std::size_t{2} << 20;
  /// Hierarchical schedule, both directions: the relays work in chunks of this many bytes
  /// of relayed rows (BF16 rows of hidden; the same number of rows for the dispatch; at
  /// least one row). Combine: every member of a server sends its replies chunk by chunk
  /// across all its relay channels (chunk 0 to every relay, then chunk 1, ...), each chunk
  /// followed by an ordered signal, and a relay sums (node first) or forwards (flat) chunk
  /// i as soon as every member has signalled it, while later chunks still arrive: the
  /// NVLink-like stage and the NIC stage overlap, as in DeepEP's internode combine.
  /// Dispatch: every source sends its relayed rows the same way (chunk c to each of its
  /// relays, then the chunk's signal), and a relay forwards a source's chunk c as soon as
  /// that source has signalled it, as DeepEP's internode dispatch forwards RDMA chunks over
  /// NVLink. Same bits (the rows land in the same slots; docs/spec.md §4 fixes the sums' order, not
  /// the arrival). 0 = the serial relay (all of a source's rows or every member's replies,
  /// then the forwarding); kRelayChunkAuto (default): chosen from
  /// the transport's put costs (TransportCaps::put_overhead_ns / put_gbps): chunked only
  /// where they are stated (the simulator), serial elsewhere (threads, shm, shmem, UCX —
  /// over UCX on TCP every signal is an active message; docs/engine.md "Relay chunks").
  static constexpr std::size_t kRelayChunkAuto = ~std::size_t{0};
  std::size_t relay_chunk_bytes = kRelayChunkAuto;
  /// The base data path by name (its key in the support table, spi::PathRule::key: "direct",
  /// "relay", "ring", or one registered from outside, docs/engine.md "Add a data path"); it
  /// must take the rest of the config (its base_of). Empty: the last registered path whose
  /// base_of takes the config. An unknown name is refused when the Buffer is made, on every rank.
  std::string path;
};

}  // namespace epx
