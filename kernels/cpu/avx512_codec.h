// AVX-512 (F, BW, VL, DQ) record codec for the CPU backend's write and read rows. It writes
// the same bytes and floats as QuantizeRecord / DequantizeRecord in record_codec.h (the
// spec), 16 lanes at a time: the same float operations in the same order (x * inv; mul then
// add, never FMA), the same integer rounding formulas, explicit round-to-nearest-even
// conversions. Decoding of 4-bit codes is a 16-entry table in one register (vpermps), so
// INT4 and E2M1 cost one permute per 16 elements. Only reached after a run-time CPU check
// (CpuIsaLevel() in cpu_rows.h); head_dim is a multiple of 16 (FormatSupportsHeadDim).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/cpu_rows.h"
#include "kvc/kernels/record_codec.h"

#if defined(KVC_CPU_DISPATCH)
#include <immintrin.h>

// g++ 12 flags the deliberately undefined vectors inside <avx512fintrin.h>'s reductions and
// narrowing conversions (-Wmaybe-uninitialized) once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define KVC_AVX512_ISA "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define KVC_AVX512_TARGET __attribute__((target(KVC_AVX512_ISA)))
#define KVC_AVX512_INLINE inline __attribute__((always_inline, target(KVC_AVX512_ISA)))

namespace kvc::kernels::cpu::avx512 {

constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

KVC_AVX512_INLINE __m512i Splat(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }

KVC_AVX512_INLINE __m512i AbsBits(__m512 v) {
  return _mm512_and_si512(_mm512_castps_si512(v), Splat(0x7fffffffu));
}

// AbsMax of record_codec.h: unsigned max of |x| bit patterns (NaN inputs give NaN).
KVC_AVX512_INLINE uint32_t AbsMaxBits(const float* x, int n) {
  __m512i m = _mm512_setzero_si512();
  for (int j = 0; j < n; j += 16) m = _mm512_max_epu32(m, AbsBits(_mm512_loadu_ps(x + j)));
  return _mm512_reduce_max_epu32(m);
}

// ClampF(v, lo, hi) with NaN passing through: vmaxps/vminps return the second operand when
// one is NaN, so v goes second.
KVC_AVX512_INLINE __m512 Clamp(__m512 v, __m512 lo, __m512 hi) {
  return _mm512_min_ps(hi, _mm512_max_ps(lo, v));
}

// FloatToE4M3 on 16 finite lanes (codes in the low byte of each 32-bit lane). The scalar
// version saturates to 0x7e when a >= 448 or the rounded normal code passes 0x7e (which
// implies a >= 448), so an unsigned min with 0x7e does both; lanes below 2^-6 take the
// subnormal code (computed only for vectors that have such a lane). A NaN lane comes out as
// sign | 0x7e.
KVC_AVX512_INLINE __m512i FloatToE4M3Finite(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i a = _mm512_and_si512(x, Splat(0x7fffffffu));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, Splat(0x7ffffu)),
                                     _mm512_and_si512(_mm512_srli_epi32(a, 20), Splat(1)));
  __m512i c =
      _mm512_min_epu32(_mm512_sub_epi32(_mm512_srli_epi32(r, 20), Splat(120u << 3)), Splat(0x7eu));
  const __mmask16 small = _mm512_cmplt_epu32_mask(a, Splat(0x3c800000u));
  if (small != 0) {
    c = _mm512_mask_mov_epi32(
        c, small,
        _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)),
                                 kRne));
  }
  return _mm512_ternarylogic_epi32(c, _mm512_srli_epi32(x, 24), Splat(0x80u), 0xf8);
}

// FloatToE4M3 on 16 lanes: NaN lanes patched from sign | 0x7e to sign | 0x7f.
KVC_AVX512_INLINE __m512i FloatToE4M3(__m512 f) {
  const __m512i c = FloatToE4M3Finite(f);
  return _mm512_mask_or_epi32(c, _mm512_cmpgt_epu32_mask(AbsBits(f), Splat(0x7f800000u)), c,
                              Splat(1));
}

// E4M3ToFloat on 16 lanes of codes (low byte of each 32-bit lane).
KVC_AVX512_INLINE __m512 E4M3ToFloat(__m512i u) {
  const __m512i e = _mm512_and_si512(_mm512_srli_epi32(u, 3), Splat(15));
  const __m512i m = _mm512_and_si512(u, Splat(7));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(1.0f / 512.0f));
  const __m512i normal = _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(e, Splat(120)), 23),
                                         _mm512_slli_epi32(m, 20));
  __m512i bits = _mm512_mask_mov_epi32(normal, _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                       _mm512_castps_si512(sub));
  bits = _mm512_mask_mov_epi32(
      bits, _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, Splat(0x7f)), Splat(0x7f)),
      Splat(0x7fc00000u));
  return _mm512_castsi512_ps(
      _mm512_or_si512(bits, _mm512_slli_epi32(_mm512_and_si512(u, Splat(0x80)), 24)));
}

// FloatToE2M1 on 16 lanes, from the ceiling and the floor of 4|f|. The scalar version's
// thresholds are quarter multiples: those whose ties round down (0.25, 1.25, 2.5, 5: code
// counts a > t) are counted by the ceiling (a > t <=> ceil(4a) > 4t), those whose ties round
// up (0.75, 1.75, 3.5: a >= t) by the floor (floor(4a) >= 4t), each through a 32-entry table
// (vpermt2d). 4|f| is clamped at 24 (code 7) first; a NaN stays NaN through the min and
// converts to 0x80000000, index 0, magnitude 0, as the scalar version. Two conversions and
// two permutes instead of getexp/scalef/roundscale: fewer uops, and spread over both ports.
KVC_AVX512_INLINE __m512i FloatToE2M1(__m512 f) {
  const __m512 a4 = _mm512_min_ps(
      _mm512_set1_ps(24.0f), _mm512_mul_ps(_mm512_castsi512_ps(AbsBits(f)), _mm512_set1_ps(4.0f)));
  const __m512i up = _mm512_cvt_roundps_epi32(a4, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  const __m512i dn = _mm512_cvt_roundps_epi32(a4, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  // #{1, 5, 10, 20 < i} and #{3, 7, 14 <= i} for i = 0..31.
  const __m512i gt_lo = _mm512_setr_epi32(0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3);
  const __m512i gt_hi = _mm512_setr_epi32(3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4);
  const __m512i ge_lo = _mm512_setr_epi32(0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3);
  const __m512i m = _mm512_add_epi32(_mm512_permutex2var_epi32(gt_lo, up, gt_hi),
                                     _mm512_permutex2var_epi32(ge_lo, dn, Splat(3)));
  // m | ((bits >> 28) & 8)
  return _mm512_ternarylogic_epi32(m, _mm512_srli_epi32(_mm512_castps_si512(f), 28), Splat(8),
                                   0xf8);
}

// 16 codes in 0..15 (32-bit lanes) -> 8 bytes, element 2i in the low nibble (PackNibbles).
KVC_AVX512_INLINE void StoreNibbles(__m512i q, uint8_t* out) {
  const __m512i packed = _mm512_or_si512(q, _mm512_srli_epi64(q, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm512_cvtepi64_epi8(packed));
}

// Four blocks of 16 codes (0..15 in 32-bit lanes) -> 32 bytes, block by block, element 2i
// in the low nibble: two saturating packs (exact: codes fit) leave, per 128-bit lane k,
// codes 4k..4k+3 of each block in turn; pairs of codes become bytes, then one word
// permute puts each block's bytes together.
KVC_AVX512_INLINE void StoreNibbles4(__m512i c0, __m512i c1, __m512i c2, __m512i c3, uint8_t* out) {
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
  const __m256i pairs = _mm512_cvtepi16_epi8(_mm512_or_si512(b, _mm512_srli_epi16(b, 4)));
  const __m256i idx = _mm256_setr_epi16(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutexvar_epi16(idx, pairs));
}

// 16 packed bytes (32 codes) -> 32 bytes whose low nibbles are the codes in element order.
// Only low nibbles matter: vpermps reads 4 index bits.
KVC_AVX512_INLINE __m256i SpreadNibbles(const uint8_t* in) {
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
  return _mm256_or_si256(w, _mm256_slli_epi16(w, 4));
}

// ---- quantize: d floats -> one record ----

KVC_AVX512_INLINE void QuantizeInt8(int d, const float* x, uint8_t* rec) {
  const float scale = BitsAsFloat(AbsMaxBits(x, d)) / 127.0f;
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f),
               hi = _mm512_set1_ps(127.0f);
  for (int j = 0; j < d; j += 16) {
    const __m512 v = Clamp(_mm512_mul_ps(_mm512_loadu_ps(x + j), vinv), lo, hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(rec + j),
                     _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(v, kRne)));
  }
  StoreF32(rec + d, scale);
}

// 64 codes (0..255 in 32-bit lanes of four vectors) -> 64 bytes in order: the saturating
// packs are exact for bytes and leave codes 4k..4k+3 of each vector in 128-bit lane k.
KVC_AVX512_INLINE void StoreBytes4(__m512i c0, __m512i c1, __m512i c2, __m512i c3, uint8_t* out) {
  const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(out, _mm512_permutexvar_epi32(idx, b));
}

// FP8 words of 16 finite lanes: sign << 11 | f32 exponent << 3 | mantissa of y rounded to 3
// mantissa bits, which is (y + c) - c with c = 1.5 * 2^(e + 20) for y in binade 2^e: ulp(c)
// = 2^(e - 3) and y + c stays in c's binade for either sign, so the add rounds y to nearest
// even at exactly E4M3's step (FloatToE4M3's integer rounding, in 4 instructions instead of
// 8). Lanes below 2^-6 (E4M3 subnormals, zeros) come out wrong; Fp8CodesFromWords flags them.
KVC_AVX512_INLINE __m512i Fp8Words(__m512 y) {
  const __m512 c = _mm512_castsi512_ps(_mm512_add_epi32(
      _mm512_and_si512(_mm512_castps_si512(y), Splat(0x7f800000u)), Splat(0x0a400000u)));
  return _mm512_srli_epi32(_mm512_castps_si512(_mm512_sub_ps(_mm512_add_ps(y, c), c)), 20);
}

// 32 packed words (16-bit lanes) -> codes in their low bytes: E4M3 exponent = f32 exponent -
// 120, the sign from bit 11. No saturation: |x * inv| <= 448 (1 + 2^-22) within a finite
// record. Lanes below 2^-6 are added to `small`.
KVC_AVX512_INLINE __m512i Fp8CodesFromWords(__m512i p, __mmask32* small) {
  *small |= _mm512_cmplt_epu16_mask(_mm512_and_si512(p, _mm512_set1_epi16(0x7ff)),
                                    _mm512_set1_epi16(121 << 3));
  // (p - 960) & 0x7f | (p >> 4) & 0x80
  return _mm512_ternarylogic_epi32(_mm512_set1_epi16(0x7f),
                                   _mm512_sub_epi16(p, _mm512_set1_epi16(120 << 3)),
                                   _mm512_srli_epi16(p, 4), 0xca);
}

KVC_AVX512_INLINE void QuantizeFp8(int d, const float* x, uint8_t* rec) {
  const uint32_t amax = AbsMaxBits(x, d);
  const float scale = BitsAsFloat(amax) / kE4M3Max;
  const __m512 vinv = _mm512_set1_ps(scale > 0 ? 1.0f / scale : 0.0f);
  int j = 0;
  if (amax < 0x7f800000u) {  // finite record: every x * inv is finite
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (; j + 64 <= d; j += 64) {
      const __m512 y0 = _mm512_mul_ps(_mm512_loadu_ps(x + j), vinv);
      const __m512 y1 = _mm512_mul_ps(_mm512_loadu_ps(x + j + 16), vinv);
      const __m512 y2 = _mm512_mul_ps(_mm512_loadu_ps(x + j + 32), vinv);
      const __m512 y3 = _mm512_mul_ps(_mm512_loadu_ps(x + j + 48), vinv);
      __mmask32 small = 0;
      const __m512i a = Fp8CodesFromWords(_mm512_packus_epi32(Fp8Words(y0), Fp8Words(y1)), &small);
      const __m512i b = Fp8CodesFromWords(_mm512_packus_epi32(Fp8Words(y2), Fp8Words(y3)), &small);
      if (small == 0) {  // packs leave codes 4k..4k+3 of each vector in 128-bit lane k
        _mm512_storeu_si512(rec + j, _mm512_permutexvar_epi32(order, _mm512_packus_epi16(a, b)));
      } else {
        StoreBytes4(FloatToE4M3Finite(y0), FloatToE4M3Finite(y1), FloatToE4M3Finite(y2),
                    FloatToE4M3Finite(y3), rec + j);
      }
    }
  }
  for (; j < d; j += 16) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(rec + j),
        _mm512_cvtepi32_epi8(FloatToE4M3(_mm512_mul_ps(_mm512_loadu_ps(x + j), vinv))));
  }
  StoreF32(rec + d, scale);
}

// Float order as unsigned order (OrderedBits of record_codec.h), and back.
KVC_AVX512_INLINE __m512i OrderedBits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  return _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), Splat(0x80000000u)));
}
KVC_AVX512_INLINE __m512 FromOrderedBits(__m512i o) {
  const __mmask16 pos = _mm512_cmplt_epi32_mask(o, _mm512_setzero_si512());  // top bit set
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_xor_si512(o, Splat(0xffffffffu)), pos,
                                                   _mm512_and_si512(o, Splat(0x7fffffffu))));
}

// FloatToHalf on 16 lanes: vcvtps2ph rounds to nearest even with the same overflow and
// subnormal results; NaNs are patched to FloatToHalf's sign | 0x7e00.
KVC_AVX512_INLINE __m256i FloatToHalf(__m512 v) {
  const __m256i h = _mm512_cvtps_ph(v, kRne);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(AbsBits(v), Splat(0x7f800000u));
  const __m256i quiet =
      _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(-32768)), _mm256_set1_epi16(0x7e00));
  return _mm256_mask_mov_epi16(h, nan, quiet);
}

// Horizontal reduction of n <= 16 vectors at once: lane i of the result is op over the
// lanes of v[i] (one transpose-like tree: 3 shuffles per pair instead of a reduction chain
// per vector). Levels halve the lanes each vector spends on one input; an odd vector out is
// paired with itself. Input i ends in lane 4 * (i % 4) + i / 4, undone by one permute.
template <class Op>
KVC_AVX512_INLINE __m512i ReduceEach(__m512i* v, int n, Op op) {
  for (int level = 0; level < 4; ++level) {
    const int m = (n + 1) / 2;
    for (int i = 0; i < m; ++i) {
      const __m512i a = v[2 * i], b = 2 * i + 1 < n ? v[2 * i + 1] : a;
      __m512i lo, hi;
      switch (level) {
        case 0:
          lo = _mm512_shuffle_i32x4(a, b, 0x44), hi = _mm512_shuffle_i32x4(a, b, 0xee);
          break;
        case 1:
          lo = _mm512_shuffle_i32x4(a, b, 0x88), hi = _mm512_shuffle_i32x4(a, b, 0xdd);
          break;
        case 2:
          lo = _mm512_unpacklo_epi64(a, b), hi = _mm512_unpackhi_epi64(a, b);
          break;
        default:
          lo = _mm512_castps_si512(
              _mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), 0x88));
          hi = _mm512_castps_si512(
              _mm512_shuffle_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b), 0xdd));
          break;
      }
      v[i] = op(lo, hi);
    }
    n = m;
  }
  return _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), v[0]);
}

struct MaxU32 {
  KVC_AVX512_INLINE __m512i operator()(__m512i a, __m512i b) const {
    return _mm512_max_epu32(a, b);
  }
};
struct MinU32 {
  KVC_AVX512_INLINE __m512i operator()(__m512i a, __m512i b) const {
    return _mm512_min_epu32(a, b);
  }
};

// Both records of a row (key and value) are quantized together, so the per-group scalar
// work (min/max reductions, f16 rounding of scale and min, reciprocals) runs once per 16
// groups in vector lanes instead of once per group.
constexpr int kRowRecords = 2;

// rne(clamp((x - min) * inv, 0, 15)) of 16 elements; a NaN converts to 0x80000000, which
// the unsigned-saturating packs of StoreNibbles4 turn into 0, the scalar code's byte.
KVC_AVX512_INLINE __m512i Int4Codes(const float* x, float min, float inv) {
  const __m512 v = Clamp(
      _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x), _mm512_set1_ps(min)), _mm512_set1_ps(inv)),
      _mm512_setzero_ps(), _mm512_set1_ps(15.0f));
  return _mm512_cvt_roundps_epi32(v, kRne);
}

// INT4: a unit is one group of one of kRecords records (the key and value records of one or
// two rows, see QuantizesRowPairs); units are handled 16 at a time.
template <int kGroup, int kRecords = kRowRecords>
KVC_AVX512_INLINE void QuantizeInt4(int d, const float* const* x, uint8_t* const* rec) {
  const int per_record = d / kGroup, units = kRecords * per_record;
  const __m512 zero = _mm512_setzero_ps(), fifteen = _mm512_set1_ps(15.0f);
  for (int u0 = 0; u0 < units; u0 += 16) {
    const int n = units - u0 < 16 ? units - u0 : 16;
    __m512i lo_o[16], hi_o[16];
    const int r_start = u0 / per_record, g_start = u0 - r_start * per_record;
    for (int i = 0, r = r_start, g = g_start; i < n; ++i) {
      const float* xg = x[r] + g * kGroup;
      if (++g == per_record) g = 0, ++r;
      lo_o[i] = OrderedBits(_mm512_loadu_ps(xg));
      hi_o[i] = lo_o[i];
      for (int j = 16; j < kGroup; j += 16) {
        const __m512i o = OrderedBits(_mm512_loadu_ps(xg + j));
        lo_o[i] = _mm512_min_epu32(lo_o[i], o);
        hi_o[i] = _mm512_max_epu32(hi_o[i], o);
      }
    }
    const __m512 lo = FromOrderedBits(ReduceEach(lo_o, n, MinU32{}));
    const __m512 hi = FromOrderedBits(ReduceEach(hi_o, n, MaxU32{}));
    // Quantize against the f16-rounded scale and min that the reader will see.
    const __m256i scale_h = FloatToHalf(_mm512_div_ps(_mm512_sub_ps(hi, lo), fifteen));
    const __m256i min_h = FloatToHalf(lo);
    const __m512 scale = _mm512_cvtph_ps(scale_h);
    alignas(64) float mins[16], invs[16];
    _mm512_store_ps(mins, _mm512_cvtph_ps(min_h));
    _mm512_store_ps(invs, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(scale, zero, _CMP_GT_OQ),
                                              _mm512_set1_ps(1.0f), scale));
    // Per group 4 bytes: f16 scale, then f16 min.
    alignas(64) uint32_t fields[16];
    _mm512_store_si512(fields,
                       _mm512_or_si512(_mm512_cvtepu16_epi32(scale_h),
                                       _mm512_slli_epi32(_mm512_cvtepu16_epi32(min_h), 16)));
    for (int i = 0, r = r_start, g = g_start; i < n;
         ++i, g == per_record - 1 ? (g = 0, ++r) : ++g) {
      const float* xg = x[r] + g * kGroup;
      if (kGroup == 64) {
        StoreNibbles4(Int4Codes(xg, mins[i], invs[i]), Int4Codes(xg + 16, mins[i], invs[i]),
                      Int4Codes(xg + 32, mins[i], invs[i]), Int4Codes(xg + 48, mins[i], invs[i]),
                      rec[r] + g * 32);
      } else if (i + 1 < n && g + 1 < per_record) {  // two groups of 32 of one record
        StoreNibbles4(Int4Codes(xg, mins[i], invs[i]), Int4Codes(xg + 16, mins[i], invs[i]),
                      Int4Codes(xg + 32, mins[i + 1], invs[i + 1]),
                      Int4Codes(xg + 48, mins[i + 1], invs[i + 1]), rec[r] + g * 16);
        std::memcpy(rec[r] + d / 2 + 4 * g, &fields[i], 8);
        ++i, ++g;  // the second group (g + 1 < per_record: no wrap); the step moves past it
        continue;
      } else {
        for (int j = 0; j < kGroup; j += 16) {
          StoreNibbles(_mm512_and_si512(Int4Codes(xg + j, mins[i], invs[i]), Splat(15)),
                       rec[r] + (g * kGroup + j) / 2);
        }
      }
      std::memcpy(rec[r] + d / 2 + 4 * g, &fields[i], 4);
    }
  }
}

// NVFP4: block amaxes of both records (16 blocks per vector), the tensor scale t of each
// record, then the block scales e4m3(amax_b / (6 t)), their decoded value times t and its
// reciprocal for the blocks of both records in the same vectors (one pair of divisions per
// 16 blocks), then the elements.
KVC_AVX512_INLINE void QuantizeNvfp4(int d, const float* const* x, uint8_t* const* rec) {
  const int per_record = d / 16, units = kRowRecords * per_record;
  alignas(64) uint32_t amax[kRowRecords * kMaxHeadDim / 16 + 16];
  alignas(64) float inv[kRowRecords * kMaxHeadDim / 16 + 16];
  uint32_t tbits[kRowRecords] = {0, 0};
  for (int u0 = 0; u0 < units; u0 += 16) {
    const int n = units - u0 < 16 ? units - u0 : 16;
    __m512i a[16];
    for (int i = 0; i < n; ++i) {
      const int u = u0 + i;
      const int r = u >= per_record;
      a[i] = AbsBits(_mm512_loadu_ps(x[r] + (u - r * per_record) * 16));
    }
    const __m512i m = ReduceEach(a, n, MaxU32{});
    _mm512_store_si512(amax + u0, m);
    for (int r = 0; r < kRowRecords; ++r) {
      const int lo = std::max(0, r * per_record - u0), hi = std::min(n, (r + 1) * per_record - u0);
      if (lo >= hi) continue;
      const __mmask16 lanes = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
      const uint32_t v = _mm512_mask_reduce_max_epu32(lanes, m);
      tbits[r] = v > tbits[r] ? v : tbits[r];
    }
  }
  float t[kRowRecords];
  for (int r = 0; r < kRowRecords; ++r) t[r] = BitsAsFloat(tbits[r]) / (kE4M3Max * kE2M1Max);
  for (int u0 = 0; u0 < units; u0 += 16) {
    const int n = units - u0 < 16 ? units - u0 : 16;
    // Lanes [0, first1) hold blocks of the key record, [first1, n) of the value record.
    const int first1 = std::max(0, std::min(n, per_record - u0));
    const __mmask16 live = static_cast<__mmask16>((1u << n) - 1u);
    const __mmask16 value_lanes = static_cast<__mmask16>(live & ~((1u << first1) - 1u));
    const __m512 vt = _mm512_mask_blend_ps(value_lanes, _mm512_set1_ps(t[0]), _mm512_set1_ps(t[1]));
    // t > 0, else zero scales and codes of x * 0, as the scalar code.
    const __mmask16 on = _mm512_mask_cmp_ps_mask(live, vt, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 bmax = _mm512_castsi512_ps(_mm512_load_si512(amax + u0));
    const __m512i sb = _mm512_maskz_mov_epi32(
        on, FloatToE4M3(_mm512_div_ps(bmax, _mm512_mul_ps(_mm512_set1_ps(kE2M1Max), vt))));
    const __m512 eff = _mm512_mul_ps(E4M3ToFloat(sb), vt);
    _mm512_store_ps(inv + u0, _mm512_maskz_div_ps(
                                  _mm512_mask_cmp_ps_mask(on, eff, _mm512_setzero_ps(), _CMP_GT_OQ),
                                  _mm512_set1_ps(1.0f), eff));
    if (first1 > 0) {
      _mm_mask_storeu_epi8(rec[0] + d / 2 + u0, static_cast<__mmask16>((1u << first1) - 1u),
                           _mm512_cvtepi32_epi8(sb));
    }
    if (first1 < n) {  // value-record lanes moved down to lane 0
      const __m512i moved = _mm512_permutexvar_epi32(
          _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(first1)),
          sb);
      _mm_mask_storeu_epi8(rec[1] + d / 2 + (u0 + first1 - per_record),
                           static_cast<__mmask16>((1u << (n - first1)) - 1u),
                           _mm512_cvtepi32_epi8(moved));
    }
  }
  for (int r = 0; r < kRowRecords; ++r) {
    const float* xr = x[r];
    const float* ir = inv + r * per_record;
    uint8_t* out = rec[r];
    int b = 0;
    for (; b + 4 <= per_record; b += 4) {
      const float* xb = xr + 16 * b;
      StoreNibbles4(FloatToE2M1(_mm512_mul_ps(_mm512_loadu_ps(xb), _mm512_set1_ps(ir[b]))),
                    FloatToE2M1(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), _mm512_set1_ps(ir[b + 1]))),
                    FloatToE2M1(_mm512_mul_ps(_mm512_loadu_ps(xb + 32), _mm512_set1_ps(ir[b + 2]))),
                    FloatToE2M1(_mm512_mul_ps(_mm512_loadu_ps(xb + 48), _mm512_set1_ps(ir[b + 3]))),
                    out + 8 * b);
    }
    for (; b < per_record; ++b) {
      StoreNibbles(FloatToE2M1(_mm512_mul_ps(_mm512_loadu_ps(xr + 16 * b), _mm512_set1_ps(ir[b]))),
                   out + 8 * b);
    }
    for (int p = d / 2 + d / 16; p < Nvfp4TensorScaleOffset(d); ++p) out[p] = 0;
    StoreF32(out + Nvfp4TensorScaleOffset(d), t[r]);
  }
}

// The key and value records of one row (quantized formats; raw formats are row copies or
// conversions elsewhere).
KVC_AVX512_INLINE void QuantizeRow(StorageFormat format, int d, const float* const* x,
                                   uint8_t* const* rec) {
  switch (format) {
    case StorageFormat::kInt4G32:
      return QuantizeInt4<32>(d, x, rec);
    case StorageFormat::kInt4G64:
      return QuantizeInt4<64>(d, x, rec);
    case StorageFormat::kNvfp4:
      return QuantizeNvfp4(d, x, rec);
    default:
      break;
  }
  for (int r = 0; r < kRowRecords; ++r) {
    switch (format) {
      case StorageFormat::kFp8E4M3:
        QuantizeFp8(d, x[r], rec[r]);
        break;
      case StorageFormat::kInt8:
        QuantizeInt8(d, x[r], rec[r]);
        break;
      default:
        kernels::QuantizeRecord(format, d, x[r], rec[r]);
        break;
    }
  }
}

// Formats whose rows are quantized two at a time (QuantizeTwoRows): INT4, whose per-group
// statistics then fill 16 lanes for d 128 g32 and give the core two independent chains of
// reductions and divisions.
inline bool QuantizesRowPairs(StorageFormat format) {
  return format == StorageFormat::kInt4G32 || format == StorageFormat::kInt4G64;
}

// The records of two rows: key 0, value 0, key 1, value 1 (QuantizesRowPairs formats).
KVC_AVX512_INLINE void QuantizeTwoRows(StorageFormat format, int d, const float* const* x,
                                       uint8_t* const* rec) {
  if (format == StorageFormat::kInt4G32) return QuantizeInt4<32, 2 * kRowRecords>(d, x, rec);
  QuantizeInt4<64, 2 * kRowRecords>(d, x, rec);
}

// ---- dequantize: one record -> d floats, or straight into a dense row ----

// Dense row element stores (16 lanes): f32, f16 (vcvtps2ph, round to nearest even, as
// FloatToHalf except NaN payloads) and bf16 (FloatToBFloat16's integer rounding).
// kStream: non-temporal stores (dst aligned to the store size) for reads much larger than
// the caches, where write-allocating the output would double its memory traffic.
template <DType kOut, bool kStream = false>
KVC_AVX512_INLINE void StoreOut(void* dst, __m512 v) {
  if constexpr (kOut == DType::kF32) {
    if constexpr (kStream) {
      _mm512_stream_ps(static_cast<float*>(dst), v);
    } else {
      _mm512_storeu_ps(static_cast<float*>(dst), v);
    }
    return;
  }
  __m256i h;
  if constexpr (kOut == DType::kF16) {
    h = _mm512_cvtps_ph(v, kRne);
  } else {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, Splat(0x7fffu)),
                                           _mm512_and_si512(_mm512_srli_epi32(x, 16), Splat(1))),
                          16);
    const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(x, 16), Splat(0x40));
    h = _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(
        rounded, _mm512_cmpgt_epu32_mask(AbsBits(v), Splat(0x7f800000u)), nan));
  }
  if constexpr (kStream) {
    _mm256_stream_si256(static_cast<__m256i*>(dst), h);
  } else {
    _mm256_storeu_si256(static_cast<__m256i*>(dst), h);
  }
}

template <DType kOut>
KVC_AVX512_INLINE void* OutAt(void* dst, int j) {
  return static_cast<uint8_t*>(dst) + static_cast<size_t>(j) * DTypeSize(kOut);
}

// 32 elements from 16 packed nibble bytes through a 16-entry table.
template <DType kOut, bool kStream>
KVC_AVX512_INLINE void StoreTable32(const uint8_t* in, __m512 table, void* dst, int j) {
  const __m256i idx = SpreadNibbles(in);
  StoreOut<kOut, kStream>(
      OutAt<kOut>(dst, j),
      _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(idx)), table));
  StoreOut<kOut, kStream>(
      OutAt<kOut>(dst, j + 16),
      _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(idx, 1)), table));
}

KVC_AVX512_INLINE __m512 Iota16() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// E2M1ToFloat of codes 0..15.
KVC_AVX512_INLINE __m512 E2M1Table() {
  return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                        -2.0f, -3.0f, -4.0f, -6.0f);
}

// Writes d dequantized elements of `rec` to dst (a dense row of kOut). Values equal
// DequantizeRecord's: INT4 table entries are float(q) * scale + min, E2M1 entries
// E2M1ToFloat(q) * eff, FP8 lanes E4M3ToFloat(c) * s (E4M3 codes widened to f16 bit
// patterns, exact, then * 256 to rebias, exact, NaN codes patched).
template <DType kOut, bool kStream = false>
KVC_AVX512_INLINE void DequantizeRecord(StorageFormat format, int d, const uint8_t* rec,
                                        void* dst) {
  switch (format) {
    case StorageFormat::kInt8: {
      const __m512 s = _mm512_set1_ps(LoadF32(rec + d));
      for (int j = 0; j < d; j += 16) {
        const __m512i q =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + j)));
        StoreOut<kOut, kStream>(OutAt<kOut>(dst, j), _mm512_mul_ps(_mm512_cvtepi32_ps(q), s));
      }
      return;
    }
    case StorageFormat::kFp8E4M3: {
      const __m512 s = _mm512_set1_ps(LoadF32(rec + d));
      for (int j = 0; j < d; j += 16) {
        const __m256i w =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + j)));
        // Sign-extended code << 7: bits 15 and 14 both hold the sign; clear bit 14.
        const __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(-16512));
        __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
        const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)),
                                                      _mm256_set1_epi16(0x7f));
        if (nan != 0) {
          v = _mm512_mask_mov_ps(v, nan,
                                 _mm512_castsi512_ps(_mm512_or_si512(
                                     _mm512_and_si512(_mm512_castps_si512(v), Splat(0x80000000u)),
                                     Splat(0x7fc00000u))));
        }
        StoreOut<kOut, kStream>(OutAt<kOut>(dst, j), _mm512_mul_ps(v, s));
      }
      return;
    }
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64: {
      const int group = format == StorageFormat::kInt4G32 ? 32 : 64;
      for (int g = 0; g < d / group; ++g) {
        const __m512 scale = _mm512_set1_ps(HalfToFloat(LoadU16(rec + d / 2 + 4 * g)));
        const __m512 min = _mm512_set1_ps(HalfToFloat(LoadU16(rec + d / 2 + 4 * g + 2)));
        const __m512 table = _mm512_add_ps(_mm512_mul_ps(Iota16(), scale), min);
        for (int j = g * group; j < (g + 1) * group; j += 32) {
          StoreTable32<kOut, kStream>(rec + j / 2, table, dst, j);
        }
      }
      return;
    }
    case StorageFormat::kNvfp4: {
      const __m512 t = _mm512_set1_ps(LoadF32(rec + Nvfp4TensorScaleOffset(d)));
      const __m512 e2m1 = E2M1Table();
      // Effective block scales E4M3ToFloat(s_b) * t, 16 blocks per vector.
      alignas(64) float eff[kMaxHeadDim / 16 + 16];
      for (int b0 = 0; b0 < d / 16; b0 += 16) {
        const int nb = d / 16 - b0 < 16 ? d / 16 - b0 : 16;
        const __m128i codes =
            _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << nb) - 1u), rec + d / 2 + b0);
        _mm512_store_ps(eff + b0, _mm512_mul_ps(E4M3ToFloat(_mm512_cvtepu8_epi32(codes)), t));
      }
      for (int b = 0; b < d / 16; ++b) {
        const __m512 table = _mm512_mul_ps(e2m1, _mm512_set1_ps(eff[b]));
        const __m128i w =
            _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 8 * b)));
        const __m128i idx = _mm_or_si128(w, _mm_slli_epi16(w, 4));
        StoreOut<kOut, kStream>(OutAt<kOut>(dst, 16 * b),
                                _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(idx), table));
      }
      return;
    }
    case StorageFormat::kF16:  // (SnapKV key tiles; reads of raw formats copy rows)
      for (int j = 0; j < d; j += 16) {
        StoreOut<kOut, kStream>(
            OutAt<kOut>(dst, j),
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 2 * j))));
      }
      return;
    default: {
      alignas(64) float x[kMaxHeadDim];
      kernels::DequantizeRecord(format, d, rec, x);
      for (int j = 0; j < d; j += 16)
        StoreOut<kOut, kStream>(OutAt<kOut>(dst, j), _mm512_loadu_ps(x + j));
      return;
    }
  }
}

// A dense row of `dtype` (offset in elements) as d floats.
KVC_AVX512_INLINE void LoadRow(const void* src, DType dtype, size_t offset, int d, float* out) {
  switch (dtype) {
    case DType::kF32:
      for (int j = 0; j < d; j += 16)
        _mm512_storeu_ps(out + j, _mm512_loadu_ps(static_cast<const float*>(src) + offset + j));
      return;
    case DType::kF16:
      for (int j = 0; j < d; j += 16) {
        _mm512_storeu_ps(out + j,
                         _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                             static_cast<const uint16_t*>(src) + offset + j))));
      }
      return;
    case DType::kBF16:
      for (int j = 0; j < d; j += 16) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(src) + offset + j)));
        _mm512_storeu_ps(out + j, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      }
      return;
  }
}

}  // namespace kvc::kernels::cpu::avx512

#endif  // KVC_CPU_DISPATCH
