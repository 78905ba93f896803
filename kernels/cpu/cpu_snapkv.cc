// CPU SnapKV scoring, blocked as a small GEMM: a tile of 64 keys is dequantized once and
// multiplied by every query of a chunk (all group_size x window queries of a lane when they
// fit), so each key costs one conversion and the q.k products run as register-blocked FMA
// (tokens x 16-query vectors). Softmax needs each query's max and sum over all keys before
// any token's vote is known, so a chunk keeps its probabilities e = exp(l - m_tile) (one exp
// per product) with per-tile maxima m_tile and sums s_tile; once all tiles are seen, one
// coefficient per (tile, query), exp(m_tile - m) / sum, turns them into votes. Queries lie
// along vector lanes (per-query maxima and sums are plain lane-wise ops), padded per
// (head, window range) segment to whole vectors. Results equal the reference's up to float
// reassociation (FMA, blocked sums, a polynomial exp of ~1 ulp); the file is built with
// -ffp-contract=fast for that reason (see CMakeLists.txt).
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

// Vector helpers and the exp shared with decode attention (cpu_vec.h).
using vec::ExpNonPositive;
using vec::Load;
using vec::Max;
using vec::Splat;
using vec::Store;
using vec::VF;
using vec::VI;

constexpr int kTile = 64;                         // keys per tile
constexpr int kMaxChunkLanes = 256;               // query lanes per chunk (bounds scratch rows)
constexpr size_t kChunkBytes = size_t{32} << 20;  // probabilities kept per chunk
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

KVC_CPU_INLINE float HSum(VF<4> v) {
  VF<4> s = v + __builtin_shufflevector(v, v, 2, 3, 0, 1);
  s += __builtin_shufflevector(s, s, 1, 0, 3, 2);
  return s[0];
}
KVC_CPU_INLINE float HSum(VF<8> v) {
  VF<8> s = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  s += __builtin_shufflevector(s, s, 2, 3, 0, 1, 2, 3, 0, 1);
  s += __builtin_shufflevector(s, s, 1, 0, 1, 0, 1, 0, 1, 0);
  return s[0];
}
KVC_CPU_INLINE float HSum(VF<16> v) {
  VF<16> s =
      v + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  s += __builtin_shufflevector(s, s, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  s += __builtin_shufflevector(s, s, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  s += __builtin_shufflevector(s, s, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return s[0];
}

// Queries [q0, q0 + count) of window row w0.. of head g occupy lanes [lane0, lane0 + count)
// of a chunk; `lanes` is count rounded up to 16.
struct Segment {
  int g, w0, count, lane0, lanes;
};

// Per-thread scratch, kept between calls: chunks of a lane reuse it without page faults.
struct Scratch {
  std::vector<float> probs, qt, keys, tile_max, tile_sum, vote, pooled_row;
  std::vector<int32_t> qpos, kpos;
};
Scratch& ThreadScratch() {
  static thread_local Scratch s;
  return s;
}

void Pool(const float* vote, int32_t n, int32_t pooled_len, int kernel, PoolKind kind, float* out) {
  const int half = kernel / 2;
  for (int32_t t = 0; t < n; ++t) {
    if (t >= pooled_len || kernel == 1) {
      out[t] = vote[t];
      continue;
    }
    const int32_t lo = std::max(0, t - half), hi = std::min(pooled_len - 1, t + half);
    float v = kind == PoolKind::kMax ? vote[lo] : 0.0f;
    for (int32_t u = lo; u <= hi; ++u)
      v = kind == PoolKind::kMax ? std::max(v, vote[u]) : v + vote[u];
    out[t] = kind == PoolKind::kMax ? v : v / static_cast<float>(kernel);
  }
}

// One (lane, heads) work item; shared by every instance.
struct Item {
  const SnapKvScoreArgs* a;
  int32_t lane, n;
  int g0, g1;
  float scale;
  float* pooled;  // [g1 - g0 rows of the lane's pooled scores, stride n]
};

// Key t of a lane: its record, with its position in *pos; keys past n are zero rows at a
// position no query sees (nullptr).
KVC_CPU_INLINE const uint8_t* KeyTileRow(const SnapKvScoreArgs& a, int32_t lane, int32_t n,
                                         int32_t t, float* row, int32_t* pos) {
  const BlockLayout& l = a.arena.layout;
  if (t >= n) {
    std::memset(row, 0, sizeof(float) * l.head_dim);
    *pos = std::numeric_limits<int32_t>::max();
    return nullptr;
  }
  int32_t b, slot;
  LaneTokenSlot(a.lanes, l.block_tokens, lane, t, &b, &slot);
  *pos = a.key_positions[static_cast<size_t>(lane) * a.lanes.max_tokens + t];
  return KeyRecord(a.arena, b, slot);
}

// Keys [t0, t0 + kTile) of a lane as f32 rows [kTile, head_dim] and their positions.
void LoadKeyTile(const SnapKvScoreArgs& a, int32_t lane, int32_t n, int32_t t0, float* keys,
                 int32_t* kpos) {
  const int d = a.arena.layout.head_dim;
  for (int r = 0; r < kTile; ++r) {
    float* row = keys + static_cast<size_t>(r) * d;
    if (const uint8_t* rec = KeyTileRow(a, lane, n, t0 + r, row, &kpos[r]))
      DequantizeRecord(a.arena.layout.format, d, rec, row);
  }
}
#if defined(KVC_CPU_DISPATCH)
KVC_AVX512_TARGET void LoadKeyTileAvx512(const SnapKvScoreArgs& a, int32_t lane, int32_t n,
                                         int32_t t0, float* keys, int32_t* kpos) {
  const int d = a.arena.layout.head_dim;
  for (int r = 0; r < kTile; ++r) {
    float* row = keys + static_cast<size_t>(r) * d;
    if (const uint8_t* rec = KeyTileRow(a, lane, n, t0 + r, row, &kpos[r]))
      avx512::DequantizeRecord<DType::kF32>(a.arena.layout.format, d, rec, row);
  }
}
#endif

// logits of R keys x V query vectors, accumulated over head_dim. keys: R rows of d floats;
// qt: [d, qstride] transposed queries starting at the first vector.
template <int N, int R, int V>
KVC_CPU_INLINE void MicroKernel(const float* keys, int d, const float* qt, int qstride,
                                VF<N> (&acc)[R][V]) {
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = VF<N>{};
  }
  for (int j = 0; j < d; ++j) {
    VF<N> q[V];
    for (int v = 0; v < V; ++v) q[v] = Load<N>(qt + static_cast<size_t>(j) * qstride + N * v);
    for (int r = 0; r < R; ++r) {
      const float k = keys[r * d + j];
      for (int v = 0; v < V; ++v) acc[r][v] += k * q[v];
    }
  }
}

// Logits of keys [r0, r0 + R) of the tile against query vectors [v0, v0 + V): scaled,
// masked by position, stored as rows of `probs`; running tile maxima per vector.
template <int N, int R, int V>
KVC_CPU_INLINE void LogitBlock(const float* keys, int d, const float* qt, int qs,
                               const int32_t* kpos, const int32_t* qpos, float scale, int r0,
                               int v0, float* probs, VF<N>* tmax) {
  VF<N> acc[R][V];
  MicroKernel<N, R, V>(keys + static_cast<size_t>(r0) * d, d, qt + N * v0, qs, acc);
  VI<N> qp[V];
  for (int v = 0; v < V; ++v) std::memcpy(&qp[v], qpos + N * (v0 + v), sizeof(VI<N>));
  for (int r = 0; r < R; ++r) {
    const VI<N> kp = VI<N>{} + kpos[r0 + r];
    for (int v = 0; v < V; ++v) {
      const VF<N> l = kp > qp[v] ? Splat<N>(kNegInf) : acc[r][v] * scale;
      Store<N>(probs + static_cast<size_t>(r0 + r) * qs + N * (v0 + v), l);
      tmax[v0 + v] = Max<N>(tmax[v0 + v], l);
    }
  }
}

// Tile logits for query vectors [v0, v0 + V), all kTile keys, with key rows in blocks of R.
template <int N, int R, int V>
KVC_CPU_INLINE void LogitTile(const float* keys, int d, const float* qt, int qs,
                              const int32_t* kpos, const int32_t* qpos, float scale, int v0,
                              float* probs, VF<N>* tmax) {
  constexpr int kFull = kTile / R * R;
  for (int r0 = 0; r0 < kFull; r0 += R)
    LogitBlock<N, R, V>(keys, d, qt, qs, kpos, qpos, scale, r0, v0, probs, tmax);
  if constexpr (kTile % R != 0) {
    LogitBlock<N, kTile % R, V>(keys, d, qt, qs, kpos, qpos, scale, kFull, v0, probs, tmax);
  }
}

// kR keys x kV query vectors of N lanes per register block (24 zmm accumulators with
// AVX-512, 12 ymm with AVX2, 8 xmm on baseline x86-64).
template <int N, int kR, int kV, bool kAvx512>
KVC_CPU_INLINE void ScoreItem(const Item& it) {
  const SnapKvScoreArgs& a = *it.a;
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim, W = a.window, G = a.group_size;
  const int32_t n = it.n;
  const int tiles = (n + kTile - 1) / kTile;
  const size_t n_pad = static_cast<size_t>(tiles) * kTile;
  Scratch& s = ThreadScratch();
  s.vote.assign(static_cast<size_t>(it.g1 - it.g0) * n, 0.0f);
  if (n == 0) return;
  // Chunk capacity in query lanes: probabilities of n_pad keys x lanes within the budget.
  int cap = static_cast<int>(std::min<size_t>(kMaxChunkLanes, kChunkBytes / (n_pad * 4)));
  cap = std::max(16, cap / 16 * 16);
  std::vector<Segment> segs;
  for (int g = it.g0; g < it.g1; ++g) {
    for (int w0 = 0; w0 < W; w0 += cap) {
      const int count = std::min(cap, W - w0);
      segs.push_back(Segment{g, w0, count, 0, (count + 15) / 16 * 16});
    }
  }
  s.keys.resize(static_cast<size_t>(kTile) * d);
  s.kpos.resize(kTile);
  for (size_t first = 0; first < segs.size();) {
    // A chunk: consecutive segments within the lane capacity.
    size_t last = first;
    int qs = 0;
    while (last < segs.size() && qs + segs[last].lanes <= cap) {
      segs[last].lane0 = qs;
      qs += segs[last++].lanes;
    }
    const int qv = qs / N;
    s.qt.assign(static_cast<size_t>(d) * qs, 0.0f);
    s.qpos.assign(qs, std::numeric_limits<int32_t>::min());  // padding lanes see no key
    alignas(64) float q[kMaxHeadDim];
    for (size_t i = first; i < last; ++i) {
      const Segment& sg = segs[i];
      for (int w = 0; w < sg.count; ++w) {
        const size_t row = (static_cast<size_t>(it.lane) * G + sg.g) * W + sg.w0 + w;
        LoadRow<false>(a.queries, a.query_dtype, row * d, d, q);
        for (int j = 0; j < d; ++j) s.qt[static_cast<size_t>(j) * qs + sg.lane0 + w] = q[j];
        s.qpos[sg.lane0 + w] = a.query_positions[static_cast<size_t>(it.lane) * W + sg.w0 + w];
      }
    }
    s.probs.resize(n_pad * qs);
    s.tile_max.resize(static_cast<size_t>(tiles) * qs);
    s.tile_sum.resize(static_cast<size_t>(tiles) * qs);
    alignas(64) VF<N> tmax[kMaxChunkLanes / N];
    for (int tile = 0; tile < tiles; ++tile) {
      const int32_t t0 = tile * kTile;
#if defined(KVC_CPU_DISPATCH)
      if constexpr (kAvx512) {
        LoadKeyTileAvx512(a, it.lane, n, t0, s.keys.data(), s.kpos.data());
      } else {
        LoadKeyTile(a, it.lane, n, t0, s.keys.data(), s.kpos.data());
      }
#else
      LoadKeyTile(a, it.lane, n, t0, s.keys.data(), s.kpos.data());
#endif
      float* probs = &s.probs[static_cast<size_t>(t0) * qs];
      for (int v = 0; v < qv; ++v) tmax[v] = Splat<N>(kNegInf);
      int v0 = 0;
      for (; v0 + kV <= qv; v0 += kV) {
        LogitTile<N, kR, kV>(s.keys.data(), d, s.qt.data(), qs, s.kpos.data(), s.qpos.data(),
                             it.scale, v0, probs, tmax);
      }
      for (; v0 < qv; ++v0) {
        LogitTile<N, kR, 1>(s.keys.data(), d, s.qt.data(), qs, s.kpos.data(), s.qpos.data(),
                            it.scale, v0, probs, tmax);
      }
      // Probabilities against the tile maximum (a fully masked lane keeps 0s).
      for (int v = 0; v < qv; ++v) {
        const VF<N> m = tmax[v] == Splat<N>(kNegInf) ? VF<N>{} : tmax[v];
        VF<N> sum = VF<N>{};
        for (int r = 0; r < kTile; ++r) {
          float* p = probs + static_cast<size_t>(r) * qs + N * v;
          const VF<N> e = ExpNonPositive<N>(Load<N>(p) - m);
          Store<N>(p, e);
          sum += e;
        }
        Store<N>(&s.tile_max[static_cast<size_t>(tile) * qs + N * v], tmax[v]);
        Store<N>(&s.tile_sum[static_cast<size_t>(tile) * qs + N * v], sum);
      }
    }
    // Per query: global max m and sum; tile_max becomes exp(m_tile - m) / sum (0 for a
    // query that sees no key, which the reference skips).
    for (int v = 0; v < qv; ++v) {
      VF<N> m = Splat<N>(kNegInf);
      for (int tile = 0; tile < tiles; ++tile)
        m = Max<N>(m, Load<N>(&s.tile_max[static_cast<size_t>(tile) * qs + N * v]));
      const VF<N> m_safe = m == Splat<N>(kNegInf) ? VF<N>{} : m;
      VF<N> sum = VF<N>{};
      for (int tile = 0; tile < tiles; ++tile) {
        float* tm = &s.tile_max[static_cast<size_t>(tile) * qs + N * v];
        const VF<N> f = ExpNonPositive<N>(Load<N>(tm) - m_safe);
        Store<N>(tm, f);
        sum += f * Load<N>(&s.tile_sum[static_cast<size_t>(tile) * qs + N * v]);
      }
      const VF<N> inv = sum > VF<N>{} ? 1.0f / sum : VF<N>{};
      for (int tile = 0; tile < tiles; ++tile) {
        float* tm = &s.tile_max[static_cast<size_t>(tile) * qs + N * v];
        Store<N>(tm, Load<N>(tm) * inv);
      }
    }
    // Votes: per token and segment, the sum over its queries of e * coefficient.
    for (int32_t t = 0; t < n; ++t) {
      const float* p = &s.probs[static_cast<size_t>(t) * qs];
      const float* c = &s.tile_max[static_cast<size_t>(t / kTile) * qs];
      for (size_t i = first; i < last; ++i) {
        const Segment& sg = segs[i];
        VF<N> acc = VF<N>{};
        for (int lane = sg.lane0; lane < sg.lane0 + sg.lanes; lane += N)
          acc += Load<N>(p + lane) * Load<N>(c + lane);
        s.vote[static_cast<size_t>(sg.g - it.g0) * n + t] += HSum(acc);
      }
    }
    first = last;
  }
  for (int g = it.g0; g < it.g1; ++g) {
    Pool(&s.vote[static_cast<size_t>(g - it.g0) * n], n, std::max(0, n - W), a.pool_kernel, a.pool,
         it.pooled + static_cast<size_t>(g - it.g0) * n);
  }
}

#if defined(KVC_CPU_DISPATCH)
KVC_AVX512_TARGET void ScoreItemAvx512(const Item& it) { ScoreItem<16, 6, 4, true>(it); }
__attribute__((target("avx2,f16c,fma"))) void ScoreItemAvx2(const Item& it) {
  ScoreItem<8, 6, 2, false>(it);
}
#endif

void ScoreItemAny(const Item& it) {
#if defined(KVC_CPU_DISPATCH)
  switch (CpuIsaLevel()) {
    case CpuIsa::kAvx512:
      return ScoreItemAvx512(it);
    case CpuIsa::kAvx2:
      return ScoreItemAvx2(it);
    case CpuIsa::kBaseline:
      break;
  }
#endif
  ScoreItem<4, 4, 2, false>(it);
}

}  // namespace

void SnapKvScore(ThreadPool& pool, const SnapKvScoreArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim, G = a.group_size;
  const float scale = AttentionScale(d);
  const LaneTable& lanes = a.lanes;
  std::vector<int64_t> off(lanes.num_lanes + 1, 0);
  for (int32_t lane = 0; lane < lanes.num_lanes; ++lane)
    off[lane + 1] = off[lane] + lanes.num_tokens[lane];
  // Pooled votes per (lane, head): [off[lane] * G + g * n, ...).
  std::vector<float> pooled(static_cast<size_t>(off.back()) * G);
  // Items: whole lanes (every key converted once) unless that leaves threads idle.
  int heads_per_item = G;
  while (heads_per_item > 1 &&
         static_cast<int64_t>(lanes.num_lanes) * ((G + heads_per_item - 1) / heads_per_item) <
             pool.size()) {
    heads_per_item = (heads_per_item + 1) / 2;
  }
  const int splits = (G + heads_per_item - 1) / heads_per_item;
  pool.ParallelFor(static_cast<int64_t>(lanes.num_lanes) * splits, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      Item it;
      it.a = &a;
      it.lane = static_cast<int32_t>(i / splits);
      it.n = lanes.num_tokens[it.lane];
      it.g0 = static_cast<int>(i % splits) * heads_per_item;
      it.g1 = std::min(G, it.g0 + heads_per_item);
      it.scale = scale;
      it.pooled =
          &pooled[static_cast<size_t>(off[it.lane]) * G + static_cast<size_t>(it.g0) * it.n];
      ScoreItemAny(it);
    }
  });
  pool.ParallelFor(lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = lanes.num_tokens[lane];
      const float* rows = &pooled[static_cast<size_t>(off[lane]) * G];
      float* dst = a.scores + static_cast<size_t>(lane) * lanes.max_tokens;
      for (int32_t t = 0; t < n; ++t) {
        float sc = 0.0f;
        for (int g = 0; g < G; ++g)
          sc += rows[static_cast<size_t>(g) * n + t] / static_cast<float>(G);
        dst[t] = a.mode == ScoreMode::kAccumulate ? dst[t] + sc : sc;
      }
    }
  });
}

}  // namespace kvc::kernels::cpu
