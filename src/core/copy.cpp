#include "epx/spi/copy.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define EPX_HAVE_STREAM_COPY 1
#endif

namespace epx {

std::size_t stream_min_bytes() noexcept {
  static const std::size_t value = [] {
    const char* env = std::getenv("EPX_STREAM_MIN_BYTES");
    if (env == nullptr || *env == '\0') return std::size_t{8} << 10;
    const unsigned long long v = std::strtoull(env, nullptr, 10);
    return v == 0 ? SIZE_MAX : static_cast<std::size_t>(v);
  }();
  return value;
}

#ifdef EPX_HAVE_STREAM_COPY
namespace {

__attribute__((target("avx2"))) void stream_copy_avx2(std::byte* dst, const std::byte* src, std::size_t bytes) {
  // Head up to a 32-byte aligned destination, then 128 bytes per step, then the tail.
  const std::size_t head = std::min(bytes, (32 - reinterpret_cast<std::uintptr_t>(dst) % 32) % 32);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
  // Streaming stores are weakly ordered: fence them before the caller's next signal.
  _mm_sfence();
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");

}  // namespace
#endif

void bulk_copy(void* dst, const void* src, std::size_t bytes) noexcept {
#ifdef EPX_HAVE_STREAM_COPY
  if (kHasAvx2 && bytes >= stream_min_bytes()) {
    stream_copy_avx2(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept {
#ifdef EPX_HAVE_STREAM_COPY
  if (kHasAvx2) {
    stream_copy_avx2(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace epx
