// GCC vector-extension helpers at an instance's native width N (16 floats for AVX-512, 8 for
// AVX2, 4 for baseline SSE2): wider-than-native generic vectors are lowered badly, so each
// instance (cpu_rows.h) instantiates the same code with its own N. Used by decode attention
// and SnapKV scoring.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/cpu_rows.h"

namespace kvc::kernels::cpu::vec {

template <int N>
struct Vec {
  typedef float F __attribute__((vector_size(4 * N)));
  typedef int32_t I __attribute__((vector_size(4 * N)));
};
template <int N>
using VF = typename Vec<N>::F;
template <int N>
using VI = typename Vec<N>::I;

template <int N>
KVC_CPU_INLINE VF<N> Splat(float x) {
  return VF<N>{} + x;
}
template <int N>
KVC_CPU_INLINE VF<N> Load(const float* p) {
  VF<N> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int N>
KVC_CPU_INLINE void Store(float* p, VF<N> v) {
  std::memcpy(p, &v, sizeof v);
}
template <int N>
KVC_CPU_INLINE VF<N> Max(VF<N> a, VF<N> b) {
  return a > b ? a : b;
}

// Lane i of the result = sum of the lanes of v[i], for N vectors at once: log2(N) levels of
// two shuffles and one add per pair (N - 1 pairs) instead of a reduction chain per vector.
// A level of half-width H pairs v[i] with v[i + m]: in each block of 2H lanes, the low H
// lanes fold v[i]'s block and the high H lanes v[i + m]'s, so the final lane order is i.
template <int N, int H, bool Upper>
constexpr int FoldLane(int l) {
  const bool low = l % (2 * H) < H;
  return Upper ? (low ? l + H : N + l - H) : (low ? l : N + l);
}
// __builtin_shufflevector (GCC >= 12 and clang) takes its lane indices as constant
// expressions, so they come from an index pack rather than a mask vector built at run time.
template <int N, int H, bool Upper, int... L>
KVC_CPU_INLINE VF<N> FoldShuffle(VF<N> a, VF<N> b, std::integer_sequence<int, L...> /*lanes*/) {
  return __builtin_shufflevector(a, b, FoldLane<N, H, Upper>(L)...);
}
template <int N, int H>
KVC_CPU_INLINE void FoldLevel(VF<N>* v) {
  constexpr int m = H;  // vectors left after this level = H when starting from N / 2 ... 1
  for (int i = 0; i < m; ++i) {
    const VF<N> a = v[i], b = v[i + m];
    v[i] = FoldShuffle<N, H, false>(a, b, std::make_integer_sequence<int, N>{}) +
           FoldShuffle<N, H, true>(a, b, std::make_integer_sequence<int, N>{});
  }
  if constexpr (H > 1) FoldLevel<N, H / 2>(v);
}
// v[0..N) are overwritten.
template <int N>
KVC_CPU_INLINE VF<N> SumEach(VF<N>* v) {
  FoldLevel<N, N / 2>(v);
  return v[0];
}

template <int N>
KVC_CPU_INLINE float HSum(VF<N> v) {
  float s[N];
  std::memcpy(s, &v, sizeof v);
  float r = 0;
  for (int l = 0; l < N; ++l) r += s[l];
  return r;
}
template <int N>
KVC_CPU_INLINE float HMax(VF<N> v) {
  float s[N];
  std::memcpy(s, &v, sizeof v);
  float r = s[0];
  for (int l = 1; l < N; ++l) r = s[l] > r ? s[l] : r;
  return r;
}

// exp(x) for x <= 0 (-inf included): Cephes expf (2^n * p(r), |r| <= ln2/2, ~1 ulp), with
// 2^n applied in two normal halves so that results down to the subnormal range match expf
// (tokens a query barely sees keep their tiny weights, and so their order in SnapKV's top-k).
// Below -104, where expf rounds to 0, the result is 0.
template <int N>
KVC_CPU_INLINE VF<N> ExpNonPositive(VF<N> x) {
  const VF<N> lim = Splat<N>(-104.0f);
  const VF<N> xc = x < lim ? lim : x;
  const VF<N> magic = Splat<N>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const VF<N> n = (xc * 1.44269504088896341f + magic) - magic;
  VF<N> r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  VF<N> p = Splat<N>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const VI<N> ni = __builtin_convertvector(n, VI<N>);
  const VI<N> n1 = ni >> 1, n2 = ni - n1;  // each >= -75: 2^n1 and 2^n2 are normal floats
  const VI<N> b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  VF<N> s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  const VF<N> e = (p * s1) * s2;
  return x < lim ? VF<N>{} : e;
}

}  // namespace kvc::kernels::cpu::vec
