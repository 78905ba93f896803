// CPU H2O accumulation and top-k selection (SnapKV scoring: cpu_snapkv.cc). Both work on the
// caller's metadata arrays only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/cpu_rows.h"

namespace kvc::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int32_t kScoreChunk = 256;  // tokens summed at once (a stack buffer)

}  // namespace

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
