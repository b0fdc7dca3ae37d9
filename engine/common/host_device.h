// FERRY_HOST_DEVICE marks a function that nvcc compiles for both the host and the GPU (the CUDA
// backend's kernels share the engine's scalar arithmetic, engine/common/float_math.h, and their
// index helpers are unit-tested on the host); a C++ compiler sees an ordinary inline function.
// Also the few primitives such functions need whose spelling differs between the two sides:
// bit casts, fused multiply-add and rounding to nearest even. Header-only; no state.

#ifndef FERRY_ENGINE_COMMON_HOST_DEVICE_H_
#define FERRY_ENGINE_COMMON_HOST_DEVICE_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif

namespace ferry {

FERRY_HOST_DEVICE inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
#endif
}

FERRY_HOST_DEVICE inline float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// a * b + c rounded once.
FERRY_HOST_DEVICE inline float FusedMultiplyAdd(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The nearest integer, ties to even (the default rounding mode on both sides).
FERRY_HOST_DEVICE inline float RoundHalfEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

FERRY_HOST_DEVICE inline bool IsNan(float x) {
#if defined(__CUDA_ARCH__)
  return isnan(x);
#else
  return std::isnan(x);
#endif
}

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_HOST_DEVICE_H_
