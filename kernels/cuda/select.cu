// CUDA selection: one block per lane, exact radix select over unique composite keys, so the
// kept set equals the reference's (score desc, then position asc, then stored index).
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"

namespace kvc::kernels::cuda {
namespace {

constexpr int kSelectThreads = 256;

__device__ __forceinline__ uint32_t OrderedFloat(float f) {
  if (isnan(f)) f = -INFINITY;  // NaN ranks lowest
  if (f == 0.0f) f = 0.0f;      // -0 ties with +0, as float comparison does
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void SelectPrepKernel(SelectArgs a, uint32_t* pos_key, uint32_t* score_key) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.max_tokens) return;
  const size_t i = static_cast<size_t>(lane) * a.max_tokens + t;
  a.keep[i] = 0;
  if (t >= a.num_tokens[lane]) return;
  pos_key[i] = static_cast<uint32_t>(a.positions[i]) ^ 0x80000000u;
  score_key[i] = ~OrderedFloat(a.scores[i]);  // ascending key = descending score
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

__device__ bool KeyLessEq(const KeyView& kv, int i, const uint32_t (&t)[3]) {
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
__device__ void KthSmallest(const KeyView& kv, int n, int k, Include include, SelectShared& sh,
                            uint32_t (&out)[3]) {
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

__global__ void SelectKernel(SelectArgs a, const uint32_t* pos_key, const uint32_t* score_key) {
  __shared__ SelectShared sh;
  const int32_t lane = blockIdx.x;
  const int32_t n = a.num_tokens[lane];
  const size_t row = static_cast<size_t>(lane) * a.max_tokens;
  uint8_t* keep = a.keep + row;
  const int budget = a.budget;
  if (static_cast<int64_t>(n) <= static_cast<int64_t>(a.sinks) + a.recent + budget) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) keep[i] = 1;
    return;
  }
  const KeyView by_pos{nullptr, pos_key + row};
  const KeyView by_score{score_key + row, pos_key + row};
  uint32_t sink_t[3], recent_t[3], heavy_t[3];
  auto all = [](int) { return true; };
  if (a.sinks > 0) KthSmallest(by_pos, n, a.sinks - 1, all, sh, sink_t);
  if (a.recent > 0) KthSmallest(by_pos, n, n - a.recent, all, sh, recent_t);
  auto is_sink = [&](int i) { return a.sinks > 0 && KeyLessEq(by_pos, i, sink_t); };
  auto is_recent = [&](int i) {
    if (a.recent <= 0) return false;
    // pos key >= recent threshold <=> not (key < threshold)
    for (int w = 0; w < 2; ++w) {
      const uint32_t x = by_pos.Word(i, w);
      if (x != recent_t[w]) return x > recent_t[w];
    }
    return true;
  };
  auto rest = [&](int i) { return !is_sink(i) && !is_recent(i); };
  if (budget > 0) KthSmallest(by_score, n, budget - 1, rest, sh, heavy_t);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const bool heavy = budget > 0 && rest(i) && KeyLessEq(by_score, i, heavy_t);
    keep[i] = (is_sink(i) || is_recent(i) || heavy) ? 1 : 0;
  }
}

}  // namespace

KernelStatus LaunchSelect(const SelectArgs& a, StreamHandle stream) {
  // max_tokens == 0: every lane is empty and keep has no entries (no grid to launch).
  if (a.num_lanes == 0 || a.max_tokens == 0) return KernelStatus::Ok();
  if (a.num_lanes > 65535) return KernelStatus::Unsupported("CUDA: at most 65535 lanes per call");
  const cudaStream_t s = ToStream(stream);
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  const size_t count = static_cast<size_t>(a.num_lanes) * a.max_tokens;
  uint32_t* pos_key = scratch.Alloc<uint32_t>(count, &status);
  uint32_t* score_key = scratch.Alloc<uint32_t>(count, &status);
  KVC_KERNEL_RETURN_IF_ERROR(status);
  SelectPrepKernel<<<dim3(Blocks(a.max_tokens, 256), a.num_lanes), 256, 0, s>>>(a, pos_key,
                                                                                score_key);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  SelectKernel<<<a.num_lanes, kSelectThreads, 0, s>>>(a, pos_key, score_key);
  return LaunchStatus();
}

}  // namespace kvc::kernels::cuda
