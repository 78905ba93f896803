// CPU paged decode attention, split over (lane, token chunk) work items like flash-decoding:
// each item keeps a running max, sum and weighted value sum per query head in fp32, and a
// combine step rescales the partials by exp(m_i - M). This parallelizes one long sequence
// as well as many short ones.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/cpu_rows.h"
#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::cpu {
namespace {

constexpr int32_t kChunkTokens = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Item {
  int32_t lane;
  int32_t begin;  // stored token range [begin, end)
  int32_t end;
};

}  // namespace

// The per-item work of the chunk pass, compiled per instruction set (cpu_rows.h).
struct DecodeWork {
  const DecodeAttentionArgs* a;
  const Item* items;
  float scale;
  bool need_logits;
  float* part_m;
  float* part_l;
  float* part_acc;
  float* logits_all;
};

template <bool kFast>
KVC_CPU_INLINE void DecodeItemsT(const DecodeWork& w, int64_t i0, int64_t i1) {
  const DecodeAttentionArgs& a = *w.a;
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const int G = a.group_size;
  const float scale = w.scale;
  const bool need_logits = w.need_logits;
  const Item* items = w.items;
  float* part_m = w.part_m;
  float* part_l = w.part_l;
  float* part_acc = w.part_acc;
  float* logits_all = w.logits_all;
  std::vector<float> q(static_cast<size_t>(G) * d), kv(d),
      logits(static_cast<size_t>(G) * kChunkTokens);
  for (int64_t i = i0; i < i1; ++i) {
    const Item it = items[i];
    const int32_t len = it.end - it.begin;
    for (int g = 0; g < G; ++g) {
      LoadRow<kFast>(a.queries, a.dtype, (static_cast<size_t>(it.lane) * G + g) * d, d,
                     &q[static_cast<size_t>(g) * d]);
    }
    for (int32_t t = 0; t < len; ++t) {
      int32_t b, s;
      LaneTokenSlot(a.lanes, l.block_tokens, it.lane, it.begin + t, &b, &s);
      DequantizeRecord(l.format, d, KeyRecord(a.arena, b, s), kv.data());
      for (int g = 0; g < G; ++g)
        logits[g * kChunkTokens + t] = Dot(&q[static_cast<size_t>(g) * d], kv.data(), d) * scale;
    }
    float* acc = &part_acc[static_cast<size_t>(i) * G * d];
    std::fill(acc, acc + static_cast<size_t>(G) * d, 0.0f);
    for (int g = 0; g < G; ++g) {
      float* lg = &logits[g * kChunkTokens];
      if (need_logits)
        std::copy(lg, lg + len, &logits_all[(static_cast<size_t>(i) * G + g) * kChunkTokens]);
      float m = kNegInf;
      for (int32_t t = 0; t < len; ++t) m = std::max(m, lg[t]);
      float sum = 0.0f;
      for (int32_t t = 0; t < len; ++t) {
        lg[t] = std::exp(lg[t] - m);
        sum += lg[t];
      }
      part_m[i * G + g] = m;
      part_l[i * G + g] = sum;
    }
    for (int32_t t = 0; t < len; ++t) {
      int32_t b, s;
      LaneTokenSlot(a.lanes, l.block_tokens, it.lane, it.begin + t, &b, &s);
      DequantizeRecord(l.format, d, ValueRecord(a.arena, b, s), kv.data());
      for (int g = 0; g < G; ++g)
        Axpy(logits[g * kChunkTokens + t], kv.data(), acc + static_cast<size_t>(g) * d, d);
    }
  }
}

#if defined(KVC_CPU_DISPATCH)
KVC_CPU_TARGET_FAST void DecodeItemsFast(const DecodeWork& w, int64_t i0, int64_t i1) {
  DecodeItemsT<true>(w, i0, i1);
}
#endif

void DecodeItems(const DecodeWork& w, int64_t i0, int64_t i1) {
#if defined(KVC_CPU_DISPATCH)
  if (CpuHasFastPath()) return DecodeItemsFast(w, i0, i1);
#endif
  DecodeItemsT<false>(w, i0, i1);
}

void DecodeAttention(ThreadPool& pool, const DecodeAttentionArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const int G = a.group_size;
  const float scale = a.scale != 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<Item> items;
  std::vector<int32_t> first_item(a.lanes.num_lanes + 1);
  for (int32_t lane = 0; lane < a.lanes.num_lanes; ++lane) {
    first_item[lane] = static_cast<int32_t>(items.size());
    const int32_t n = a.lanes.num_tokens[lane];
    for (int32_t t = 0; t < n; t += kChunkTokens)
      items.push_back({lane, t, std::min(n, t + kChunkTokens)});
  }
  first_item[a.lanes.num_lanes] = static_cast<int32_t>(items.size());
  const bool need_logits = a.weights != nullptr || a.accumulate_scores;
  // Per item and query head: max, sum of exp, and d weighted-value sums.
  std::vector<float> part_m(items.size() * G), part_l(items.size() * G);
  std::vector<float> part_acc(items.size() * G * d);
  std::vector<float> logits_all(need_logits ? items.size() * G * kChunkTokens : 0);

  const DecodeWork work{&a,
                        items.data(),
                        scale,
                        need_logits,
                        part_m.data(),
                        part_l.data(),
                        part_acc.data(),
                        logits_all.data()};
  pool.ParallelFor(static_cast<int64_t>(items.size()), 1,
                   [&](int64_t i0, int64_t i1) { DecodeItems(work, i0, i1); });

  // Combine per (lane, query head); keep the global max and sum for the weights pass.
  std::vector<float> lane_m(static_cast<size_t>(a.lanes.num_lanes) * G), lane_l(lane_m.size());
  pool.ParallelFor(a.lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    std::vector<float> out(d);
    for (int64_t lane = l0; lane < l1; ++lane) {
      for (int g = 0; g < G; ++g) {
        float M = kNegInf;
        for (int32_t i = first_item[lane]; i < first_item[lane + 1]; ++i)
          M = std::max(M, part_m[i * G + g]);
        float L = 0.0f;
        std::fill(out.begin(), out.end(), 0.0f);
        for (int32_t i = first_item[lane]; i < first_item[lane + 1]; ++i) {
          const float f = std::exp(part_m[i * G + g] - M);
          L += part_l[i * G + g] * f;
          Axpy(f, &part_acc[(static_cast<size_t>(i) * G + g) * d], out.data(), d);
        }
        const float inv = L > 0 ? 1.0f / L : 0.0f;
        for (int j = 0; j < d; ++j) out[j] *= inv;
        StoreRow<false>(out.data(), d, a.out, a.dtype, (static_cast<size_t>(lane) * G + g) * d);
        lane_m[lane * G + g] = M;
        lane_l[lane * G + g] = L;
        if (a.lse != nullptr) a.lse[lane * G + g] = L > 0 ? M + std::log(L) : kNegInf;
      }
    }
  });
  if (!need_logits) return;

  pool.ParallelFor(static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Item it = items[i];
      for (int32_t t = 0; t < it.end - it.begin; ++t) {
        float mean = 0.0f;
        for (int g = 0; g < G; ++g) {
          const size_t row = static_cast<size_t>(it.lane) * G + g;
          const float p = std::exp(logits_all[(static_cast<size_t>(i) * G + g) * kChunkTokens + t] -
                                   lane_m[row]) /
                          lane_l[row];
          if (a.weights != nullptr) a.weights[row * a.lanes.max_tokens + it.begin + t] = p;
          mean += p / static_cast<float>(G);
        }
        if (a.accumulate_scores) {
          int32_t b, s;
          LaneTokenSlot(a.lanes, l.block_tokens, it.lane, it.begin + t, &b, &s);
          *ScorePtr(a.arena, b, s) += mean;
        }
      }
    }
  });
}

}  // namespace kvc::kernels::cpu
