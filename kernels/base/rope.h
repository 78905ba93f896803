// RoPE pairing and angles shared by all backends. Angles are formed in double and reduced
// mod 2*pi before the float sin/cos, so deltas of a million positions keep full accuracy.
#pragma once

#include <math.h>

#include "kvc/kernels/host_device.h"
#include "kvc/kernels/ops.h"

namespace kvc::kernels::internal {

// Element indices (a, b) rotated together by frequency i, i in [0, rotary_dim / 2).
KVC_HD void RopePair(RopeStyle style, int rotary_dim, int i, int* a, int* b) {
  if (style == RopeStyle::kNeox) {
    *a = i;
    *b = i + rotary_dim / 2;
  } else {
    *a = 2 * i;
    *b = 2 * i + 1;
  }
}

KVC_HD void RopeSinCos(float theta, int rotary_dim, int i, int32_t delta, float* s, float* c) {
  const double inv_freq = pow(static_cast<double>(theta), -2.0 * i / rotary_dim);
  const double two_pi = 6.283185307179586476925286766559;
  const double angle = fmod(static_cast<double>(delta) * inv_freq, two_pi);
  *s = static_cast<float>(sin(angle));
  *c = static_cast<float>(cos(angle));
}

// Rotates d floats of one key in place by `delta` positions.
KVC_HD void RopeRotate(const RopeConfig& rope, int head_dim, int32_t delta, float* x) {
  const int rd = rope.rotary_dim == 0 ? head_dim : rope.rotary_dim;
  for (int i = 0; i < rd / 2; ++i) {
    int a, b;
    RopePair(rope.style, rd, i, &a, &b);
    float s, c;
    RopeSinCos(rope.theta, rd, i, delta, &s, &c);
    const float xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
  }
}

}  // namespace kvc::kernels::internal
