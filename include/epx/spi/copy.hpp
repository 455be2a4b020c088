// epx/spi/copy.hpp — the copy rows travel with: large copies bypass the cache.
//
// A row's destination (a peer's window, an output tensor) is not read back by the thread
// that writes it, so for large copies non-temporal (streaming) stores are faster than
// memcpy: they skip reading every destination line into the cache before overwriting it
// (BENCHMARKS.md: 1.3-1.6x on this machine for 14 KB - 1 MB blocks). Smaller copies use
// memcpy: their rows may still be in cache when they are read. Used by the mapped
// transports' puts and by the engine's epilogue copies. Thread-safe, no state.
#pragma once

#include <cstddef>

namespace epx {

/// Copies of at least this many bytes stream; the default 8 KiB (one bf16 row of H = 4096 and up), or EPX_STREAM_MIN_BYTES
/// from the environment (read once; 0 turns streaming off), for A/B measurements.
std::size_t stream_min_bytes() noexcept;

/// memcpy(dst, src, bytes), with streaming stores when bytes >= stream_min_bytes() and the
/// CPU has them (x86: the widest of SSE4 / AVX2 / AVX-512, Google Highway picks at run time;
/// elsewhere memcpy). Returns after a store fence: the bytes are ordered before any later
/// store of this thread (a release-store signal or flag), as after a memcpy.
void bulk_copy(void* dst, const void* src, std::size_t bytes) noexcept;

/// Within its lifetime, on the thread that made it, bulk_copy streams only if `stream`
/// (false: every bulk_copy is a memcpy through the cache; true: as before, by
/// stream_min_bytes()). The engine decides per call (DataPlaneOptions::stream_min_call_bytes):
/// a small call's rows are read back soon by their receivers, who find them in the cache.
/// Scopes nest; each restores the setting it found.
class StreamScope {
 public:
  explicit StreamScope(bool stream) noexcept;
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  bool saved_;
};

/// Whether bulk_copy of `bytes` on this thread streams now (the threshold and StreamScope).
bool bulk_copy_streams(std::size_t bytes) noexcept;

/// memcpy(dst, src, bytes) with streaming stores at any size where the CPU has them (else
/// memcpy), then a store fence: the bench's streaming-copy reference.
void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept;

/// Gathers rows: memcpy(dst + i * row_bytes, src[i], row_bytes) for every i < n whose src[i]
/// is not null (those rows are left as they are), with streaming stores where the CPU has
/// them, the row a few rows on prefetched, then one store fence. For gathered outputs larger
/// than the cache (the EngramBuffer's layers): the rows' destinations are not read back first.
void stream_copy_rows(void* dst, const void* const* src, std::size_t n, std::size_t row_bytes) noexcept;

/// The SIMD target the copies stream with on this CPU (e.g. "AVX2"; "memcpy" where none).
const char* stream_copy_target() noexcept;

}  // namespace epx
