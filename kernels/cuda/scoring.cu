// CUDA SnapKV and Expected Attention scoring and H2O accumulation. SnapKV runs in three
// passes so that the [window x tokens] attention matrix is never stored: (1) per key tile,
// logits of every window query and their tile max / sum-exp; (2) a combine to the global
// softmax max/sum of each query row; (3) logits again, turned into probabilities and summed
// per query head into votes (each thread owns one token, so no atomics). Pooling and the GQA
// mean follow. Expected Attention: (1) per key tile, every head's logit (mean term and
// quadratic form, the covariance staged through shared memory a few rows at a time) and the
// value norms, into scratch; (2) a block per (head, lane) reduces the softmax max and sum;
// (3) one thread per token forms the group mean times the value norm.
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

// Expected Attention tiles: `tokens` keys per block (kThreads / tokens threads per key) and
// `cov_rows` covariance rows staged in shared memory per step. At most ~44 KiB of shared
// memory for head_dim 512, so no opt-in attribute is needed.
struct ExpectedTiles {
  int tokens;
  int cov_rows;
  size_t SharedBytes(int d) const {
    return (static_cast<size_t>(tokens) * (d + 1) + d + static_cast<size_t>(cov_rows) * d +
            2 * kThreads) *
               sizeof(float) +
           tokens * sizeof(int32_t);
  }
};
inline ExpectedTiles ExpectedTilesFor(int d) {
  const int rows = 2048 / d < d ? 2048 / d : d;
  return ExpectedTiles{d <= 256 ? 32 : 16, rows > 0 ? rows : 1};
}

// Pass 1: the logits of every query head for one tile of a lane's keys, -infinity for a key
// below min_position, in logits [lane][g][max_tokens]; ||v||_2 in vnorm [lane][max_tokens].
// Thread (tok, r) = (threadIdx.x % T, threadIdx.x / T) takes key tok's elements / covariance
// rows r, r + P, ... (P = threads per key); the P partial sums are added in fixed order.
__global__ void ExpectedLogitsKernel(ExpectedAttentionScoreArgs a, ExpectedTiles tiles, float scale,
                                     float quad_scale, float* logits, float* vnorm) {
  extern __shared__ float smem[];
  const int d = a.arena.layout.head_dim, G = a.group_size;
  const int T = tiles.tokens, RI = tiles.cov_rows;
  float* keys = smem;                                                // [T][d + 1]
  float* mean = keys + static_cast<size_t>(T) * (d + 1);             // [d]
  float* cov = mean + d;                                             // [RI][d]
  float* part_dot = cov + static_cast<size_t>(RI) * d;               // [kThreads]
  float* part_quad = part_dot + kThreads;                            // [kThreads]
  int32_t* kpos = reinterpret_cast<int32_t*>(part_quad + kThreads);  // [T]
  const int32_t lane = blockIdx.y;
  const int32_t n = a.lanes.num_tokens[lane];
  const int32_t t0 = blockIdx.x * T;
  if (t0 >= n) return;
  const int bt = a.arena.layout.block_tokens;
  const StorageFormat f = a.arena.layout.format;
  const size_t row0 = static_cast<size_t>(lane) * a.lanes.max_tokens;
  for (int idx = threadIdx.x; idx < T * d; idx += blockDim.x) {
    const int tok = idx / d, j = idx % d;
    float v = 0.0f;
    if (t0 + tok < n) {
      int32_t b, s;
      LaneTokenSlot(a.lanes, bt, lane, t0 + tok, &b, &s);
      v = DequantizeElement(f, d, KeyRecord(a.arena, b, s), j);
    }
    keys[tok * (d + 1) + j] = v;
  }
  for (int tok = threadIdx.x; tok < T; tok += blockDim.x)
    kpos[tok] = t0 + tok < n ? a.key_positions[row0 + t0 + tok] : 0;
  if (a.value_norm) {  // a warp per value record, lanes own elements l + 32k
    const int l = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int tok = warp; tok < T && t0 + tok < n; tok += nwarps) {
      int32_t b, s;
      LaneTokenSlot(a.lanes, bt, lane, t0 + tok, &b, &s);
      const uint8_t* rec = ValueRecord(a.arena, b, s);
      float sq = 0.0f;
      for (int j = l; j < d; j += 32) {
        const float x = DequantizeElement(f, d, rec, j);
        sq += x * x;
      }
      sq = WarpSum(sq);
      if (l == 0) vnorm[row0 + t0 + tok] = sqrtf(sq);
    }
  }
  const int P = blockDim.x / T;
  const int tok = threadIdx.x % T, r = threadIdx.x / T;
  const float* k = keys + tok * (d + 1);
  for (int g = 0; g < G; ++g) {
    const size_t head = static_cast<size_t>(lane) * G + g;
    __syncthreads();  // keys loaded / the previous head's mean and partials consumed
    for (int j = threadIdx.x; j < d; j += blockDim.x) mean[j] = a.mean[head * d + j];
    __syncthreads();
    float dot = 0.0f, quad = 0.0f;
    for (int j = r; j < d; j += P) dot += k[j] * mean[j];
    if (a.cov != nullptr) {
      const float* c = a.cov + head * d * d;
      for (int i0 = 0; i0 < d; i0 += RI) {
        const int rows = d - i0 < RI ? d - i0 : RI;
        __syncthreads();  // the previous rows consumed
        for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x)
          cov[idx] = c[static_cast<size_t>(i0) * d + idx];
        __syncthreads();
        for (int i = r; i < rows; i += P) {  // (cov k)_i, then k_i (cov k)_i
          const float* crow = cov + static_cast<size_t>(i) * d;
          float w = 0.0f;
          for (int j = 0; j < d; ++j) w += crow[j] * k[j];
          quad += k[i0 + i] * w;
        }
      }
    }
    part_dot[threadIdx.x] = dot;
    part_quad[threadIdx.x] = quad;
    __syncthreads();
    if (threadIdx.x < T && t0 + static_cast<int32_t>(threadIdx.x) < n) {
      float sd = 0.0f, sq = 0.0f;
      for (int rr = 0; rr < P; ++rr) {
        sd += part_dot[rr * T + threadIdx.x];
        sq += part_quad[rr * T + threadIdx.x];
      }
      logits[head * a.lanes.max_tokens + t0 + threadIdx.x] =
          kpos[threadIdx.x] >= a.min_position ? sd * scale + sq * quad_scale : -INFINITY;
    }
  }
}

// op over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <typename Op>
__device__ float BlockReduce(float v, Op op, float* red) {
  v = WarpReduce<32>(v, op);
  __syncthreads();  // red free (an earlier reduction has been read)
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) r = op(r, red[w]);
  return r;
}

// Pass 2: softmax max and sum per (query head, lane) over the lane's unmasked logits.
__global__ void ExpectedStatsKernel(ExpectedAttentionScoreArgs a, const float* logits,
                                    float2* stats) {
  __shared__ float red[32];
  const int g = blockIdx.x;
  const int32_t lane = blockIdx.y;
  const int32_t n = a.lanes.num_tokens[lane];
  const size_t head = static_cast<size_t>(lane) * a.group_size + g;
  const float* lg = logits + head * a.lanes.max_tokens;
  float m = -INFINITY;
  for (int32_t t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, lg[t]);
  m = BlockReduce(m, FMaxOp{}, red);
  float s = 0.0f;
  if (m != -INFINITY) {
    for (int32_t t = threadIdx.x; t < n; t += blockDim.x) s += expf(lg[t] - m);
  }
  s = BlockReduce(s, SumOp{}, red);
  if (threadIdx.x == 0) stats[head] = make_float2(m, s);
}

// Pass 3: score = mean over the group of the probabilities, times ||v||; 0 below min_position.
__global__ void ExpectedScoresKernel(ExpectedAttentionScoreArgs a, const float* logits,
                                     const float* vnorm, const float2* stats) {
  const int32_t lane = blockIdx.y;
  const int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.lanes.num_tokens[lane]) return;
  const size_t row = static_cast<size_t>(lane) * a.lanes.max_tokens;
  float score = 0.0f;
  if (a.key_positions[row + t] >= a.min_position) {
    for (int g = 0; g < a.group_size; ++g) {
      const size_t head = static_cast<size_t>(lane) * a.group_size + g;
      const float2 st = stats[head];
      if (st.x != -INFINITY)
        score += expf(logits[head * a.lanes.max_tokens + t] - st.x) / st.y /
                 static_cast<float>(a.group_size);
    }
    if (a.value_norm) score *= vnorm[row + t];
  }
  a.scores[row + t] = score;
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

KernelStatus LaunchExpectedAttentionScore(const ExpectedAttentionScoreArgs& a,
                                          StreamHandle stream) {
  if (a.lanes.num_lanes == 0 || a.lanes.max_tokens == 0) return KernelStatus::Ok();
  if (a.lanes.num_lanes > 65535)
    return KernelStatus::Unsupported("CUDA Expected Attention: at most 65535 lanes per call");
  const cudaStream_t s = ToStream(stream);
  const int d = a.arena.layout.head_dim;
  const ExpectedTiles tiles = ExpectedTilesFor(d);
  const int num_chunks = (a.lanes.max_tokens + tiles.tokens - 1) / tiles.tokens;
  const size_t heads = static_cast<size_t>(a.lanes.num_lanes) * a.group_size;
  KernelStatus status = KernelStatus::Ok();
  Scratch scratch(s);
  float* logits = scratch.Alloc<float>(heads * a.lanes.max_tokens, &status);
  const size_t rows = static_cast<size_t>(a.lanes.num_lanes) * a.lanes.max_tokens;
  float* vnorm = a.value_norm ? scratch.Alloc<float>(rows, &status) : nullptr;
  float2* stats = scratch.Alloc<float2>(heads, &status);
  KVC_KERNEL_RETURN_IF_ERROR(status);
  ExpectedLogitsKernel<<<dim3(num_chunks, a.lanes.num_lanes), kThreads, tiles.SharedBytes(d), s>>>(
      a, tiles, AttentionScale(d), 0.5f / static_cast<float>(d), logits, vnorm);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  ExpectedStatsKernel<<<dim3(a.group_size, a.lanes.num_lanes), 256, 0, s>>>(a, logits, stats);
  KVC_KERNEL_RETURN_IF_ERROR(LaunchStatus());
  ExpectedScoresKernel<<<dim3(Blocks(a.lanes.max_tokens, 256), a.lanes.num_lanes), 256, 0, s>>>(
      a, logits, vnorm, stats);
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
