// Scalar FP8 E4M3 (OCP "FN": no infinities, max 448) and FP4 E2M1 conversions, identical on
// every backend (host and device). Quantization is round-to-nearest-even with saturation to
// the largest finite value ("satfinite"), as the hardware cvt instructions do.
#pragma once

#include <cstdint>

#include "kvc/kernels/host_device.h"

namespace kvc::kernels {

constexpr float kE4M3Max = 448.0f;
constexpr float kE2M1Max = 6.0f;

// float -> E4M3 code (sign in bit 7, 4 exponent bits with bias 7, 3 mantissa bits). Every
// path is computed and selected, so that element loops vectorize on the CPU.
KVC_HD uint8_t FloatToE4M3(float f) {
  const uint32_t x = FloatAsBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t a = x & 0x7fffffffu;
  // Normal: round the mantissa to 3 bits, ties to even, then rebias (127 -> 7).
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  const uint32_t normal = ((r >> 20) - (120u << 3)) & 0xffu;
  // Below 2^-6: subnormal codes count steps of 2^-9 (exact scaling); 8 = smallest normal.
  const uint32_t sub =
      static_cast<uint32_t>(RoundHalfEven(BitsAsFloat(a < 0x3c800000u ? a : 0u) * 512.0f));
  uint32_t c = a < 0x3c800000u ? sub : normal;
  c = (a >= 0x43e00000u || (a >= 0x3c800000u && r >= 0x43f00000u)) ? 0x7eu : c;  // >= 448 saturates
  c = a > 0x7f800000u ? 0x7fu : c;                                               // NaN stays NaN
  return static_cast<uint8_t>(sign | c);
}

// Selects only (vectorizes on the CPU; no table).
KVC_HD float E4M3ToFloat(uint8_t c) {
  const uint32_t u = c;
  const uint32_t e = (u >> 3) & 15u;
  const uint32_t m = u & 7u;
  const float sub = static_cast<float>(m) * (1.0f / 512.0f);
  const float normal = BitsAsFloat(((e + 120u) << 23) | (m << 20));
  uint32_t bits = FloatAsBits(e == 0 ? sub : normal);
  bits = (u & 0x7fu) == 0x7fu ? 0x7fc00000u : bits;  // NaN
  return BitsAsFloat(bits | ((u & 0x80u) << 24));
}

// float -> E2M1 code (sign in bit 3; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6). Ties go to the
// even code, e.g. 0.25 -> 0, 2.5 -> 2, 5 -> 4. Values beyond 6 saturate; NaN gives 0.
KVC_HD uint8_t FloatToE2M1(float f) {
  const uint32_t sign = (FloatAsBits(f) >> 28) & 8u;
  const float a = f < 0 ? -f : f;
  const uint32_t m = static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) +
                     static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a >= 1.75f) +
                     static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) +
                     static_cast<uint32_t>(a > 5.0f);
  return static_cast<uint8_t>(sign | m);
}

KVC_HD float E2M1ToFloat(uint8_t c) {
  const uint32_t m = c & 7u;
  const float v = m < 4 ? 0.5f * static_cast<float>(m)
                        : (m < 6 ? static_cast<float>(m - 2) : static_cast<float>(2 * m - 8));
  return (c & 8u) ? -v : v;
}

}  // namespace kvc::kernels
