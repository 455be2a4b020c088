// epx/spi/wait.hpp — the one wait of every buffer kind on a word its peers write: a signal
// slot, or an 8-byte flag word of its own window (data-as-flag).
//
// A short look first (spi::peek, epx/spi/backoff.hpp: the peer is likely running and about
// to write; with more ranks than cores every look yields the core at once, since the rank
// being waited for may need this very core), then the transport's own wait, which spins
// longer, yields, and owns the timeout and the peer-failure checks (its kTimeout /
// kPeerFailed errors name the peer and `where`'s phase).
//
// Threading: as Transport::wait_signal / wait_flag. Local (no collective step).
#pragma once

#include <cstddef>
#include <cstdint>

#include "epx/transport.hpp"

namespace epx::spi {

/// Until this rank's signal `slot` holds >= target (acquire). `yield`: ranks outnumber the
/// cores (wait_spins(P) == 0).
void await_signal(Transport& t, std::size_t slot, std::uint64_t target, const WaitPoint& where, bool yield);

/// Until the 8-byte word at `offset` of this rank's window holds >= target (acquire).
void await_flag(Transport& t, std::size_t offset, std::uint64_t target, const WaitPoint& where, bool yield);

/// Until the 8-byte word at `word`, in a peer's window mapped here (Transport::peer_window),
/// holds >= target (acquire): a data-as-flag word its owner writes into its own window and
/// the others read in place. The same look first; then spi::Backoff up to the transport's
/// timeout, after which kTimeout names `where`'s phase and peer. The transport cannot watch
/// a word of a peer's window, so a peer that died shows as that timeout, not kPeerFailed.
void await_word(Transport& t, const std::byte* word, std::uint64_t target, const WaitPoint& where, bool yield);

}  // namespace epx::spi
