#include "worker/engine/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvc/kernels/rope.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace kvc::worker {

void MatMul(const float* x, const float* w, float* y, int64_t n, int64_t in, int64_t out,
            bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (n == 1) {  // decode: a matrix-vector product; sgemv skips sgemm's packing
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, w,
                static_cast<int>(in), x, 1, beta, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
              static_cast<int>(in), 1.0f, x, static_cast<int>(in), w, static_cast<int>(in), beta, y,
              static_cast<int>(out));
}

void RmsNorm(const float* x, const float* weight, float* out, int64_t n, int64_t d, float eps) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    float* o = out + t * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double{xr[i]} * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * scale * weight[i];
  }
}

RopeAngles ComputeRopeAngles(absl::Span<const int32_t> positions, int32_t head_dim, float theta) {
  RopeAngles angles;
  angles.n = static_cast<int64_t>(positions.size());
  angles.half = head_dim / 2;
  const size_t size = positions.size() * static_cast<size_t>(angles.half);
  angles.sin.resize(size);
  angles.cos.resize(size);
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int32_t i = 0; i < angles.half; ++i) {
      const size_t at = t * static_cast<size_t>(angles.half) + static_cast<size_t>(i);
      kernels::RopeSinCos(theta, head_dim, i, positions[t], &angles.sin[at], &angles.cos[at]);
    }
  }
  return angles;
}

void ApplyRope(float* x, const RopeAngles& angles, int32_t heads, int32_t head_dim) {
  const int32_t half = angles.half;
  for (int64_t t = 0; t < angles.n; ++t) {
    const float* sin_t = angles.sin.data() + t * half;
    const float* cos_t = angles.cos.data() + t * half;
    for (int32_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_t[i] - b * sin_t[i];
        v[i + half] = b * cos_t[i] + a * sin_t[i];
      }
    }
  }
}

void ApplyRope(float* x, absl::Span<const int32_t> positions, int32_t heads, int32_t head_dim,
               float theta) {
  ApplyRope(x, ComputeRopeAngles(positions, head_dim, theta), heads, head_dim);
}

void SiluMul(float* gate, const float* up, int64_t count, kernels::ThreadPool* pool) {
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  };
  if (pool != nullptr && count >= 65536) {
    pool->ParallelFor(count, GrainPerThread(count, *pool), body);
  } else {
    body(0, count);
  }
}

double LogProb(const float* logits, int64_t vocab, int32_t target) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double{logits[i]} - mx);
  return double{logits[target]} - mx - std::log(sum);
}

void SetBlasThreads(int num_threads) {
  if (num_threads > 0) openblas_set_num_threads(num_threads);
}

}  // namespace kvc::worker
