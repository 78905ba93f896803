// CPU SnapKV scoring, H2O accumulation, top-k selection and tail-to-hole compaction.
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

// Prefix sums of lane token counts: lane l's tokens are rows [off[l], off[l + 1]).
std::vector<int64_t> LaneRowOffsets(const LaneTable& lanes) {
  std::vector<int64_t> off(lanes.num_lanes + 1, 0);
  for (int32_t l = 0; l < lanes.num_lanes; ++l) off[l + 1] = off[l] + lanes.num_tokens[l];
  return off;
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

}  // namespace

void SnapKvScore(ThreadPool& pool, const SnapKvScoreArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const float scale = a.scale != 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const LaneTable& lanes = a.lanes;
  const std::vector<int64_t> off = LaneRowOffsets(lanes);
  const int64_t total = off.back();
  // Keys of every lane dequantized once: each is read by group_size * window queries.
  std::vector<float> keys(static_cast<size_t>(total) * d);
  std::vector<int32_t> pos(total);
  pool.ParallelFor(lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    for (int64_t lane = l0; lane < l1; ++lane) {
      for (int32_t t = 0; t < lanes.num_tokens[lane]; ++t) {
        int32_t b, s;
        LaneTokenSlot(lanes, l.block_tokens, static_cast<int32_t>(lane), t, &b, &s);
        DequantizeRecord(l.format, d, KeyRecord(a.arena, b, s), &keys[(off[lane] + t) * d]);
        pos[off[lane] + t] = *PositionPtr(a.arena, b, s);
      }
    }
  });
  // One work item per query head: pooled votes land in their own rows, summed below.
  const int64_t heads = static_cast<int64_t>(lanes.num_lanes) * a.group_size;
  std::vector<float> pooled(static_cast<size_t>(total) * a.group_size);
  pool.ParallelFor(heads, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> q(d), logits, vote;
    for (int64_t h = h0; h < h1; ++h) {
      const int32_t lane = static_cast<int32_t>(h / a.group_size);
      const int g = static_cast<int>(h % a.group_size);
      const int32_t n = lanes.num_tokens[lane];
      const float* k = &keys[off[lane] * d];
      const int32_t* p = &pos[off[lane]];
      logits.assign(n, 0.0f);
      vote.assign(n, 0.0f);
      for (int w = 0; w < a.window; ++w) {
        const size_t q_row = (static_cast<size_t>(lane) * a.group_size + g) * a.window + w;
        const int32_t q_pos = a.query_positions[static_cast<size_t>(lane) * a.window + w];
        LoadRow<false>(a.queries, a.query_dtype, q_row * d, d, q.data());
        float m = kNegInf;
        for (int32_t t = 0; t < n; ++t) {
          logits[t] =
              p[t] > q_pos ? kNegInf : Dot(q.data(), k + static_cast<size_t>(t) * d, d) * scale;
          m = std::max(m, logits[t]);
        }
        if (m == kNegInf) continue;
        float sum = 0.0f;
        for (int32_t t = 0; t < n; ++t) {
          logits[t] = std::exp(logits[t] - m);
          sum += logits[t];
        }
        const float inv = 1.0f / sum;
        for (int32_t t = 0; t < n; ++t) vote[t] += logits[t] * inv;
      }
      Pool(vote.data(), n, std::max(0, n - a.window), a.pool_kernel, a.pool,
           &pooled[static_cast<size_t>(off[lane]) * a.group_size + static_cast<size_t>(g) * n]);
    }
  });
  pool.ParallelFor(lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = lanes.num_tokens[lane];
      const float* rows = &pooled[static_cast<size_t>(off[lane]) * a.group_size];
      for (int32_t t = 0; t < n; ++t) {
        float sc = 0.0f;
        for (int g = 0; g < a.group_size; ++g)
          sc += rows[static_cast<size_t>(g) * n + t] / static_cast<float>(a.group_size);
        int32_t b, s;
        LaneTokenSlot(lanes, l.block_tokens, static_cast<int32_t>(lane), t, &b, &s);
        float* dst = ScorePtr(a.arena, b, s);
        *dst = a.mode == ScoreMode::kAccumulate ? *dst + sc : sc;
        if (a.out_scores != nullptr)
          a.out_scores[static_cast<size_t>(lane) * lanes.max_tokens + t] = sc;
      }
    }
  });
}

void AccumulateScores(ThreadPool& pool, const AccumulateScoresArgs& a) {
  const BlockLayout& l = a.arena.layout;
  pool.ParallelFor(a.lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    for (int64_t lane = l0; lane < l1; ++lane) {
      for (int32_t t = 0; t < a.lanes.num_tokens[lane]; ++t) {
        float sum = 0.0f;
        for (int g = 0; g < a.group_size; ++g) {
          sum += a.weights[(static_cast<size_t>(lane) * a.group_size + g) * a.lanes.max_tokens + t];
        }
        int32_t b, s;
        LaneTokenSlot(a.lanes, l.block_tokens, static_cast<int32_t>(lane), t, &b, &s);
        *ScorePtr(a.arena, b, s) += sum / static_cast<float>(a.group_size);
      }
    }
  });
}

void Select(ThreadPool& pool, const SelectArgs& a) {
  const BlockLayout& l = a.arena.layout;
  pool.ParallelFor(a.lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    std::vector<int32_t> pos, idx;
    std::vector<float> score;
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = a.lanes.num_tokens[lane];
      uint8_t* keep = a.keep + static_cast<size_t>(lane) * a.lanes.max_tokens;
      std::memset(keep, 0, a.lanes.max_tokens);
      const int64_t budget =
          std::max<int64_t>(0, a.budgets != nullptr ? a.budgets[lane] : a.budget);
      if (static_cast<int64_t>(n) <= static_cast<int64_t>(a.sinks) + a.recent + budget) {
        std::memset(keep, 1, n);
        if (a.kept != nullptr) a.kept[lane] = n;
        continue;
      }
      pos.resize(n);
      score.resize(n);
      idx.resize(n);
      for (int32_t t = 0; t < n; ++t) {
        int32_t b, s;
        LaneTokenSlot(a.lanes, l.block_tokens, static_cast<int32_t>(lane), t, &b, &s);
        pos[t] = *PositionPtr(a.arena, b, s);
        const float sc = *ScorePtr(a.arena, b, s);
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
      if (a.kept != nullptr) a.kept[lane] = static_cast<int32_t>(a.sinks + a.recent + budget);
    }
  });
}

void Compact(ThreadPool& pool, const CompactArgs& a) {
  const BlockLayout& l = a.arena.layout;
  pool.ParallelFor(a.lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = a.lanes.num_tokens[lane];
      const uint8_t* keep = a.keep + static_cast<size_t>(lane) * a.lanes.max_tokens;
      int32_t kept = 0;
      for (int32_t t = 0; t < n; ++t) kept += keep[t] != 0;
      int32_t hole = 0, src = kept, moved = 0;
      for (;; ++hole, ++src) {
        while (hole < kept && keep[hole]) ++hole;
        while (src < n && !keep[src]) ++src;
        if (hole >= kept || src >= n) break;
        int32_t db, ds, sb, ss;
        LaneTokenSlot(a.lanes, l.block_tokens, static_cast<int32_t>(lane), hole, &db, &ds);
        LaneTokenSlot(a.lanes, l.block_tokens, static_cast<int32_t>(lane), src, &sb, &ss);
        std::memcpy(KeyRecord(a.arena, db, ds), KeyRecord(a.arena, sb, ss), l.record_bytes);
        std::memcpy(ValueRecord(a.arena, db, ds), ValueRecord(a.arena, sb, ss), l.record_bytes);
        *PositionPtr(a.arena, db, ds) = *PositionPtr(a.arena, sb, ss);
        *ScorePtr(a.arena, db, ds) = *ScorePtr(a.arena, sb, ss);
        ++moved;
      }
      a.new_num_tokens[lane] = kept;
      a.new_num_blocks[lane] = (kept + l.block_tokens - 1) / l.block_tokens;
      if (a.moved != nullptr) a.moved[lane] = moved;
    }
  });
}

}  // namespace kvc::kernels::cpu
