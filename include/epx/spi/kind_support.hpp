// epx/spi/kind_support.hpp — the support table of the buffer kinds besides EP (EP's is
// support.hpp, the same style): for each kind and each way its bytes move (a variant), which
// completion protocol (epx/dataplane.hpp's Protocol) it can take, the transport guarantee that
// relies on, and why a refused one does not fit. The kinds consult it at construction
// (BucketBuffer and PPBuffer through refuse_protocol: the refusal names the kind, the protocol
// asked for and why; EngramBuffer through pick for its served path); tests/unit/
// kind_support_test.cpp walks it. Adding a protocol to a kind = its row here, its use in the
// kind (through the core: spi::CreditChannels, spi::await_word) and its multirank tests.
//
// What the protocols mean for a message of a kind (docs/buffers.md, "Completion protocols"):
//   explicit  the bytes; quiet the queue; a signal (a count) the receiver waits for
//   tail      the bytes; the signal right after them, ordered after them by the transport
//   flag      the bytes; then a word next to them (the message's own count or epoch) written
//             after them; the receiver looks at that word, no signal
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "epx/dataplane.hpp"
#include "epx/error.hpp"
#include "epx/transport.hpp"

namespace epx::spi {

enum class Kind { kBucket, kPP, kEngram };

struct KindRule {
  Kind kind;
  const char* kind_name;       ///< as in the kind's errors ("bucket", "pp", "engram")
  const char* variant;         ///< how the bytes move (docs/buffers.md)
  Protocol protocol;
  bool supported;
  bool TransportCaps::*needs;  ///< the guarantee it relies on (nullptr: none)
  const char* needs_text;      ///< ... in words, for the refusal
  const char* why;             ///< supported: how the receiver knows; refused: why it does not fit
};

// clang-format off
inline constexpr KindRule kKindRules[] = {
    // Bucket: the credit channels carry the headers (without boards), staged payloads and the
    // pipelined chunks; done signals close the data phases. The boards carry every call's
    // header round where peer windows are readable in place, and a one-shot call's inputs.
    {Kind::kBucket, "bucket", "channels", Protocol::kExplicit, true, nullptr, "",
     "every publish and done signal after a quiet of the queue"},
    {Kind::kBucket, "bucket", "channels", Protocol::kTail, true, &TransportCaps::ordered_signal_per_queue,
     "signals ordered after earlier puts on their queue", "the arrived / done signal right after the puts"},
    {Kind::kBucket, "bucket", "channels", Protocol::kFlag, false, nullptr, "",
     "a channel message's arrival is its arrived count, which also orders the credits; a flag per "
     "chunk would not save the count (the channels stay tail under flag)"},
    {Kind::kBucket, "bucket", "board", Protocol::kExplicit, true, &TransportCaps::peer_memory_mapped,
     "peer windows readable in place (the boards)", "a signal to every member (the quiet before it has nothing to wait for)"},
    {Kind::kBucket, "bucket", "board", Protocol::kTail, true, &TransportCaps::peer_memory_mapped,
     "peer windows readable in place (the boards)", "a signal to every member, ordered after the slot's stores"},
    {Kind::kBucket, "bucket", "board", Protocol::kFlag, true, &TransportCaps::peer_memory_mapped,
     "peer windows readable in place (the boards)",
     "the slot's ready word holds the call's epoch, stored after the header and inputs; members look at it in place"},
    // PP: per pair a FIFO of slots (header + payload); large messages between mapped peers
    // stream the bytes after the claim through a ring whose chunks count themselves
    // (produced / consumed words), and a receive into a planned tensor gets them directly.
    {Kind::kPP, "pp", "slots", Protocol::kExplicit, true, nullptr, "", "payload, header, quiet, then the arrived signal"},
    {Kind::kPP, "pp", "slots", Protocol::kTail, true, &TransportCaps::ordered_signal_per_queue,
     "signals ordered after earlier puts on their queue", "payload, header, then the arrived signal ordered after them"},
    {Kind::kPP, "pp", "slots", Protocol::kFlag, true, &TransportCaps::peer_memory_mapped,
     "peer windows mapped here (the sender's own stores, then the header's flag word)",
     "the header's flag word holds the message number + 1, stored after the payload and header; no arrived signal. "
     "Without mapped peers the payload and the header go by separate puts, and put_flagged orders only its own "
     "block before its flag"},
    {Kind::kPP, "pp", "stream", Protocol::kExplicit, true, &TransportCaps::peer_memory_mapped,
     "peer windows mapped here (streaming)", "ring chunks by their produced count; the header as for slots"},
    {Kind::kPP, "pp", "stream", Protocol::kTail, true, &TransportCaps::peer_memory_mapped,
     "peer windows mapped here (streaming)", "ring chunks by their produced count; the header as for slots"},
    {Kind::kPP, "pp", "stream", Protocol::kFlag, true, &TransportCaps::peer_memory_mapped,
     "peer windows mapped here (streaming)", "ring chunks by their produced count; the header's flag word as for slots"},
    // Engram: rows read in place (mapped), one-sided gets, or requests and replies (served).
    {Kind::kEngram, "engram", "mapped", Protocol::kExplicit, false, nullptr, "",
     "rows are read where they lie: nothing travels, nothing to complete"},
    {Kind::kEngram, "engram", "mapped", Protocol::kTail, false, nullptr, "",
     "rows are read where they lie: nothing travels, nothing to complete"},
    {Kind::kEngram, "engram", "mapped", Protocol::kFlag, false, nullptr, "",
     "rows are read where they lie: nothing travels, nothing to complete"},
    {Kind::kEngram, "engram", "get", Protocol::kExplicit, true, &TransportCaps::one_sided_get,
     "one-sided gets", "the requester's own quiet completes its gets (no peer takes part)"},
    {Kind::kEngram, "engram", "get", Protocol::kTail, false, nullptr, "",
     "a get has no sender to signal: only the requester's quiet completes it"},
    {Kind::kEngram, "engram", "get", Protocol::kFlag, false, nullptr, "",
     "a get has no sender to write a flag: only the requester's quiet completes it"},
    {Kind::kEngram, "engram", "served", Protocol::kExplicit, true, nullptr, "",
     "requests and a layer's reply rows, quiet, then the request / reply signal"},
    {Kind::kEngram, "engram", "served", Protocol::kTail, true, &TransportCaps::ordered_signal_per_queue,
     "signals ordered after earlier puts on their queue", "requests and a layer's reply rows, then the signal ordered after them"},
    {Kind::kEngram, "engram", "served", Protocol::kFlag, false, nullptr, "",
     "a layer's reply rows land at scattered places of the requester's output, one signal per layer; a flag per "
     "row would be a word and a look per row (not implemented)"},
};
// clang-format on
inline constexpr int kNumKindRules = static_cast<int>(sizeof(kKindRules) / sizeof(kKindRules[0]));

inline const char* kind_name(Kind k) noexcept {
  return k == Kind::kBucket ? "bucket" : k == Kind::kPP ? "pp" : "engram";
}

/// The row of (kind, variant, protocol); nullptr when the table has none.
inline const KindRule* kind_rule(Kind k, const std::string& variant, Protocol p) noexcept {
  for (const KindRule& r : kKindRules)
    if (r.kind == k && variant == r.variant && r.protocol == p) return &r;
  return nullptr;
}

/// Why `variant` of kind `k` cannot run protocol `p` on a transport with `caps` ("" if it can).
inline std::string refuse_protocol(Kind k, const std::string& variant, Protocol p, const TransportCaps& caps) {
  const KindRule* r = kind_rule(k, variant, p);
  const std::string what = std::string(kind_name(k)) + " (" + variant + ") with protocol '" + to_string(p) + "'";
  if (r == nullptr) return what + " is not in the support table";
  if (!r->supported) return what + " is not supported: " + r->why;
  if (r->needs != nullptr && !(caps.*r->needs))
    return what + " relies on " + r->needs_text + ", which transport '" + caps.name + "' does not guarantee";
  return {};
}

/// The protocol `variant` of kind `k` takes when none is asked for: tail where the transport
/// orders signals after puts (no quiet on the way), else explicit; nullopt when neither runs
/// (a variant with nothing to complete).
inline std::optional<Protocol> pick(Kind k, const std::string& variant, const TransportCaps& caps) {
  for (Protocol p : {Protocol::kTail, Protocol::kExplicit})
    if (refuse_protocol(k, variant, p, caps).empty()) return p;
  return std::nullopt;
}

/// The protocol a kind's buffer was asked for: `configured`, else the environment variable
/// `env` (for A/B runs; a value parse_protocol refuses is an error naming the variable), else
/// nullopt (the kind then picks). Local.
inline std::optional<Protocol> asked_protocol(const std::optional<Protocol>& configured, const char* env) {
  if (configured) return configured;
  const char* v = std::getenv(env);
  if (v == nullptr || *v == '\0') return std::nullopt;
  try {
    return parse_protocol(v);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, std::string(env) + ": " + e.what());
  }
}

}  // namespace epx::spi
