// Dense f32 building blocks of the Llama forward pass. Row-major everywhere; n = tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kvc/kernels/thread_pool.h"

namespace kvc::worker {

// y[n, out] = x[n, in] * w[out, in]^T (OpenBLAS sgemm; beta = 0, or 1 when `accumulate`).
void MatMul(const float* x, const float* w, float* y, int64_t n, int64_t in, int64_t out,
            bool accumulate);

// out[n, d] = x / sqrt(mean(x^2) + eps) * weight[d], per row.
void RmsNorm(const float* x, const float* weight, float* out, int64_t n, int64_t d, float eps);

// sin and cos of the RoPE angles positions[t] * theta^(-2i/head_dim), i < head_dim / 2, from
// kernels::RopeSinCos: the one definition kvcached's re-rotation also uses, so a key rotated here
// and one moved in the service agree (angles formed in double, so large positions keep their
// precision). Its frequencies are double where llama.cpp and the NumPy fixtures round them to
// float: logits move by ~1e-4 at most (8K tokens). Computed once per forward pass and shared by
// every layer's Q and K.
struct RopeAngles {
  int64_t n = 0;           // positions
  int32_t half = 0;        // head_dim / 2
  std::vector<float> sin;  // [n, half]
  std::vector<float> cos;  // [n, half]
};
RopeAngles ComputeRopeAngles(absl::Span<const int32_t> positions, int32_t head_dim, float theta);

// Rotate-half (NeoX / Hugging Face) RoPE in place on x[n, heads, head_dim]: pairs
// (i, i + head_dim/2) of row t rotate by the angles of t (n = the positions `angles` was made for).
void ApplyRope(float* x, const RopeAngles& angles, int32_t heads, int32_t head_dim);

// The same at `positions` (angles computed for this call only).
void ApplyRope(float* x, absl::Span<const int32_t> positions, int32_t heads, int32_t head_dim,
               float theta);

// Grain for kernels::ThreadPool::ParallelFor that cuts [0, n) into one chunk per pool thread:
// these loops are uniform, so equal shares need no finer balancing and keep hand-off costs at
// one chunk per thread.
inline int64_t GrainPerThread(int64_t n, const kernels::ThreadPool& pool) {
  return (n + pool.size() - 1) / pool.size();
}

// gate[i] = silu(gate[i]) * up[i] for i < count.
void SiluMul(float* gate, const float* up, int64_t count, kernels::ThreadPool* pool);

// Row-wise log-softmax of logits[vocab] at `target`: log p(target).
double LogProb(const float* logits, int64_t vocab, int32_t target);

// Sets OpenBLAS's thread count (<= 0: leave as is).
void SetBlasThreads(int num_threads);

}  // namespace kvc::worker
