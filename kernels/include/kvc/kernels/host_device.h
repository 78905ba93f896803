// Lets one scalar definition of the formats serve every backend: under nvcc the helpers
// become __host__ __device__, elsewhere they are plain inline C++17. No CUDA header is
// included here (public headers must build without CUDA); nvcc predefines what we use.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVC_HD __host__ __device__ __forceinline__
#define KVC_RESTRICT __restrict__
#else
#define KVC_HD inline
#define KVC_RESTRICT __restrict
#endif

// For the record codec: always inlined, so that each caller (and each instruction-set clone
// of a CPU row loop) gets a copy compiled and vectorized for its own target.
#if defined(__CUDACC__)
#define KVC_HD_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define KVC_HD_INLINE inline __attribute__((always_inline))
#else
#define KVC_HD_INLINE inline
#endif

namespace kvc::kernels {

KVC_HD uint32_t FloatAsBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

KVC_HD float BitsAsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round to nearest, ties to even, for |v| < 2^22. Adding and subtracting 1.5 * 2^23 makes
// the FPU round at the units place; unlike rintf it vectorizes on baseline x86-64 (SSE2)
// and gives identical results on every backend.
KVC_HD float RoundHalfEven(float v) {
  const float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

KVC_HD float ClampF(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

}  // namespace kvc::kernels
