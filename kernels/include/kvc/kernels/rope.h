// Rotary position embedding (RoPE) math shared by every backend (host and CUDA: KVC_HD) and
// by the reference worker, so that a key rotated in the engine and one re-rotated in the
// cache use the same frequencies. Frequencies and angles are formed in double and the angle
// is reduced mod 2*pi before the float sin/cos, so positions (or deltas) in the millions keep
// full accuracy. Plain C++17; no CUDA header.
#pragma once

#include <math.h>

#include <cstdint>

#include "kvc/kernels/host_device.h"

namespace kvc::kernels {

enum class RopeStyle : uint8_t {
  kNeox = 0,  // pairs (i, i + rotary_dim / 2) ("rotate half"; Llama, NeoX)
  kGptJ = 1,  // pairs (2i, 2i + 1) (interleaved; GPT-J)
};

struct RopeConfig {
  float theta = 10000.0f;  // base: inv_freq[i] = theta^(-2i / rotary_dim)
  int32_t rotary_dim = 0;  // leading dims rotated; 0 means head_dim; even
  RopeStyle style = RopeStyle::kNeox;
};

// Frequency of pair i in [0, rotary_dim / 2): theta^(-2i / rotary_dim), in double.
KVC_HD double RopeInvFrequency(double theta, int rotary_dim, int i) {
  return pow(theta, -2.0 * i / rotary_dim);
}

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

// sin and cos of the angle position * inv_freq(i), formed in double and reduced mod 2*pi.
KVC_HD void RopeSinCos(double theta, int rotary_dim, int i, int32_t position, float* s, float* c) {
  const double two_pi = 6.283185307179586476925286766559;
  const double angle =
      fmod(static_cast<double>(position) * RopeInvFrequency(theta, rotary_dim, i), two_pi);
  *s = static_cast<float>(sin(angle));
  *c = static_cast<float>(cos(angle));
}

// Rotates the first rotary_dim of head_dim floats of one head in place by `position`
// positions (an absolute position for RoPE itself, a delta to move an already rotated key).
KVC_HD void RopeRotate(const RopeConfig& rope, int head_dim, int32_t position, float* x) {
  const int rd = rope.rotary_dim == 0 ? head_dim : rope.rotary_dim;
  for (int i = 0; i < rd / 2; ++i) {
    int a, b;
    RopePair(rope.style, rd, i, &a, &b);
    float s, c;
    RopeSinCos(rope.theta, rd, i, position, &s, &c);
    const float xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
  }
}

}  // namespace kvc::kernels
