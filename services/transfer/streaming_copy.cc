#include "services/transfer/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ferry {
namespace transfer {

namespace {
// Below this a copy is too short for streaming stores to pay for their fence.
constexpr size_t kMinStreamed = 4096;
}  // namespace

void StreamingCopy(void* dst, const void* src, size_t length) {
#if defined(__SSE2__)
  if (length < kMinStreamed) {
    std::memcpy(dst, src, length);
    return;
  }
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Up to the destination's first 16-byte boundary the ordinary way.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  length -= head;
  size_t i = 0;
  for (; i + 64 <= length; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, length - i);
  _mm_sfence();  // the streamed stores are weakly ordered: order them before what follows
#else
  std::memcpy(dst, src, length);
#endif
}

}  // namespace transfer
}  // namespace ferry
