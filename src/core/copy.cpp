// Streaming copies, written once with Google Highway: every x86 target is compiled and the
// widest the CPU has is chosen at run time. Other architectures copy with memcpy (Highway's
// Stream is an ordinary store there, no faster than the C library's copy).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "copy.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "epx/spi/copy.hpp"

HWY_BEFORE_NAMESPACE();
namespace epx {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
// Head up to an aligned destination, then four vectors per step, then the tail; no fence.
void StreamBody(std::byte* dst, const std::byte* src, std::size_t bytes) {
  const hn::ScalableTag<std::uint8_t> d;
  const std::size_t N = hn::Lanes(d);
  auto* out = reinterpret_cast<std::uint8_t*>(dst);
  const auto* in = reinterpret_cast<const std::uint8_t*>(src);
  const std::size_t head = std::min(bytes, (N - reinterpret_cast<std::uintptr_t>(dst) % N) % N);
  std::memcpy(out, in, head);
  std::size_t i = head;
  for (; i + 4 * N <= bytes; i += 4 * N) {
    const auto a = hn::LoadU(d, in + i), b = hn::LoadU(d, in + i + N), c = hn::LoadU(d, in + i + 2 * N),
               e = hn::LoadU(d, in + i + 3 * N);
    hn::Stream(a, d, out + i);
    hn::Stream(b, d, out + i + N);
    hn::Stream(c, d, out + i + 2 * N);
    hn::Stream(e, d, out + i + 3 * N);
  }
  std::memcpy(out + i, in + i, bytes - i);
}
#endif

// false when this target has no streaming stores (the caller copies with memcpy).
bool StreamCopy(std::byte* dst, const std::byte* src, std::size_t bytes) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  StreamBody(dst, src, bytes);
  // Streaming stores are weakly ordered: fence them before the caller's next signal.
  hwy::FlushStream();
  return true;
#else
  (void)dst, (void)src, (void)bytes;
  return false;
#endif
}

// Gathered rows: the first line of the row kRowsAhead on is prefetched (the hardware
// prefetchers fetch the rest of it once it is touched), one fence after the last row.
bool StreamRows(std::byte* dst, const std::byte* const* src, std::size_t n, std::size_t row_bytes) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  constexpr std::size_t kRowsAhead = 16;
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n && src[i + kRowsAhead] != nullptr) hwy::Prefetch(src[i + kRowsAhead]);
    if (src[i] != nullptr) StreamBody(dst + i * row_bytes, src[i], row_bytes);
  }
  hwy::FlushStream();
  return true;
#else
  (void)dst, (void)src, (void)n, (void)row_bytes;
  return false;
#endif
}

const char* Target() {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  return hwy::TargetName(HWY_TARGET);
#else
  return "memcpy";
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace epx
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace epx {

HWY_EXPORT(StreamCopy);
HWY_EXPORT(StreamRows);
HWY_EXPORT(Target);

std::size_t stream_min_bytes() noexcept {
  static const std::size_t value = [] {
    const char* env = std::getenv("EPX_STREAM_MIN_BYTES");
    if (env == nullptr || *env == '\0') return std::size_t{8} << 10;
    const unsigned long long v = std::strtoull(env, nullptr, 10);
    return v == 0 ? SIZE_MAX : static_cast<std::size_t>(v);
  }();
  return value;
}

void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept {
  if (!HWY_DYNAMIC_DISPATCH(StreamCopy)(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes))
    std::memcpy(dst, src, bytes);
}

namespace {
thread_local bool t_stream = true;  // StreamScope's setting on this thread
}  // namespace

StreamScope::StreamScope(bool stream) noexcept : saved_(t_stream) { t_stream = stream; }
StreamScope::~StreamScope() { t_stream = saved_; }

bool bulk_copy_streams(std::size_t bytes) noexcept { return t_stream && bytes >= stream_min_bytes(); }

void bulk_copy(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bulk_copy_streams(bytes)) return stream_copy(dst, src, bytes);
  std::memcpy(dst, src, bytes);
}

void stream_copy_rows(void* dst, const void* const* src, std::size_t n, std::size_t row_bytes) noexcept {
  auto* out = static_cast<std::byte*>(dst);
  const auto* const* in = reinterpret_cast<const std::byte* const*>(src);
  if (HWY_DYNAMIC_DISPATCH(StreamRows)(out, in, n, row_bytes)) return;
  for (std::size_t i = 0; i < n; ++i)
    if (in[i] != nullptr) std::memcpy(out + i * row_bytes, in[i], row_bytes);
}

const char* stream_copy_target() noexcept { return HWY_DYNAMIC_DISPATCH(Target)(); }

}  // namespace epx
#endif
