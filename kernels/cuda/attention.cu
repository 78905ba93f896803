// CUDA paged decode attention, split-K ("flash-decoding"): a block per (lane, chunk of 64
// stored tokens) dequantizes keys in registers (warps, lanes own elements l + 32k), keeps
// the chunk's logits in shared memory, and produces per query head a max, a sum of exp and
// an fp32 weighted value sum; a combine kernel rescales the chunks by exp(m_c - M). Weights
// (for H2O) are normalized afterwards from the stored logits.
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "cuda/decode_common.cuh"
#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::cuda {
namespace {

constexpr int kChunk = kDecodeChunk;
constexpr int kThreads = 128;
constexpr int kTokensPerStep = 4;  // tokens a warp loads before reducing (memory parallelism)
constexpr int kGroupTile = 8;      // query heads accumulated at once in the value pass

template <int KMAX>
__global__ void DecodePartialKernel(DecodeAttentionArgs a, float scale, DecodeScratch w) {
  extern __shared__ float smem[];
  const int d = a.arena.layout.head_dim, G = a.group_size;
  float* q = smem;                            // [G][d]
  float* p = q + static_cast<size_t>(G) * d;  // [G][kChunk] logits, then exp
  __shared__ const uint8_t* krec[kChunk];
  __shared__ const uint8_t* vrec[kChunk];
  const int32_t lane = blockIdx.y, chunk = blockIdx.x;
  const int32_t n = a.lanes.num_tokens[lane];
  const int32_t t0 = chunk * kChunk;
  if (t0 >= n) return;
  const int len = n - t0 < kChunk ? n - t0 : kChunk;
  const StorageFormat f = a.arena.layout.format;
  for (int idx = threadIdx.x; idx < G * d; idx += blockDim.x) {
    q[idx] = LoadElement(a.queries, a.dtype, static_cast<size_t>(lane) * G * d + idx);
  }
  if (threadIdx.x < len) {
    int32_t b, s;
    LaneTokenSlot(a.lanes, a.arena.layout.block_tokens, lane, t0 + threadIdx.x, &b, &s);
    krec[threadIdx.x] = KeyRecord(a.arena, b, s);
    vrec[threadIdx.x] = ValueRecord(a.arena, b, s);
  }
  __syncthreads();

  const int l = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int tb = warp * kTokensPerStep; tb < len; tb += nwarps * kTokensPerStep) {
    float kv[kTokensPerStep][KMAX];
#pragma unroll
    for (int u = 0; u < kTokensPerStep; ++u) {
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        const int j = l + 32 * k;
        kv[u][k] = (tb + u < len && j < d) ? DequantizeElement(f, d, krec[tb + u], j) : 0.0f;
      }
    }
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int u = 0; u < kTokensPerStep; ++u) {
        float part = 0.0f;
#pragma unroll
        for (int k = 0; k < KMAX; ++k) {
          const int j = l + 32 * k;
          if (j < d) part += q[g * d + j] * kv[u][k];
        }
        const float dot = WarpSum(part);
        if (l == 0 && tb + u < len) {
          p[g * kChunk + tb + u] = dot * scale;
          if (w.logits != nullptr)
            w.logits[(static_cast<size_t>(lane) * G + g) * a.lanes.max_tokens + t0 + tb + u] =
                dot * scale;
        }
      }
    }
  }
  __syncthreads();

  const size_t part_row = (static_cast<size_t>(lane) * w.chunks + chunk) * G;
  for (int g = warp; g < G; g += nwarps) {
    float m = -INFINITY;
    for (int t = l; t < len; t += 32) m = fmaxf(m, p[g * kChunk + t]);
    m = WarpMax(m);
    float sum = 0.0f;
    for (int t = l; t < len; t += 32) {
      const float e = expf(p[g * kChunk + t] - m);
      p[g * kChunk + t] = e;
      sum += e;
    }
    sum = WarpSum(sum);
    if (l == 0) {
      w.part_m[part_row + g] = m;
      w.part_l[part_row + g] = sum;
    }
  }
  __syncthreads();

  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    for (int g0 = 0; g0 < G; g0 += kGroupTile) {
      float acc[kGroupTile];
#pragma unroll
      for (int gg = 0; gg < kGroupTile; ++gg) acc[gg] = 0.0f;
#pragma unroll 4
      for (int t = 0; t < len; ++t) {
        const float v = DequantizeElement(f, d, vrec[t], j);
#pragma unroll
        for (int gg = 0; gg < kGroupTile; ++gg) {
          if (g0 + gg < G) acc[gg] += p[(g0 + gg) * kChunk + t] * v;
        }
      }
#pragma unroll
      for (int gg = 0; gg < kGroupTile; ++gg) {
        if (g0 + gg < G) w.part_acc[(part_row + g0 + gg) * d + j] = acc[gg];
      }
    }
  }
}

__global__ void DecodeCombineKernel(DecodeAttentionArgs a, DecodeScratch w) {
  const int G = a.group_size, d = a.arena.layout.head_dim;
  const int64_t row = blockIdx.x;  // lane * G + g
  const int32_t lane = static_cast<int32_t>(row / G);
  const int g = static_cast<int>(row % G);
  const int chunks = (a.lanes.num_tokens[lane] + kChunk - 1) / kChunk;
  const size_t base = static_cast<size_t>(lane) * w.chunks * G + g;  // + c * G
  float m = -INFINITY;
  for (int c = 0; c < chunks; ++c) m = fmaxf(m, w.part_m[base + static_cast<size_t>(c) * G]);
  float sum = 0.0f;
  for (int c = 0; c < chunks; ++c)
    sum += w.part_l[base + static_cast<size_t>(c) * G] *
           expf(w.part_m[base + static_cast<size_t>(c) * G] - m);
  const float inv = sum > 0 ? 1.0f / sum : 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.0f;
    for (int c = 0; c < chunks; ++c) {
      const size_t i = base + static_cast<size_t>(c) * G;
      acc += w.part_acc[i * d + j] * expf(w.part_m[i] - m);
    }
    StoreElement(a.out, a.dtype, static_cast<size_t>(row) * d + j, acc * inv);
  }
  if (threadIdx.x == 0) {
    w.stats[row] = make_float2(m, sum);
    if (a.lse != nullptr) a.lse[row] = sum > 0 ? m + logf(sum) : -INFINITY;
  }
}

__global__ void DecodeWeightsKernel(DecodeAttentionArgs a, DecodeScratch w) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.lanes.num_tokens[lane]) return;
  const int G = a.group_size;
  float mean = 0.0f;
  for (int g = 0; g < G; ++g) {
    const size_t row = static_cast<size_t>(lane) * G + g;
    const float2 st = w.stats[row];
    const float prob = expf(w.logits[row * a.lanes.max_tokens + t] - st.x) / st.y;
    if (a.weights != nullptr) a.weights[row * a.lanes.max_tokens + t] = prob;
    mean += prob / static_cast<float>(G);
  }
  if (a.scores != nullptr) a.scores[static_cast<size_t>(lane) * a.lanes.max_tokens + t] += mean;
}

}  // namespace

KernelStatus LaunchDecodeAttention(const DecodeAttentionArgs& a, StreamHandle stream) {
  if (a.lanes.num_lanes == 0) return KernelStatus::Ok();
  if (a.lanes.num_lanes > 65535)
    return KernelStatus::Unsupported("CUDA: at most 65535 lanes per call");
  const int d = a.arena.layout.head_dim, G = a.group_size;
  const size_t smem = static_cast<size_t>(G) * (d + kChunk) * sizeof(float);
  if (smem > 160 * 1024)
    return KernelStatus::Unsupported("CUDA decode: group_size * (head_dim + 64) must be <= 40960");
  const cudaStream_t s = ToStream(stream);
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  DecodeScratch w;
  w.chunks = (a.lanes.max_tokens + kChunk - 1) / kChunk;
  const size_t parts = static_cast<size_t>(a.lanes.num_lanes) * (w.chunks > 0 ? w.chunks : 1) * G;
  w.part_m = scratch.Alloc<float>(parts, &status);
  w.part_l = scratch.Alloc<float>(parts, &status);
  w.part_acc = scratch.Alloc<float>(parts * d, &status);
  w.stats = scratch.Alloc<float2>(static_cast<size_t>(a.lanes.num_lanes) * G, &status);
  const bool need_logits = a.weights != nullptr || a.scores != nullptr;
  w.logits =
      need_logits
          ? (a.weights != nullptr
                 ? a.weights
                 : scratch.Alloc<float>(
                       static_cast<size_t>(a.lanes.num_lanes) * G * a.lanes.max_tokens, &status))
          : nullptr;
  KVC_KERNEL_RETURN_IF_ERROR(status);
  const float scale = AttentionScale(d);
  if (w.chunks > 0 && DecodeFastApplies(a)) {
    KVC_KERNEL_RETURN_IF_ERROR(LaunchDecodePartialFast(a, scale, w, s));
  } else if (w.chunks > 0) {
    KVC_KERNEL_RETURN_IF_ERROR(DispatchHeadDim(d, [&](auto kmax) {
      const auto kernel = DecodePartialKernel<decltype(kmax)::value>;
      if (smem > 40 * 1024) {  // above the default 48 KiB once static shared memory is added
        // The 160 KiB bound above fits sm_80/sm_90 (227 KiB per block); sm_86/sm_89 allow
        // about 99 KiB, so check this device's opt-in limit and say so instead of failing
        // the launch with an internal error.
        size_t limit = 0;
        KVC_KERNEL_RETURN_IF_ERROR(MaxDynamicSharedBytes(kernel, &limit));
        if (smem > limit) {
          return KernelStatus::Unsupported(
              "CUDA decode: group_size * (head_dim + 64) * 4 bytes exceeds this GPU's shared "
              "memory per block");
        }
        KVC_KERNEL_RETURN_IF_ERROR(FromCuda(cudaFuncSetAttribute(
            kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem))));
      }
      kernel<<<dim3(w.chunks, a.lanes.num_lanes), kThreads, smem, s>>>(a, scale, w);
      return LaunchStatus();
    }));
  }
  DecodeCombineKernel<<<static_cast<unsigned>(a.lanes.num_lanes * G), kThreads, 0, s>>>(a, w);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  if (need_logits && a.lanes.max_tokens > 0) {
    DecodeWeightsKernel<<<dim3(Blocks(a.lanes.max_tokens, 256), a.lanes.num_lanes), 256, 0, s>>>(a,
                                                                                                 w);
    KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  }
  return KernelStatus::Ok();
}

}  // namespace kvc::kernels::cuda
