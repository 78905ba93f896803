// Element-loop helpers for the CPU backend, written so that g++ -O2/-O3 vectorizes them:
// the dtype switch sits outside the loop and reductions use independent accumulators
// (strict IEEE forbids reassociating one accumulator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kvc/kernels/dtype.h"
#include "kvc/kernels/paged_view.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

// Hot loops are instantiated twice: for baseline x86-64 and for AVX2 + F16C (chosen at run
// time by CPU feature, not model, so VMs with generic CPU names get it too). FP contraction
// stays off (-ffp-contract=off), so both compute bit-identical results.
#if defined(__GNUC__) && defined(__x86_64__)
#define KVC_CPU_DISPATCH 1
#define KVC_CPU_TARGET_FAST __attribute__((target("avx2,f16c")))
#endif

// Helpers called from the hot loops must be inlined into each instance to use its ISA.
#if defined(__GNUC__)
#define KVC_CPU_INLINE inline __attribute__((always_inline))
#else
#define KVC_CPU_INLINE inline
#endif

namespace kvc::kernels::cpu {

// Instruction sets of the hot-loop instances, in order: baseline x86-64, AVX2 + F16C
// (+ FMA), AVX-512 F/BW/VL/DQ (row codec of write/read, SnapKV tiles). Chosen once at run
// time by CPU feature (__builtin_cpu_supports also checks that the OS saves the registers).
// KVC_KERNELS_CPU_BASELINE=1 forces the baseline and KVC_KERNELS_CPU_ISA=baseline|avx2
// caps the level, so tests check every instance on one machine.
enum class CpuIsa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

#if defined(KVC_CPU_DISPATCH)
// clang 14's __builtin_cpu_supports has no "f16c" feature string, so F16C is read from CPUID
// (leaf 1, ECX bit 29) in both compilers. The AVX2 test below already requires the OS to
// save the YMM registers, which F16C needs too.
inline bool CpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
}
#endif

inline CpuIsa DetectCpuIsa() {
#if defined(KVC_CPU_DISPATCH)
  CpuIsa isa = CpuIsa::kBaseline;
  if (__builtin_cpu_supports("avx2") && CpuHasF16c() && __builtin_cpu_supports("fma")) {
    isa = CpuIsa::kAvx2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      isa = CpuIsa::kAvx512;
    }
  }
  if (std::getenv("KVC_KERNELS_CPU_BASELINE") != nullptr) return CpuIsa::kBaseline;
  if (const char* cap = std::getenv("KVC_KERNELS_CPU_ISA")) {
    const CpuIsa limit = std::strcmp(cap, "baseline") == 0 ? CpuIsa::kBaseline
                         : std::strcmp(cap, "avx2") == 0   ? CpuIsa::kAvx2
                                                           : CpuIsa::kAvx512;
    if (static_cast<int>(limit) < static_cast<int>(isa)) isa = limit;
  }
  return isa;
#else
  return CpuIsa::kBaseline;
#endif
}

inline CpuIsa CpuIsaLevel() {
  static const CpuIsa isa = DetectCpuIsa();
  return isa;
}

// True when the AVX2 + F16C instances may run (decode attention's switch).
inline bool CpuHasFastPath() { return CpuIsaLevel() != CpuIsa::kBaseline; }

#if defined(KVC_CPU_DISPATCH)
// f16 <-> f32 with F16C, 8 elements per instruction: identical results to HalfToFloat /
// FloatToHalf (IEEE, round to nearest even; the HalfConversions spec check compares the
// scalar versions with the compiler's). n is a multiple of 16 (head_dim). Fast path only.
__attribute__((target("avx2,f16c"))) inline void F16ToF32Fast(const uint16_t* p, int n,
                                                              float* out) {
  for (int j = 0; j < n; j += 8) {
    _mm256_storeu_ps(out + j,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j))));
  }
}
__attribute__((target("avx2,f16c"))) inline void F32ToF16Fast(const float* in, int n, uint16_t* p) {
  for (int j = 0; j < n; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + j), _MM_FROUND_TO_NEAREST_INT));
  }
}
#endif

template <bool kFast>
KVC_CPU_INLINE void LoadRow(const void* src, DType dtype, size_t offset, int n, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(src) + offset, n * sizeof(float));
      return;
    case DType::kF16: {
#if defined(KVC_CPU_DISPATCH)
      if constexpr (kFast) {
        F16ToF32Fast(static_cast<const uint16_t*>(src) + offset, n, out);
        return;
      }
#endif
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

template <bool kFast>
KVC_CPU_INLINE void StoreRow(const float* in, int n, void* dst, DType dtype, size_t offset) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(dst) + offset, in, n * sizeof(float));
      return;
    case DType::kF16: {
#if defined(KVC_CPU_DISPATCH)
      if constexpr (kFast) {
        F32ToF16Fast(in, n, static_cast<uint16_t*>(dst) + offset);
        return;
      }
#endif
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

// (block, slot) of stored token t of one lane, as LaneTokenSlot, without an integer
// division per token when block_tokens is a power of two (16 by default).
class LaneSlots {
 public:
  LaneSlots(const LaneTable& lanes, int block_tokens, int32_t lane)
      : ids_(lanes.block_ids + lanes.block_offsets[lane]), bt_(block_tokens) {
    while ((1 << shift_) < block_tokens) ++shift_;
    if ((1 << shift_) != block_tokens) shift_ = -1;
  }
  void Get(int32_t t, int32_t* block, int32_t* slot) const {
    if (shift_ >= 0) {
      *block = ids_[t >> shift_];
      *slot = t & (bt_ - 1);
    } else {
      *block = ids_[t / bt_];
      *slot = t % bt_;
    }
  }

 private:
  const int32_t* ids_;
  int bt_;
  int shift_ = 0;
};

// n is a multiple of 16 (head_dim).
KVC_CPU_INLINE float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < n; j += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[j + u] * b[j + u];
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

KVC_CPU_INLINE void Axpy(float alpha, const float* x, float* y, int n) {
  for (int j = 0; j < n; ++j) y[j] += alpha * x[j];
}

}  // namespace kvc::kernels::cpu
