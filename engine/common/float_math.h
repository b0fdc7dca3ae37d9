// The engine's own scalar floating-point primitives, defined by their operations so that every
// vectorised variant (engine/backends/cpu) reproduces them bit for bit (ARCHITECTURE.md §4: "the
// engine's own vector exp", no dependence on libm versions or instruction sets):
//
//   Bf16ToFloat / FloatToBf16   bfloat16 <-> float, round to nearest even (NaN stays NaN).
//   HalfToFloat / FloatToHalf   IEEE fp16 <-> float: widening is exact; narrowing rounds to
//                               nearest even (subnormals, infinities included); NaNs come out
//                               quiet. What F16C's VCVTPH2PS / VCVTPS2PH (mode 0) compute.
//   Exp(x)                      e^x in float, max error about 1 ulp on the normal range.
//
// Every function is FERRY_HOST_DEVICE (engine/common/host_device.h): the CUDA backend computes
// the same bits on the GPU (its kernels are built with -fmad=false, so nothing else is fused).
//
// Exp is computed as 2^n * p(r): n = nearbyint(x * log2(e)) (round half to even), r = x - n*ln2
// in two steps (Cody-Waite: ln2 = kLn2Hi + kLn2Lo, each step one fused multiply-add), p the
// degree-7 Taylor polynomial of e^r (|r| <= 0.35, truncation error < 2^-27 relative) by Horner's
// rule with fused multiply-adds, and the scaling by 2^n done in two factors so that results in the
// subnormal range are rounded once, correctly, as the product would be. x > 88.72284 gives +inf, x
// < -103.97 gives +0, NaN gives NaN.

#ifndef FERRY_ENGINE_COMMON_FLOAT_MATH_H_
#define FERRY_ENGINE_COMMON_FLOAT_MATH_H_

#include <cmath>
#include <cstdint>

#include "engine/common/host_device.h"

namespace ferry {

FERRY_HOST_DEVICE inline float Bf16ToFloat(uint16_t b) {
  return FloatFromBits(static_cast<uint32_t>(b) << 16);
}

FERRY_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Rounds a float to the nearest bfloat16 value, kept as a float.
FERRY_HOST_DEVICE inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

FERRY_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    int e = -1;  // a subnormal half: normalize
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3ff) << 13);
  }
  return FloatFromBits(bits);
}

FERRY_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00 | ((abs >> 13) & 0x3ff);  // NaN, quiet
  if (abs >= 0x477ff000) return sign | 0x7c00;  // 65520 and up round to infinity
  if (abs < 0x38800000) {
    // Below 2^-14: a subnormal half, in units of 2^-24 (the scaling is exact).
    const float v = FloatFromBits(abs);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(RoundHalfEven(v * 16777216.0f)));
  }
  uint32_t h = ((abs >> 23) - 112) << 10 | (abs & 0x7fffff) >> 13;
  const uint32_t rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: right
  return static_cast<uint16_t>(sign | h);
}

namespace float_math_internal {

constexpr float kLog2E = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;  // 12 significant bits: n * kLn2Hi is exact
constexpr float kLn2Lo = 1.42860682030941723212e-6f;
constexpr float kExpMax = 88.72283935546875f;     // largest float with a finite e^x
constexpr float kExpMin = -103.972084045410156f;  // below: e^x rounds to +0
// 1/k! for k = 7..0, as floats.
constexpr float kC7 = 1.98412698412698412526e-4f;
constexpr float kC6 = 1.38888888888888894189e-3f;
constexpr float kC5 = 8.33333333333333321769e-3f;
constexpr float kC4 = 4.16666666666666643537e-2f;
constexpr float kC3 = 1.66666666666666657415e-1f;
constexpr float kC2 = 0.5f;
constexpr float kC1 = 1.0f;
constexpr float kC0 = 1.0f;

// 2^e as a float for e in [-126, 127].
FERRY_HOST_DEVICE inline float Pow2(int32_t e) {
  return FloatFromBits(static_cast<uint32_t>(e + 127) << 23);
}

}  // namespace float_math_internal

FERRY_HOST_DEVICE inline float Exp(float x) {
  using namespace float_math_internal;
  if (IsNan(x)) return x;
  if (x > kExpMax) return INFINITY;
  if (x < kExpMin) return 0.0f;
  const float n = RoundHalfEven(x * kLog2E);
  float r = FusedMultiplyAdd(-n, kLn2Hi, x);
  r = FusedMultiplyAdd(-n, kLn2Lo, r);
  float p = kC7;
  p = FusedMultiplyAdd(p, r, kC6);
  p = FusedMultiplyAdd(p, r, kC5);
  p = FusedMultiplyAdd(p, r, kC4);
  p = FusedMultiplyAdd(p, r, kC3);
  p = FusedMultiplyAdd(p, r, kC2);
  p = FusedMultiplyAdd(p, r, kC1);
  p = FusedMultiplyAdd(p, r, kC0);
  // 2^n = 2^n1 * 2^n2 with both factors normal: n in [-150, 128].
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  return (p * Pow2(n1)) * Pow2(n2);
}

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_FLOAT_MATH_H_
