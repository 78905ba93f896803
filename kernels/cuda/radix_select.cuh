// Exact radix selection over composite keys, shared by Select and AllocateBudgets: each token
// has a unique key (score?, position, index), so "the k-th smallest key" names one token and
// every backend keeps the same set as the reference.
#pragma once

#include <math.h>
#include <stdint.h>

namespace kvc::kernels::cuda {

__device__ __forceinline__ uint32_t OrderedFloat(float f) {
  if (isnan(f)) f = -INFINITY;  // NaN ranks lowest
  if (f == 0.0f) f = 0.0f;      // -0 ties with +0, as float comparison does
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Keys per token i: words (score_key?, pos_key, i), most significant first.
struct KeyView {
  const uint32_t* score;  // null for position-only keys
  const uint32_t* pos;
  __device__ int Words() const { return score != nullptr ? 3 : 2; }
  __device__ uint32_t Word(int i, int w) const {
    if (score == nullptr) ++w;
    return w == 0 ? score[i] : (w == 1 ? pos[i] : static_cast<uint32_t>(i));
  }
};

__device__ inline bool KeyLessEq(const KeyView& kv, int i, const uint32_t (&t)[3]) {
  for (int w = 0; w < kv.Words(); ++w) {
    const uint32_t x = kv.Word(i, w);
    if (x != t[w]) return x < t[w];
  }
  return true;
}

struct SelectShared {
  uint32_t hist[256];
  int digit, remaining;
};

// The key of rank k (0-based, ascending) among tokens with include(i), 8 bits per pass.
template <typename Include>
__device__ inline void KthSmallest(const KeyView& kv, int n, int k, Include include,
                                   SelectShared& sh, uint32_t (&out)[3]) {
  out[0] = out[1] = out[2] = 0;
  int remaining = k;
  for (int w = 0; w < kv.Words(); ++w) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (!include(i)) continue;
        bool match = true;
        for (int u = 0; u < w; ++u) match &= kv.Word(i, u) == out[u];
        const uint32_t x = kv.Word(i, w);
        if (shift < 24) match &= (x >> (shift + 8)) == (out[w] >> (shift + 8));
        if (match) atomicAdd(&sh.hist[(x >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int acc = 0, digit = 0;
        for (; digit < 255; ++digit) {
          if (acc + static_cast<int>(sh.hist[digit]) > remaining) break;
          acc += sh.hist[digit];
        }
        sh.digit = digit;
        sh.remaining = remaining - acc;
      }
      __syncthreads();
      out[w] |= static_cast<uint32_t>(sh.digit) << shift;
      remaining = sh.remaining;
      __syncthreads();
    }
  }
}

}  // namespace kvc::kernels::cuda
