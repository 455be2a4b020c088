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

}  // namespace epx::spi
