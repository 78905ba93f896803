// Faster partial kernel of paged decode attention for head_dim 64/128 and GQA groups <= 8,
// opt-in with KVC_CUDA_DECODE=fast until it has been validated and measured on a GPU (the
// general kernel in attention.cu stays the default). Same chunking and partial results as
// the general kernel, so the combine and weights kernels are shared. Differences:
//  - keys: 8 lanes per token, 4 tokens per warp step, each lane decoding a contiguous run of
//    d/8 elements with its group scale loaded once; dot products reduce over 8 lanes (3
//    shuffles per head for 4 tokens instead of 5 per head per token);
//  - values: a warp per 16-token slice, each lane a contiguous run of d/32 elements with
//    register accumulators per head, reduced across the 4 warps in shared memory, instead of
//    a thread per element decoding every token's element separately.
#include <math.h>

#include <cstdlib>
#include <cstring>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/decode_common.cuh"
#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTokensPerWarp = kDecodeChunk / kWarps;  // 16
constexpr int kMaxGroup = 8;

// Elements [j0, j0 + N) of a record; N divides every group size (16, 32, 64), so one scale.
// Same arithmetic as DequantizeElement.
template <int N>
__device__ __forceinline__ void DequantRun(StorageFormat f, int d, const uint8_t* rec, int j0,
                                           float (&out)[N]) {
  switch (f) {
    case StorageFormat::kF32:
#pragma unroll
      for (int n = 0; n < N; ++n) out[n] = LoadF32(rec + 4 * (j0 + n));
      return;
    case StorageFormat::kF16:
#pragma unroll
      for (int n = 0; n < N; ++n) out[n] = HalfToFloat(LoadU16(rec + 2 * (j0 + n)));
      return;
    case StorageFormat::kBF16:
#pragma unroll
      for (int n = 0; n < N; ++n) out[n] = BFloat16ToFloat(LoadU16(rec + 2 * (j0 + n)));
      return;
    case StorageFormat::kFp8E4M3:
    case StorageFormat::kInt8: {
      const float s = LoadF32(rec + d);
#pragma unroll
      for (int n = 0; n < N; ++n) {
        out[n] = f == StorageFormat::kInt8
                     ? static_cast<float>(static_cast<int8_t>(rec[j0 + n])) * s
                     : E4M3ToFloat(rec[j0 + n]) * s;
      }
      return;
    }
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64: {
      const int g = j0 / (f == StorageFormat::kInt4G32 ? 32 : 64);
      const float scale = HalfToFloat(LoadU16(rec + d / 2 + 4 * g));
      const float mn = HalfToFloat(LoadU16(rec + d / 2 + 4 * g + 2));
#pragma unroll
      for (int n = 0; n < N; n += 2) {
        const uint32_t byte = rec[(j0 + n) / 2];  // j0 and n even
        out[n] = static_cast<float>(byte & 15u) * scale + mn;
        out[n + 1] = static_cast<float>(byte >> 4) * scale + mn;
      }
      return;
    }
    case StorageFormat::kNvfp4: {
      const float eff =
          E4M3ToFloat(rec[d / 2 + j0 / 16]) * LoadF32(rec + Nvfp4TensorScaleOffset(d));
#pragma unroll
      for (int n = 0; n < N; n += 2) {
        const uint8_t byte = rec[(j0 + n) / 2];
        out[n] = E2M1ToFloat(byte & 15u) * eff;
        out[n + 1] = E2M1ToFloat(static_cast<uint8_t>(byte >> 4)) * eff;
      }
      return;
    }
  }
}

template <int D>
__global__ void DecodePartialFastKernel(DecodeAttentionArgs a, float scale, DecodeScratch w) {
  constexpr int EK = D / 8;   // key elements per lane (8 lanes per token)
  constexpr int EV = D / 32;  // value elements per lane (32 lanes per token)
  extern __shared__ float smem[];
  const int G = a.group_size;
  float* q = smem;                    // [G][D]
  float* p = q + G * D;               // [G][kDecodeChunk] logits, then exp
  float* red = p + G * kDecodeChunk;  // [kWarps][G][D] value partial sums
  __shared__ const uint8_t* krec[kDecodeChunk];
  __shared__ const uint8_t* vrec[kDecodeChunk];
  const int32_t lane = blockIdx.y, chunk = blockIdx.x;
  const int32_t n = a.lanes.num_tokens[lane];
  const int32_t t0 = chunk * kDecodeChunk;
  if (t0 >= n) return;
  const int len = n - t0 < kDecodeChunk ? n - t0 : kDecodeChunk;
  const StorageFormat f = a.arena.layout.format;
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    q[idx] = LoadElement(a.queries, a.dtype, static_cast<size_t>(lane) * G * D + idx);
  }
  if (threadIdx.x < len) {
    int32_t b, s;
    LaneTokenSlot(a.lanes, a.arena.layout.block_tokens, lane, t0 + threadIdx.x, &b, &s);
    krec[threadIdx.x] = KeyRecord(a.arena, b, s);
    vrec[threadIdx.x] = ValueRecord(a.arena, b, s);
  }
  __syncthreads();

  const int l = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int w_begin = warp * kTokensPerWarp;
  const int w_end = w_begin + kTokensPerWarp < len ? w_begin + kTokensPerWarp : len;
  // Keys: lanes 8s..8s+7 take token tb + s.
  const int sub = l >> 3, sl = l & 7;
  for (int tb = w_begin; tb < w_end; tb += 4) {  // warp-uniform bounds: shuffles stay converged
    const int t = tb + sub;
    const bool valid = t < w_end;
    float k[EK];
    if (valid) {
      DequantRun<EK>(f, D, krec[t], sl * EK, k);
    } else {
#pragma unroll
      for (int e = 0; e < EK; ++e) k[e] = 0.0f;
    }
    for (int g = 0; g < G; ++g) {
      const float* qg = q + g * D + sl * EK;
      float part = 0.0f;
#pragma unroll
      for (int e = 0; e < EK; ++e) part += qg[e] * k[e];
      part += __shfl_xor_sync(kFullMask, part, 4);
      part += __shfl_xor_sync(kFullMask, part, 2);
      part += __shfl_xor_sync(kFullMask, part, 1);
      if (sl == 0 && valid) {
        p[g * kDecodeChunk + t] = part * scale;
        if (w.logits != nullptr) {
          w.logits[(static_cast<size_t>(lane) * G + g) * a.lanes.max_tokens + t0 + t] =
              part * scale;
        }
      }
    }
  }
  __syncthreads();

  const size_t part_row = (static_cast<size_t>(lane) * w.chunks + chunk) * G;
  for (int g = warp; g < G; g += kWarps) {
    float m = -INFINITY;
    for (int t = l; t < len; t += 32) m = fmaxf(m, p[g * kDecodeChunk + t]);
    m = WarpMax(m);
    float sum = 0.0f;
    for (int t = l; t < len; t += 32) {
      const float e = expf(p[g * kDecodeChunk + t] - m);
      p[g * kDecodeChunk + t] = e;
      sum += e;
    }
    sum = WarpSum(sum);
    if (l == 0) {
      w.part_m[part_row + g] = m;
      w.part_l[part_row + g] = sum;
    }
  }
  __syncthreads();

  // Values: this warp's token slice, lane l owning elements [l * EV, l * EV + EV).
  float acc[kMaxGroup][EV];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int e = 0; e < EV; ++e) acc[g][e] = 0.0f;
  }
  for (int t = w_begin; t < w_end; ++t) {
    float v[EV];
    DequantRun<EV>(f, D, vrec[t], l * EV, v);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < G) {
        const float pg = p[g * kDecodeChunk + t];
#pragma unroll
        for (int e = 0; e < EV; ++e) acc[g][e] += pg * v[e];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < G) {
#pragma unroll
      for (int e = 0; e < EV; ++e) red[(warp * G + g) * D + l * EV + e] = acc[g][e];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) s += red[wi * G * D + idx];
    w.part_acc[part_row * D + idx] = s;  // (part_row + g) * D + j with idx = g * D + j
  }
}

}  // namespace

bool DecodeFastApplies(const DecodeAttentionArgs& a) {
  static const bool enabled = [] {
    const char* v = std::getenv("KVC_CUDA_DECODE");
    return v != nullptr && std::strcmp(v, "fast") == 0;
  }();
  const int d = a.arena.layout.head_dim;
  return enabled && (d == 64 || d == 128) && a.group_size <= kMaxGroup;
}

KernelStatus LaunchDecodePartialFast(const DecodeAttentionArgs& a, float scale,
                                     const DecodeScratch& w, cudaStream_t s) {
  const int d = a.arena.layout.head_dim, G = a.group_size;
  const size_t smem = (static_cast<size_t>(G) * d + static_cast<size_t>(G) * kDecodeChunk +
                       static_cast<size_t>(kWarps) * G * d) *
                      sizeof(float);
  const dim3 grid(w.chunks, a.lanes.num_lanes);
  if (d == 64) {
    DecodePartialFastKernel<64><<<grid, 32 * kWarps, smem, s>>>(a, scale, w);
  } else {
    DecodePartialFastKernel<128><<<grid, 32 * kWarps, smem, s>>>(a, scale, w);
  }
  return LaunchStatus();
}

}  // namespace kvc::kernels::cuda
