// CPU Expected Attention scoring, H2O accumulation and top-k selection (SnapKV scoring:
// cpu_snapkv.cc). Accumulation and selection work on the caller's metadata arrays only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/cpu_rows.h"
#include "kvc/kernels/record_codec.h"

namespace kvc::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int32_t kScoreChunk = 256;  // tokens summed at once (a stack buffer)

// Logits of Expected Attention for tokens [t0, t1) of a lane, every query head: each key (and
// value, for its norm) is dequantized once, then per head k . mean and k^T cov k as the
// matvec cov k followed by a dot. logits: the lane's [group_size, n] rows; masked tokens
// (position < min_position) get -infinity and a norm of 0.
template <bool kFast>
KVC_CPU_INLINE void ExpectedLogitsImpl(const ExpectedAttentionScoreArgs& a, int32_t lane,
                                       int32_t t0, int32_t t1, float* logits, float* vnorm) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim, G = a.group_size;
  const int32_t n = a.lanes.num_tokens[lane];
  const float scale = AttentionScale(d);
  const float quad_scale = 0.5f / static_cast<float>(d);
  const size_t dd = static_cast<size_t>(d) * d;
  const int32_t* pos = a.key_positions + static_cast<size_t>(lane) * a.lanes.max_tokens;
  alignas(64) float k[kMaxHeadDim], v[kMaxHeadDim], ck[kMaxHeadDim];
  const LaneSlots slots(a.lanes, l.block_tokens, lane);
  for (int32_t t = t0; t < t1; ++t) {
    if (pos[t] < a.min_position) {
      for (int g = 0; g < G; ++g) logits[static_cast<size_t>(g) * n + t] = kNegInf;
      vnorm[t] = 0.0f;
      continue;
    }
    int32_t b, s;
    slots.Get(t, &b, &s);
    DequantizeRecord(l.format, d, KeyRecord(a.arena, b, s), k);
    if (a.value_norm) {
      DequantizeRecord(l.format, d, ValueRecord(a.arena, b, s), v);
      vnorm[t] = std::sqrt(Dot(v, v, d));
    }
    for (int g = 0; g < G; ++g) {
      const size_t head = static_cast<size_t>(lane) * G + g;
      float logit = Dot(k, a.mean + head * d, d) * scale;
      if (a.cov != nullptr) {
        const float* cov = a.cov + head * dd;
        for (int i = 0; i < d; ++i) ck[i] = Dot(cov + static_cast<size_t>(i) * d, k, d);
        logit += Dot(k, ck, d) * quad_scale;
      }
      logits[static_cast<size_t>(g) * n + t] = logit;
    }
  }
}

#if defined(KVC_CPU_DISPATCH)
KVC_CPU_TARGET_FAST void ExpectedLogitsFast(const ExpectedAttentionScoreArgs& a, int32_t lane,
                                            int32_t t0, int32_t t1, float* logits, float* vnorm) {
  ExpectedLogitsImpl<true>(a, lane, t0, t1, logits, vnorm);
}
#endif

void ExpectedLogits(const ExpectedAttentionScoreArgs& a, int32_t lane, int32_t t0, int32_t t1,
                    float* logits, float* vnorm) {
#if defined(KVC_CPU_DISPATCH)
  if (CpuHasFastPath()) return ExpectedLogitsFast(a, lane, t0, t1, logits, vnorm);
#endif
  ExpectedLogitsImpl<false>(a, lane, t0, t1, logits, vnorm);
}

}  // namespace

// Two passes: (lane, 256-token chunk) items compute every head's logits and the value norms
// (the O(head_dim^2) part, so one long lane still spreads over the pool); then per lane one
// max-subtracted softmax per head, the group mean and the value norm.
void ExpectedAttentionScore(ThreadPool& pool, const ExpectedAttentionScoreArgs& a) {
  const LaneTable& lanes = a.lanes;
  const int G = a.group_size;
  std::vector<int64_t> off(lanes.num_lanes + 1, 0), first_item(lanes.num_lanes + 1, 0);
  for (int32_t lane = 0; lane < lanes.num_lanes; ++lane) {
    const int32_t n = lanes.num_tokens[lane];
    off[lane + 1] = off[lane] + n;
    first_item[lane + 1] = first_item[lane] + (n + kScoreChunk - 1) / kScoreChunk;
  }
  // Lane l's logits: [off[l] * G, (off[l] + n) * G) as [G, n]; its norms: [off[l], off[l] + n).
  std::vector<float> logits(static_cast<size_t>(off.back()) * G);
  std::vector<float> vnorm(static_cast<size_t>(off.back()), 1.0f);
  pool.ParallelFor(first_item.back(), 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int32_t lane = static_cast<int32_t>(
          std::upper_bound(first_item.begin(), first_item.end(), i) - first_item.begin() - 1);
      const int32_t n = lanes.num_tokens[lane];
      const int32_t t0 = static_cast<int32_t>(i - first_item[lane]) * kScoreChunk;
      ExpectedLogits(a, lane, t0, std::min(n, t0 + kScoreChunk),
                     &logits[static_cast<size_t>(off[lane]) * G], &vnorm[off[lane]]);
    }
  });
  pool.ParallelFor(lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    std::vector<float> score;
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = lanes.num_tokens[lane];
      const int32_t* pos = a.key_positions + static_cast<size_t>(lane) * lanes.max_tokens;
      const float* rows = &logits[static_cast<size_t>(off[lane]) * G];
      score.assign(n, 0.0f);
      for (int g = 0; g < G; ++g) {
        const float* lg = rows + static_cast<size_t>(g) * n;
        float m = kNegInf;
        for (int32_t t = 0; t < n; ++t) m = std::max(m, lg[t]);
        if (m == kNegInf) continue;  // no token in the softmax
        float sum = 0.0f;
        for (int32_t t = 0; t < n; ++t) sum += std::exp(lg[t] - m);  // masked: exp(-inf) = 0
        for (int32_t t = 0; t < n; ++t)
          score[t] += std::exp(lg[t] - m) / sum / static_cast<float>(G);
      }
      const float* norm = &vnorm[off[lane]];
      float* dst = a.scores + static_cast<size_t>(lane) * lanes.max_tokens;
      for (int32_t t = 0; t < n; ++t) {
        if (pos[t] < a.min_position) {
          dst[t] = 0.0f;
        } else {
          dst[t] = a.value_norm ? score[t] * norm[t] : score[t];
        }
      }
    }
  });
}

// The group sum runs over contiguous floats in the reference's order (g ascending, then one
// division), so it vectorizes across tokens and stays bit-identical.
void AccumulateScores(ThreadPool& pool, const AccumulateScoresArgs& a) {
  const int G = a.group_size;
  const size_t stride = static_cast<size_t>(a.max_tokens);
  pool.ParallelFor(a.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    alignas(64) float sum[kScoreChunk];
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = a.num_tokens[lane];
      const float* w = a.weights + static_cast<size_t>(lane) * G * stride;
      float* scores = a.scores + static_cast<size_t>(lane) * stride;
      for (int32_t t0 = 0; t0 < n; t0 += kScoreChunk) {
        const int count = std::min(kScoreChunk, n - t0);
        float* KVC_RESTRICT s = sum;
        for (int i = 0; i < count; ++i) s[i] = 0.0f;
        for (int g = 0; g < G; ++g) {
          const float* KVC_RESTRICT wg = w + g * stride + t0;
          for (int i = 0; i < count; ++i) s[i] += wg[i];
        }
        float* KVC_RESTRICT dst = scores + t0;
        for (int i = 0; i < count; ++i) dst[i] += s[i] / static_cast<float>(G);
      }
    }
  });
}

// Partial sorts (nth_element) instead of the reference's full sorts: the kept set is the
// same because both orders are total (position, then index; score, then position, index).
void Select(ThreadPool& pool, const SelectArgs& a) {
  pool.ParallelFor(a.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    std::vector<int32_t> idx;
    std::vector<float> score;
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = a.num_tokens[lane];
      const size_t row = static_cast<size_t>(lane) * a.max_tokens;
      uint8_t* keep = a.keep + row;
      std::memset(keep, 0, a.max_tokens);
      const int64_t budget = a.budgets != nullptr ? std::max(0, a.budgets[lane]) : a.budget;
      if (static_cast<int64_t>(n) <= static_cast<int64_t>(a.sinks) + a.recent + budget) {
        std::memset(keep, 1, n);
        continue;
      }
      const int32_t* pos = a.positions + row;
      score.resize(n);
      idx.resize(n);
      for (int32_t t = 0; t < n; ++t) {
        const float sc = a.scores[row + t];
        score[t] = std::isnan(sc) ? kNegInf : sc;
        idx[t] = t;
      }
      auto by_pos = [&](int32_t x, int32_t y) {
        return pos[x] != pos[y] ? pos[x] < pos[y] : x < y;
      };
      // Partition: [0, sinks) lowest positions, [n - recent, n) highest, the rest between.
      auto first = idx.begin(), last = idx.end();
      if (a.sinks > 0) std::nth_element(first, first + a.sinks, last, by_pos);
      if (a.recent > 0) std::nth_element(first + a.sinks, last - a.recent, last, by_pos);
      for (int32_t i = 0; i < a.sinks; ++i) keep[idx[i]] = 1;
      for (int32_t i = n - a.recent; i < n; ++i) keep[idx[i]] = 1;
      auto by_score = [&](int32_t x, int32_t y) {
        if (score[x] != score[y]) return score[x] > score[y];
        return by_pos(x, y);
      };
      if (budget > 0) {
        std::nth_element(first + a.sinks, first + a.sinks + budget - 1, last - a.recent, by_score);
        for (int64_t i = 0; i < budget; ++i) keep[idx[a.sinks + i]] = 1;
      }
    }
  });
}

}  // namespace kvc::kernels::cpu
