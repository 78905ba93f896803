// CUDA SnapKV scoring and H2O accumulation. SnapKV runs in three passes so that the
// [window x tokens] attention matrix is never stored: (1) per key tile, logits of every
// window query and their tile max / sum-exp; (2) a combine to the global softmax max/sum of
// each query row; (3) logits again, turned into probabilities and summed per query head
// into votes (each thread owns one token, so no atomics). Pooling and the GQA mean follow.
#include <math.h>

#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::cuda {
namespace {

constexpr int kThreads = 128;

struct SnapTiles {
  int tokens;  // keys per block
  int rows;    // query rows per tile
  size_t SharedBytes(int d) const {
    return (static_cast<size_t>(tokens) * (d + 1) + static_cast<size_t>(rows) * d +
            static_cast<size_t>(rows) * tokens) *
               sizeof(float) +
           tokens * sizeof(int32_t);
  }
};
inline SnapTiles TilesFor(int d) {
  return SnapTiles{d <= 64 ? 64 : 4096 / d, d <= 64 ? 32 : 2048 / d};
}

// kVotes false: writes tile (max, sum-exp) per query row. true: adds probabilities to votes.
template <bool kVotes>
__global__ void SnapKvTileKernel(SnapKvScoreArgs a, SnapTiles tiles, float scale, int num_chunks,
                                 float2* partial, const float2* stats, float* votes) {
  extern __shared__ float smem[];
  const int d = a.arena.layout.head_dim;
  const int T = tiles.tokens, QT = tiles.rows;
  float* keys = smem;                                  // [T][d + 1]
  float* q = keys + static_cast<size_t>(T) * (d + 1);  // [QT][d]
  float* logits = q + static_cast<size_t>(QT) * d;     // [QT][T]
  int32_t* kpos = reinterpret_cast<int32_t*>(logits + static_cast<size_t>(QT) * T);
  const int32_t lane = blockIdx.y, chunk = blockIdx.x;
  const int32_t n = a.lanes.num_tokens[lane];
  const int32_t t0 = chunk * T;
  if (t0 >= n) return;
  const int bt = a.arena.layout.block_tokens;
  const StorageFormat f = a.arena.layout.format;
  for (int idx = threadIdx.x; idx < T * d; idx += blockDim.x) {
    const int tok = idx / d, j = idx % d;
    float v = 0.0f;
    if (t0 + tok < n) {
      int32_t b, s;
      LaneTokenSlot(a.lanes, bt, lane, t0 + tok, &b, &s);
      v = DequantizeElement(f, d, KeyRecord(a.arena, b, s), j);
      if (j == 0)
        kpos[tok] = a.key_positions[static_cast<size_t>(lane) * a.lanes.max_tokens + t0 + tok];
    }
    keys[tok * (d + 1) + j] = v;
  }
  const int R = a.group_size * a.window;
  for (int r0 = 0; r0 < R; r0 += QT) {
    __syncthreads();  // keys loaded / previous tile consumed
    for (int idx = threadIdx.x; idx < QT * d; idx += blockDim.x) {
      const int row = r0 + idx / d;
      q[idx] = row < R ? LoadElement(a.queries, a.query_dtype,
                                     (static_cast<size_t>(lane) * R + row) * d + idx % d)
                       : 0.0f;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < QT * T; p += blockDim.x) {
      const int tok = p % T, rr = p / T, row = r0 + rr;
      float l = -INFINITY;
      if (row < R && t0 + tok < n &&
          kpos[tok] <= a.query_positions[static_cast<size_t>(lane) * a.window + row % a.window]) {
        const float* k = keys + tok * (d + 1);
        const float* qq = q + rr * d;
        float dot = 0.0f;
        for (int j = 0; j < d; ++j) dot += qq[j] * k[j];
        l = dot * scale;
      }
      logits[rr * T + tok] = l;
    }
    __syncthreads();
    if (!kVotes) {
      const int rr = threadIdx.x;
      if (rr < QT && r0 + rr < R) {
        float m = -INFINITY;
        for (int tok = 0; tok < T; ++tok) m = fmaxf(m, logits[rr * T + tok]);
        float s = 0.0f;
        if (m != -INFINITY) {
          for (int tok = 0; tok < T; ++tok) s += expf(logits[rr * T + tok] - m);
        }
        partial[(static_cast<size_t>(lane) * num_chunks + chunk) * R + r0 + rr] = make_float2(m, s);
      }
    } else {
      const int tok = threadIdx.x;
      if (tok < T && t0 + tok < n) {
        int g = (r0) / a.window;
        float acc = 0.0f;
        for (int rr = 0; rr < QT && r0 + rr < R; ++rr) {
          const int row = r0 + rr;
          if (row / a.window != g) {
            votes[(static_cast<size_t>(lane) * a.group_size + g) * a.lanes.max_tokens + t0 + tok] +=
                acc;
            acc = 0.0f;
            g = row / a.window;
          }
          const float2 st = stats[static_cast<size_t>(lane) * R + row];
          if (st.x != -INFINITY) acc += expf(logits[rr * T + tok] - st.x) / st.y;
        }
        votes[(static_cast<size_t>(lane) * a.group_size + g) * a.lanes.max_tokens + t0 + tok] +=
            acc;
      }
    }
  }
}

__global__ void SnapKvCombineKernel(SnapKvScoreArgs a, int tile_tokens, int num_chunks,
                                    const float2* partial, float2* stats) {
  const int R = a.group_size * a.window;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(a.lanes.num_lanes) * R) return;
  const int32_t lane = static_cast<int32_t>(i / R);
  const int row = static_cast<int>(i % R);
  const int chunks = (a.lanes.num_tokens[lane] + tile_tokens - 1) / tile_tokens;
  float m = -INFINITY;
  for (int c = 0; c < chunks; ++c)
    m = fmaxf(m, partial[(static_cast<size_t>(lane) * num_chunks + c) * R + row].x);
  float s = 0.0f;
  if (m != -INFINITY) {
    for (int c = 0; c < chunks; ++c) {
      const float2 p = partial[(static_cast<size_t>(lane) * num_chunks + c) * R + row];
      if (p.x != -INFINITY) s += p.y * expf(p.x - m);
    }
  }
  stats[i] = make_float2(m, s);
}

__global__ void SnapKvPoolKernel(SnapKvScoreArgs a, const float* votes) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t n = a.lanes.num_tokens[lane];
  if (t >= n) return;
  const int32_t pooled_len = n - a.window > 0 ? n - a.window : 0;
  const int half = a.pool_kernel / 2;
  float score = 0.0f;
  for (int g = 0; g < a.group_size; ++g) {
    const float* v = votes + (static_cast<size_t>(lane) * a.group_size + g) * a.lanes.max_tokens;
    float x = v[t];
    if (t < pooled_len && a.pool_kernel > 1) {
      const int32_t lo = t - half > 0 ? t - half : 0;
      const int32_t hi = t + half < pooled_len - 1 ? t + half : pooled_len - 1;
      x = a.pool == PoolKind::kMax ? v[lo] : 0.0f;
      for (int32_t u = lo; u <= hi; ++u) x = a.pool == PoolKind::kMax ? fmaxf(x, v[u]) : x + v[u];
      if (a.pool == PoolKind::kAvg) x /= static_cast<float>(a.pool_kernel);
    }
    score += x / static_cast<float>(a.group_size);
  }
  float* dst = a.scores + static_cast<size_t>(lane) * a.lanes.max_tokens + t;
  *dst = a.mode == ScoreMode::kAccumulate ? *dst + score : score;
}

__global__ void AccumulateScoresKernel(AccumulateScoresArgs a) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.num_tokens[lane]) return;
  float sum = 0.0f;
  for (int g = 0; g < a.group_size; ++g)
    sum += a.weights[(static_cast<size_t>(lane) * a.group_size + g) * a.max_tokens + t];
  a.scores[static_cast<size_t>(lane) * a.max_tokens + t] += sum / static_cast<float>(a.group_size);
}

}  // namespace

KernelStatus LaunchSnapKvScore(const SnapKvScoreArgs& a, StreamHandle stream) {
  if (a.lanes.num_lanes == 0 || a.lanes.max_tokens == 0) return KernelStatus::Ok();
  if (a.lanes.num_lanes > 65535)
    return KernelStatus::Unsupported("CUDA SnapKV: at most 65535 lanes per call");
  const cudaStream_t s = ToStream(stream);
  const int d = a.arena.layout.head_dim;
  const SnapTiles tiles = TilesFor(d);
  const int num_chunks = (a.lanes.max_tokens + tiles.tokens - 1) / tiles.tokens;
  const int64_t R = static_cast<int64_t>(a.group_size) * a.window;
  const float scale = AttentionScale(d);
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  float2* partial =
      scratch.Alloc<float2>(static_cast<size_t>(a.lanes.num_lanes) * num_chunks * R, &status);
  float2* stats = scratch.Alloc<float2>(static_cast<size_t>(a.lanes.num_lanes) * R, &status);
  const size_t vote_count =
      static_cast<size_t>(a.lanes.num_lanes) * a.group_size * a.lanes.max_tokens;
  float* votes = scratch.Alloc<float>(vote_count, &status);
  KVC_KERNEL_RETURN_IF_ERROR(status);
  KVC_KERNEL_RETURN_IF_ERROR(FromCuda(cudaMemsetAsync(votes, 0, vote_count * sizeof(float), s)));
  const size_t smem = tiles.SharedBytes(d);
  KVC_KERNEL_RETURN_IF_ERROR(FromCuda(
      cudaFuncSetAttribute(SnapKvTileKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem))));
  KVC_KERNEL_RETURN_IF_ERROR(FromCuda(
      cudaFuncSetAttribute(SnapKvTileKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem))));
  const dim3 grid(num_chunks, a.lanes.num_lanes);
  SnapKvTileKernel<false>
      <<<grid, kThreads, smem, s>>>(a, tiles, scale, num_chunks, partial, stats, votes);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  SnapKvCombineKernel<<<Blocks(a.lanes.num_lanes * R, 256), 256, 0, s>>>(
      a, tiles.tokens, num_chunks, partial, stats);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  SnapKvTileKernel<true>
      <<<grid, kThreads, smem, s>>>(a, tiles, scale, num_chunks, partial, stats, votes);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  SnapKvPoolKernel<<<dim3(Blocks(a.lanes.max_tokens, 256), a.lanes.num_lanes), 256, 0, s>>>(a,
                                                                                            votes);
  return LaunchStatus();
}

KernelStatus LaunchAccumulateScores(const AccumulateScoresArgs& a, StreamHandle stream) {
  if (a.num_lanes == 0 || a.max_tokens == 0) return KernelStatus::Ok();
  if (a.num_lanes > 65535) return KernelStatus::Unsupported("CUDA: at most 65535 lanes per call");
  AccumulateScoresKernel<<<dim3(Blocks(a.max_tokens, 256), a.num_lanes), 256, 0,
                           ToStream(stream)>>>(a);
  return LaunchStatus();
}

}  // namespace kvc::kernels::cuda
