// Element-loop helpers for the CPU backend, written so that g++ -O2/-O3 vectorizes them:
// the dtype switch sits outside the loop and reductions use independent accumulators
// (strict IEEE forbids reassociating one accumulator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvc/kernels/dtype.h"

// Hot row loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time
// (GCC ifunc), so the library stays portable while using the wide vectors where present.
// FP contraction stays off (-std=c++17), so every clone computes bit-identical results.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KVC_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVC_CPU_CLONES
#endif

namespace kvc::kernels::cpu {

inline void LoadRow(const void* src, DType dtype, size_t offset, int n, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(src) + offset, n * sizeof(float));
      return;
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(src) + offset;
      for (int j = 0; j < n; ++j) out[j] = HalfToFloat(p[j]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(src) + offset;
      for (int j = 0; j < n; ++j) out[j] = BFloat16ToFloat(p[j]);
      return;
    }
  }
}

inline void StoreRow(const float* in, int n, void* dst, DType dtype, size_t offset) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(dst) + offset, in, n * sizeof(float));
      return;
    case DType::kF16: {
      uint16_t* p = static_cast<uint16_t*>(dst) + offset;
      for (int j = 0; j < n; ++j) p[j] = FloatToHalf(in[j]);
      return;
    }
    case DType::kBF16: {
      uint16_t* p = static_cast<uint16_t*>(dst) + offset;
      for (int j = 0; j < n; ++j) p[j] = FloatToBFloat16(in[j]);
      return;
    }
  }
}

// n is a multiple of 16 (head_dim).
inline float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < n; j += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[j + u] * b[j + u];
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

inline void Axpy(float alpha, const float* x, float* y, int n) {
  for (int j = 0; j < n; ++j) y[j] += alpha * x[j];
}

}  // namespace kvc::kernels::cpu
