// CPU paged decode attention, split over (lane, token chunk) work items like flash-decoding:
// each item keeps a max, sum and weighted value sum per query head in fp32, and a combine
// step rescales the partials by exp(m_i - M). This parallelizes one long sequence as well as
// many short ones.
//
// Inside an item, tiles of kTile keys are dequantized once into f32 rows (the AVX-512 record
// codec on AVX-512 machines; f32 records are used in place) and dotted against all query
// heads of the group in registers (2-4 tokens x up to 8 heads of vector accumulators over
// head_dim), and one tree reduction turns N tokens' accumulators into N logits. The chunk's
// softmax numerators are one vector exp per N logits; values are dequantized per tile the
// same way and accumulated into slices of head_dim held in registers for every head.
// Results equal the reference up to float reassociation (FMA, blocked sums, a ~1 ulp exp):
// this file is built with -ffp-contract=fast (CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/avx512_codec.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_rows.h"
#include "cpu/cpu_vec.h"
#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::cpu {
namespace {

using vec::VF;

constexpr int32_t kChunkTokens = 256;          // tokens per work item
constexpr int kTile = 32;                      // tokens dequantized at once (a multiple of every N)
constexpr int kRowStride = kChunkTokens + 16;  // per-head logit row, padded to a vector
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Item {
  int32_t lane;
  int32_t begin;  // stored token range [begin, end)
  int32_t end;
};

// Per-thread scratch of the item pass, kept between calls (no allocation per call).
struct ItemScratch {
  std::vector<float> q, tile, logits;
  std::vector<const uint8_t*> krec, vrec;
};
ItemScratch& WorkerScratch() {
  static thread_local ItemScratch s;
  return s;
}

// Per-call arrays, kept by the calling thread between calls.
struct CallScratch {
  std::vector<Item> items;
  std::vector<int32_t> first_item;
  std::vector<float> part_m, part_l, part_acc, logits_all, lane_m, lane_l;
};
CallScratch& CallerScratch() {
  static thread_local CallScratch s;
  return s;
}

alignas(64) const float kZeroRow[kMaxHeadDim] = {};

}  // namespace

// The per-item work, compiled per instruction set (cpu_rows.h).
struct DecodeWork {
  const DecodeAttentionArgs* a;
  const Item* items;
  float scale;
  bool need_logits;
  float* part_m;
  float* part_l;
  float* part_acc;
  float* logits_all;  // [items, G, kChunkTokens] scaled logits (weights / H2O only)
  const float* lane_m;
  const float* lane_l;
};

namespace {

// Scalar record decode through a 16-entry table per NVFP4 block (E2M1ToFloat(c) *
// (E4M3ToFloat(sb) * t)) and a 256-entry E4M3 table for FP8: the values of DequantizeRecord
// without its per-element conversions (AVX2 and baseline instances; 13x / 1.3x faster
// there). INT4 stays with DequantizeRecord, which g++ vectorizes (a table was slower).
struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) v[c] = E4M3ToFloat(static_cast<uint8_t>(c));
  }
};
const E4M3Table& E4M3Lut() {
  static const E4M3Table t;
  return t;
}
KVC_CPU_INLINE void Nibbles(const uint8_t* in, int bytes, const float* table, float* out) {
  for (int i = 0; i < bytes; ++i) {
    out[2 * i] = table[in[i] & 15u];
    out[2 * i + 1] = table[in[i] >> 4];
  }
}
KVC_CPU_INLINE void DecodeRowTable(StorageFormat f, int d, const uint8_t* rec, float* out) {
  switch (f) {
    case StorageFormat::kNvfp4: {
      const float t = LoadF32(rec + Nvfp4TensorScaleOffset(d));
      for (int b = 0; b < d / 16; ++b) {
        const float eff = E4M3ToFloat(rec[d / 2 + b]) * t;
        float table[16];
        for (int c = 0; c < 16; ++c) table[c] = E2M1ToFloat(static_cast<uint8_t>(c)) * eff;
        Nibbles(rec + 8 * b, 8, table, out + 16 * b);
      }
      return;
    }
    case StorageFormat::kFp8E4M3: {
      const float s = LoadF32(rec + d);
      const float* lut = E4M3Lut().v;
      for (int j = 0; j < d; ++j) out[j] = lut[rec[j]] * s;
      return;
    }
    default:
      DequantizeRecord(f, d, rec, out);
      return;
  }
}

// Records [0, n) of a tile as f32 rows; rows [n, kTile) point at zeros. f32 records are
// used in place.
KVC_CPU_INLINE void TileRowsScalar(StorageFormat f, int d, const uint8_t* const* recs, int n,
                                   float* tile, const float** rows) {
  for (int i = 0; i < n; ++i) {
    if (f == StorageFormat::kF32) {
      rows[i] = reinterpret_cast<const float*>(recs[i]);
      continue;
    }
    float* dst = tile + static_cast<size_t>(i) * d;
    DecodeRowTable(f, d, recs[i], dst);
    rows[i] = dst;
  }
  for (int i = n; i < kTile; ++i) rows[i] = kZeroRow;
}
#if defined(KVC_CPU_DISPATCH)
// INT4 record -> d floats: float(q) * scale + min through a 16-entry table per group (as
// the codec), with all groups' f16 scales and mins converted 8 halves at a time.
template <int kGroup>
KVC_AVX512_INLINE void Int4Row(int d, const uint8_t* rec, float* dst) {
  alignas(64) float sm[2 * kMaxHeadDim / 32 + 8];
  const int halves = 2 * (d / kGroup);
  for (int i = 0; i < halves; i += 8) {
    const __mmask8 live = static_cast<__mmask8>(halves - i >= 8 ? 0xff : (1u << (halves - i)) - 1);
    _mm256_store_ps(sm + i, _mm256_cvtph_ps(_mm_maskz_loadu_epi16(live, rec + d / 2 + 2 * i)));
  }
  const __m512 iota = avx512::Iota16();
  for (int g = 0; g < d / kGroup; ++g) {
    const __m512 table = _mm512_add_ps(_mm512_mul_ps(iota, _mm512_set1_ps(sm[2 * g])),
                                       _mm512_set1_ps(sm[2 * g + 1]));
    for (int j = g * kGroup; j < (g + 1) * kGroup; j += 32)
      avx512::StoreTable32<DType::kF32, false>(rec + j / 2, table, dst, j);
  }
}

// NVFP4 record -> d floats: E2M1 table times e4m3(block scale) * t, the block scales of 16
// blocks decoded per vector.
KVC_AVX512_INLINE void Nvfp4Row(int d, const uint8_t* rec, float* dst) {
  alignas(64) float eff[kMaxHeadDim / 16];
  const __m512 t = _mm512_set1_ps(LoadF32(rec + Nvfp4TensorScaleOffset(d)));
  const int blocks = d / 16;
  for (int b0 = 0; b0 < blocks; b0 += 16) {
    const __mmask16 live =
        static_cast<__mmask16>(blocks - b0 >= 16 ? 0xffff : (1u << (blocks - b0)) - 1);
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, rec + d / 2 + b0));
    _mm512_mask_storeu_ps(eff + b0, live, _mm512_mul_ps(avx512::E4M3ToFloat(codes), t));
  }
  const __m512 e2m1 = avx512::E2M1Table();
  for (int b = 0; b < blocks; ++b) {
    const __m512 table = _mm512_mul_ps(e2m1, _mm512_set1_ps(eff[b]));
    const __m128i w =
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 8 * b)));
    const __m128i idx = _mm_or_si128(w, _mm_slli_epi16(w, 4));
    _mm512_storeu_ps(dst + 16 * b, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(idx), table));
  }
}

KVC_AVX512_TARGET void TileRowsAvx512(StorageFormat f, int d, const uint8_t* const* recs, int n,
                                      float* tile, const float** rows) {
  if (f == StorageFormat::kF32) return TileRowsScalar(f, d, recs, n, tile, rows);
  for (int i = 0; i < n; ++i) {
    float* dst = tile + static_cast<size_t>(i) * d;
    switch (f) {
      case StorageFormat::kInt4G32:
        Int4Row<32>(d, recs[i], dst);
        break;
      case StorageFormat::kInt4G64:
        Int4Row<64>(d, recs[i], dst);
        break;
      case StorageFormat::kNvfp4:
        Nvfp4Row(d, recs[i], dst);
        break;
      default:
        avx512::DequantizeRecord<DType::kF32>(f, d, recs[i], dst);
        break;
    }
    rows[i] = dst;
  }
  for (int i = n; i < kTile; ++i) rows[i] = kZeroRow;
}
__attribute__((target("avx2,f16c,fma"))) void TileRowsAvx2(StorageFormat f, int d,
                                                           const uint8_t* const* recs, int n,
                                                           float* tile, const float** rows) {
  if (f != StorageFormat::kF16) return TileRowsScalar(f, d, recs, n, tile, rows);
  for (int i = 0; i < n; ++i) {
    float* dst = tile + static_cast<size_t>(i) * d;
    F16ToF32Fast(reinterpret_cast<const uint16_t*>(recs[i]), d, dst);
    rows[i] = dst;
  }
  for (int i = n; i < kTile; ++i) rows[i] = kZeroRow;
}
#endif

template <CpuIsa kIsa>
KVC_CPU_INLINE void TileRows(StorageFormat f, int d, const uint8_t* const* recs, int n, float* tile,
                             const float** rows) {
#if defined(KVC_CPU_DISPATCH)
  if constexpr (kIsa == CpuIsa::kAvx512) return TileRowsAvx512(f, d, recs, n, tile, rows);
  if constexpr (kIsa == CpuIsa::kAvx2) return TileRowsAvx2(f, d, recs, n, tile, rows);
#endif
  TileRowsScalar(f, d, recs, n, tile, rows);
}

// Logits of ntok tokens (a multiple of N) x kG heads: tokens kT at a time share each query
// load; N tokens' accumulators become N logits by one tree reduction.
template <int N, int kG>
KVC_CPU_INLINE void KeyLogits(const float* const* rows, int ntok, int d, const float* q,
                              float scale, float* logits) {
  constexpr int kT = kG <= 2 || (N == 16 && kG <= 4) ? 4 : 2;
  VF<N> part[kG][N];
  for (int t0 = 0; t0 < ntok; t0 += N) {
    for (int t = 0; t < N; t += kT) {
      VF<N> acc[kT][kG];
      for (int u = 0; u < kT; ++u) {
        for (int g = 0; g < kG; ++g) acc[u][g] = VF<N>{};
      }
      for (int j = 0; j < d; j += N) {
        VF<N> k[kT];
        for (int u = 0; u < kT; ++u) k[u] = vec::Load<N>(rows[t0 + t + u] + j);
        for (int g = 0; g < kG; ++g) {
          const VF<N> qv = vec::Load<N>(q + static_cast<size_t>(g) * d + j);
          for (int u = 0; u < kT; ++u) acc[u][g] += qv * k[u];
        }
      }
      for (int u = 0; u < kT; ++u) {
        for (int g = 0; g < kG; ++g) part[g][t + u] = acc[u][g];
      }
    }
    for (int g = 0; g < kG; ++g)
      vec::Store<N>(logits + g * kRowStride + t0, vec::SumEach<N>(part[g]) * scale);
  }
}

// acc[g][j0..j1) += sum over t < ntok of p[g][t] * row_t[j0..j1), kS vectors of head_dim
// per register block.
template <int N, int kG, int kS>
KVC_CPU_INLINE int ValueSlices(const float* const* rows, int ntok, int j, int j1, const float* p,
                               int d, float* acc) {
  for (; j + kS * N <= j1; j += kS * N) {
    VF<N> a[kG][kS];
    for (int g = 0; g < kG; ++g) {
      for (int s = 0; s < kS; ++s)
        a[g][s] = vec::Load<N>(acc + static_cast<size_t>(g) * d + j + s * N);
    }
    for (int t = 0; t < ntok; ++t) {
      VF<N> v[kS];
      for (int s = 0; s < kS; ++s) v[s] = vec::Load<N>(rows[t] + j + s * N);
      for (int g = 0; g < kG; ++g) {
        const VF<N> w = vec::Splat<N>(p[g * kRowStride + t]);
        for (int s = 0; s < kS; ++s) a[g][s] += w * v[s];
      }
    }
    for (int g = 0; g < kG; ++g) {
      for (int s = 0; s < kS; ++s)
        vec::Store<N>(acc + static_cast<size_t>(g) * d + j + s * N, a[g][s]);
    }
  }
  return j;
}

template <int N, int kG>
KVC_CPU_INLINE void ValueAccum(const float* const* rows, int ntok, int d, const float* p,
                               float* acc) {
  // Accumulators in at most half the vector registers (32 zmm, 16 ymm / xmm).
  constexpr int kRegs = N == 16 ? 16 : 8;
  constexpr int kS = kRegs / kG >= 4 ? 4 : (kRegs / kG >= 2 ? 2 : 1);
  const int j = ValueSlices<N, kG, kS>(rows, ntok, 0, d, p, d, acc);
  if constexpr (kS > 1) ValueSlices<N, kG, 1>(rows, ntok, j, d, p, d, acc);
}

// Heads per register block: 8 with 32 vector registers, 4 with 16.
template <int N>
constexpr int MaxBlockHeads() {
  return N == 16 ? 8 : 4;
}

template <int N>
KVC_CPU_INLINE void KeyLogitsAny(int kg, const float* const* rows, int ntok, int d, const float* q,
                                 float scale, float* logits) {
  switch (kg) {
    case 1:
      return KeyLogits<N, 1>(rows, ntok, d, q, scale, logits);
    case 2:
      return KeyLogits<N, 2>(rows, ntok, d, q, scale, logits);
    case 3:
      return KeyLogits<N, 3>(rows, ntok, d, q, scale, logits);
    default:
      break;
  }
  if constexpr (MaxBlockHeads<N>() == 8) {
    switch (kg) {
      case 5:
        return KeyLogits<N, 5>(rows, ntok, d, q, scale, logits);
      case 6:
        return KeyLogits<N, 6>(rows, ntok, d, q, scale, logits);
      case 7:
        return KeyLogits<N, 7>(rows, ntok, d, q, scale, logits);
      case 8:
        return KeyLogits<N, 8>(rows, ntok, d, q, scale, logits);
      default:
        break;
    }
  }
  KeyLogits<N, 4>(rows, ntok, d, q, scale, logits);
}

template <int N>
KVC_CPU_INLINE void ValueAccumAny(int kg, const float* const* rows, int ntok, int d, const float* p,
                                  float* acc) {
  switch (kg) {
    case 1:
      return ValueAccum<N, 1>(rows, ntok, d, p, acc);
    case 2:
      return ValueAccum<N, 2>(rows, ntok, d, p, acc);
    case 3:
      return ValueAccum<N, 3>(rows, ntok, d, p, acc);
    default:
      break;
  }
  if constexpr (MaxBlockHeads<N>() == 8) {
    switch (kg) {
      case 5:
        return ValueAccum<N, 5>(rows, ntok, d, p, acc);
      case 6:
        return ValueAccum<N, 6>(rows, ntok, d, p, acc);
      case 7:
        return ValueAccum<N, 7>(rows, ntok, d, p, acc);
      case 8:
        return ValueAccum<N, 8>(rows, ntok, d, p, acc);
      default:
        break;
    }
  }
  ValueAccum<N, 4>(rows, ntok, d, p, acc);
}

// Prefetches records [0, n) into L1 one tile ahead, one prefetch per cache line of each run
// of consecutive records (the tokens of one block). Only for records narrower than 16 bits
// per element: the block sections of 16-bit formats are long enough for the hardware
// prefetcher (measured: prefetching them is slower).
KVC_CPU_INLINE void PrefetchRecords(const uint8_t* const* recs, int n, int bytes, int d) {
  if (bytes >= 2 * d) return;
  for (int i = 0; i < n;) {
    const uint8_t* start = recs[i];
    int k = i + 1;
    while (k < n && recs[k] == recs[k - 1] + bytes) ++k;
    const uint8_t* end = recs[k - 1] + bytes;
    for (const uint8_t* p = start; p < end; p += 64) __builtin_prefetch(p);
    __builtin_prefetch(end - 1);
    i = k;
  }
}

template <int N, CpuIsa kIsa>
KVC_CPU_INLINE void DecodeItemsT(const DecodeWork& w, int64_t i0, int64_t i1) {
  const DecodeAttentionArgs& a = *w.a;
  const BlockLayout& l = a.arena.layout;
  const StorageFormat f = l.format;
  const int d = l.head_dim, G = a.group_size, rb = l.record_bytes;
  constexpr int kB = MaxBlockHeads<N>();
  ItemScratch& s = WorkerScratch();
  s.q.resize(static_cast<size_t>(G) * d);
  s.tile.resize(static_cast<size_t>(kTile) * d);
  s.logits.resize(static_cast<size_t>(G) * kRowStride);
  s.krec.resize(kChunkTokens + kTile);
  s.vrec.resize(kChunkTokens + kTile);
  float* q = s.q.data();
  float* tile = s.tile.data();
  const uint8_t** krec = s.krec.data();
  const uint8_t** vrec = s.vrec.data();
  const float* rows[kTile];
  for (int64_t i = i0; i < i1; ++i) {
    const Item it = w.items[i];
    const int32_t len = it.end - it.begin;
    const int32_t padded = (len + N - 1) / N * N;
    for (int g = 0; g < G; ++g) {
      LoadRow<kIsa != CpuIsa::kBaseline>(a.queries, a.dtype,
                                         (static_cast<size_t>(it.lane) * G + g) * d, d,
                                         q + static_cast<size_t>(g) * d);
    }
    const LaneSlots slots(a.lanes, l.block_tokens, it.lane);
    for (int32_t t = 0; t < len; ++t) {
      int32_t b, sl;
      slots.Get(it.begin + t, &b, &sl);
      krec[t] = KeyRecord(a.arena, b, sl);
      vrec[t] = ValueRecord(a.arena, b, sl);
    }
    PrefetchRecords(krec, std::min(len, kTile), rb, d);
    // Keys: logits[g][t] = scale * q_g . k_t.
    float* logits = s.logits.data();
    for (int32_t t0 = 0; t0 < len; t0 += kTile) {
      const int n = std::min<int32_t>(kTile, len - t0);
      if (t0 + kTile < len)
        PrefetchRecords(krec + t0 + kTile, std::min(kTile, len - t0 - kTile), rb, d);
      else
        PrefetchRecords(vrec, std::min(len, kTile), rb, d);
      TileRows<kIsa>(f, d, krec + t0, n, tile, rows);
      const int ntok = (n + N - 1) / N * N;
      for (int g0 = 0; g0 < G; g0 += kB) {
        KeyLogitsAny<N>(std::min(kB, G - g0), rows, ntok, d, q + static_cast<size_t>(g0) * d,
                        w.scale, logits + g0 * kRowStride + t0);
      }
    }
    // Softmax numerators against the chunk's max, per head.
    for (int g = 0; g < G; ++g) {
      float* lg = logits + g * kRowStride;
      for (int32_t t = len; t < padded; ++t) lg[t] = kNegInf;
      if (w.need_logits) {
        std::memcpy(&w.logits_all[(static_cast<size_t>(i) * G + g) * kChunkTokens], lg,
                    sizeof(float) * len);
      }
      VF<N> mv = vec::Splat<N>(kNegInf);
      for (int32_t t = 0; t < padded; t += N) mv = vec::Max<N>(mv, vec::Load<N>(lg + t));
      const float m = vec::HMax<N>(mv);
      VF<N> sv = VF<N>{};
      for (int32_t t = 0; t < padded; t += N) {
        const VF<N> e = vec::ExpNonPositive<N>(vec::Load<N>(lg + t) - m);
        vec::Store<N>(lg + t, e);
        sv += e;
      }
      w.part_m[i * G + g] = m;
      w.part_l[i * G + g] = vec::HSum<N>(sv);
    }
    // Values: acc[g] = sum_t p[g][t] v_t.
    float* acc = &w.part_acc[static_cast<size_t>(i) * G * d];
    std::fill(acc, acc + static_cast<size_t>(G) * d, 0.0f);
    for (int32_t t0 = 0; t0 < len; t0 += kTile) {
      const int n = std::min<int32_t>(kTile, len - t0);
      if (t0 + kTile < len)
        PrefetchRecords(vrec + t0 + kTile, std::min(kTile, len - t0 - kTile), rb, d);
      TileRows<kIsa>(f, d, vrec + t0, n, tile, rows);
      for (int g0 = 0; g0 < G; g0 += kB) {
        ValueAccumAny<N>(std::min(kB, G - g0), rows, n, d, logits + g0 * kRowStride + t0,
                         acc + static_cast<size_t>(g0) * d);
      }
    }
  }
}

// Weights p = exp(l - M) / L per (head, token) and their group mean into the H2O scores.
template <int N>
KVC_CPU_INLINE void WeightItemsT(const DecodeWork& w, int64_t i0, int64_t i1) {
  const DecodeAttentionArgs& a = *w.a;
  const int G = a.group_size;
  alignas(64) float p[kChunkTokens], mean[kChunkTokens];
  for (int64_t i = i0; i < i1; ++i) {
    const Item it = w.items[i];
    const int32_t len = it.end - it.begin;
    std::fill(mean, mean + kChunkTokens, 0.0f);
    for (int g = 0; g < G; ++g) {
      const size_t row = static_cast<size_t>(it.lane) * G + g;
      const float* lg = &w.logits_all[(static_cast<size_t>(i) * G + g) * kChunkTokens];
      const VF<N> m = vec::Splat<N>(w.lane_m[row]), sum = vec::Splat<N>(w.lane_l[row]);
      const VF<N> groups = vec::Splat<N>(static_cast<float>(G));
      for (int32_t t = 0; t < len; t += N) {  // logits past len are finite or garbage: unused
        VF<N> x = vec::Load<N>(lg + t) - m;
        x = x < VF<N>{} ? x : VF<N>{};
        const VF<N> pv = vec::ExpNonPositive<N>(x) / sum;
        vec::Store<N>(p + t, pv);
        vec::Store<N>(mean + t, vec::Load<N>(mean + t) + pv / groups);
      }
      if (a.weights != nullptr)
        std::memcpy(a.weights + row * a.lanes.max_tokens + it.begin, p, sizeof(float) * len);
    }
    if (a.scores != nullptr) {
      float* KVC_RESTRICT dst =
          a.scores + static_cast<size_t>(it.lane) * a.lanes.max_tokens + it.begin;
      for (int32_t t = 0; t < len; ++t) dst[t] += mean[t];
    }
  }
}

#if defined(KVC_CPU_DISPATCH)
KVC_AVX512_TARGET void DecodeItemsAvx512(const DecodeWork& w, int64_t i0, int64_t i1) {
  DecodeItemsT<16, CpuIsa::kAvx512>(w, i0, i1);
}
__attribute__((target("avx2,f16c,fma"))) void DecodeItemsAvx2(const DecodeWork& w, int64_t i0,
                                                              int64_t i1) {
  DecodeItemsT<8, CpuIsa::kAvx2>(w, i0, i1);
}
KVC_AVX512_TARGET void WeightItemsAvx512(const DecodeWork& w, int64_t i0, int64_t i1) {
  WeightItemsT<16>(w, i0, i1);
}
__attribute__((target("avx2,f16c,fma"))) void WeightItemsAvx2(const DecodeWork& w, int64_t i0,
                                                              int64_t i1) {
  WeightItemsT<8>(w, i0, i1);
}
#endif

void DecodeItems(const DecodeWork& w, int64_t i0, int64_t i1) {
#if defined(KVC_CPU_DISPATCH)
  switch (CpuIsaLevel()) {
    case CpuIsa::kAvx512:
      return DecodeItemsAvx512(w, i0, i1);
    case CpuIsa::kAvx2:
      return DecodeItemsAvx2(w, i0, i1);
    case CpuIsa::kBaseline:
      break;
  }
#endif
  DecodeItemsT<4, CpuIsa::kBaseline>(w, i0, i1);
}

void WeightItems(const DecodeWork& w, int64_t i0, int64_t i1) {
#if defined(KVC_CPU_DISPATCH)
  switch (CpuIsaLevel()) {
    case CpuIsa::kAvx512:
      return WeightItemsAvx512(w, i0, i1);
    case CpuIsa::kAvx2:
      return WeightItemsAvx2(w, i0, i1);
    case CpuIsa::kBaseline:
      break;
  }
#endif
  WeightItemsT<4>(w, i0, i1);
}

}  // namespace

void DecodeAttention(ThreadPool& pool, const DecodeAttentionArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const int G = a.group_size;
  const float scale = AttentionScale(d);
  CallScratch& cs = CallerScratch();
  std::vector<Item>& items = cs.items;
  std::vector<int32_t>& first_item = cs.first_item;
  items.clear();
  first_item.resize(a.lanes.num_lanes + 1);
  for (int32_t lane = 0; lane < a.lanes.num_lanes; ++lane) {
    first_item[lane] = static_cast<int32_t>(items.size());
    const int32_t n = a.lanes.num_tokens[lane];
    for (int32_t t = 0; t < n; t += kChunkTokens)
      items.push_back({lane, t, std::min(n, t + kChunkTokens)});
  }
  first_item[a.lanes.num_lanes] = static_cast<int32_t>(items.size());
  const bool need_logits = a.weights != nullptr || a.scores != nullptr;
  // Per item and query head: max, sum of exp, and d weighted-value sums.
  cs.part_m.resize(items.size() * G);
  cs.part_l.resize(items.size() * G);
  cs.part_acc.resize(items.size() * G * d);
  // Padded by a vector: the weights pass reads whole vectors past a short item's tokens.
  if (need_logits) cs.logits_all.resize(items.size() * G * kChunkTokens + 16);
  cs.lane_m.resize(static_cast<size_t>(a.lanes.num_lanes) * G);
  cs.lane_l.resize(cs.lane_m.size());
  float* part_m = cs.part_m.data();
  float* part_l = cs.part_l.data();
  float* part_acc = cs.part_acc.data();
  float* lane_m = cs.lane_m.data();
  float* lane_l = cs.lane_l.data();

  const DecodeWork work{&a,       items.data(),         scale,  need_logits, part_m, part_l,
                        part_acc, cs.logits_all.data(), lane_m, lane_l};
  pool.ParallelFor(static_cast<int64_t>(items.size()), 1,
                   [&](int64_t i0, int64_t i1) { DecodeItems(work, i0, i1); });

  // Combine per (lane, query head); keep the global max and sum for the weights pass.
  pool.ParallelFor(a.lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    alignas(64) float out[kMaxHeadDim];
    for (int64_t lane = l0; lane < l1; ++lane) {
      for (int g = 0; g < G; ++g) {
        float M = kNegInf;
        for (int32_t i = first_item[lane]; i < first_item[lane + 1]; ++i)
          M = std::max(M, part_m[i * G + g]);
        float L = 0.0f;
        std::fill(out, out + d, 0.0f);
        for (int32_t i = first_item[lane]; i < first_item[lane + 1]; ++i) {
          const float f = std::exp(part_m[i * G + g] - M);
          L += part_l[i * G + g] * f;
          Axpy(f, &part_acc[(static_cast<size_t>(i) * G + g) * d], out, d);
        }
        const float inv = L > 0 ? 1.0f / L : 0.0f;
        for (int j = 0; j < d; ++j) out[j] *= inv;
        StoreRow<false>(out, d, a.out, a.dtype, (static_cast<size_t>(lane) * G + g) * d);
        lane_m[lane * G + g] = M;
        lane_l[lane * G + g] = L;
        if (a.lse != nullptr) a.lse[lane * G + g] = L > 0 ? M + std::log(L) : kNegInf;
      }
    }
  });
  if (!need_logits) return;
  pool.ParallelFor(static_cast<int64_t>(items.size()), 1,
                   [&](int64_t i0, int64_t i1) { WeightItems(work, i0, i1); });
}

}  // namespace kvc::kernels::cpu
