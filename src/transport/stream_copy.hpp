// The copy behind a mapped transport's put: large puts bypass the cache.
//
// A put's destination is a peer's window that this rank never reads back, so for large
// puts a copy with non-temporal (streaming) stores is faster than memcpy: it skips reading
// every destination line into the cache before overwriting it (BENCHMARKS.md: 1.3-1.6x on
// this machine for 42 KB - 1 MB blocks). Smaller puts use memcpy: their rows may still be
// in cache when the peer reads them.
#pragma once

#include <cstddef>

namespace epx::detail {

/// Puts of at least this many bytes stream; the default 8 KiB (one bf16 row of H = 4096 and up), or EPX_STREAM_MIN_BYTES
/// from the environment (read once; 0 turns streaming off), for A/B measurements.
std::size_t stream_min_bytes() noexcept;

/// memcpy(dst, src, bytes), with streaming stores when bytes >= stream_min_bytes() and the
/// CPU has AVX2. Returns after a store fence: the bytes are ordered before any later store
/// of this thread (a release-store signal or flag), as after a memcpy.
void put_copy(void* dst, const void* src, std::size_t bytes) noexcept;

}  // namespace epx::detail
