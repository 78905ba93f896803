// Scalar FP8 E4M3 (OCP "FN": no infinities, max 448) and FP4 E2M1 conversions, identical on
// every backend (host and device). Quantization is round-to-nearest-even with saturation to
// the largest finite value ("satfinite"), as the hardware cvt instructions do.
#pragma once

#include <cstdint>

#include "kvc/kernels/host_device.h"

namespace kvc::kernels {

constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;

// float -> E4M3 code (sign in bit 7, 4 exponent bits with bias 7, 3 mantissa bits).
KVC_HD uint8_t FloatToE4M3(float f) {
  const uint32_t x = FloatAsBits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);   // NaN stays NaN
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7e);  // >= 448 (and inf)
  if (a < 0x3c800000u) {  // below 2^-6: subnormal codes count steps of 2^-9 (exact scaling)
    const float steps = RoundHalfEven(BitsAsFloat(a) * 512.0f);
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(steps));  // 8 = smallest normal
  }
  a += 0x7ffffu + ((a >> 20) & 1u);  // round the mantissa to 3 bits, ties to even
  const uint32_t e = (a >> 23) - 120u;
  const uint32_t m = (a >> 20) & 7u;
  if (e > 15u || (e == 15u && m == 7u)) return static_cast<uint8_t>(sign | 0x7e);
  return static_cast<uint8_t>(sign | (e << 3) | m);
}

KVC_HD float E4M3ToFloat(uint8_t c) {
  const uint32_t e = (c >> 3) & 15u;
  const uint32_t m = c & 7u;
  float v;
  if (e == 0) {
    v = static_cast<float>(m) * (1.0f / 512.0f);
  } else if (e == 15u && m == 7u) {
    v = BitsAsFloat(0x7fc00000u);
  } else {
    v = BitsAsFloat(((e + 120u) << 23) | (m << 20));
  }
  return (c & 0x80u) ? -v : v;
}

// float -> E2M1 code (sign in bit 3; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6). Ties go to the
// even code, e.g. 0.25 -> 0, 2.5 -> 2, 5 -> 4. Values beyond 6 saturate.
KVC_HD uint8_t FloatToE2M1(float f) {
  const uint8_t sign = (FloatAsBits(f) >> 31) ? 8 : 0;
  const float a = f < 0 ? -f : f;
  uint8_t m;
  if (!(a > 0.25f)) {
    m = 0;  // also NaN
  } else if (a < 0.75f) {
    m = 1;
  } else if (a <= 1.25f) {
    m = 2;
  } else if (a < 1.75f) {
    m = 3;
  } else if (a <= 2.5f) {
    m = 4;
  } else if (a < 3.5f) {
    m = 5;
  } else if (a <= 5.0f) {
    m = 6;
  } else {
    m = 7;
  }
  return static_cast<uint8_t>(sign | m);
}

KVC_HD float E2M1ToFloat(uint8_t c) {
  const uint32_t m = c & 7u;
  const uint32_t e = m >> 1;
  const float frac = (m & 1u) ? 0.5f : 0.0f;
  const float v = e == 0 ? frac : (1.0f + frac) * static_cast<float>(1u << (e - 1));
  return (c & 8u) ? -v : v;
}

}  // namespace kvc::kernels
