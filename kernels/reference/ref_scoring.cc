// Reference SnapKV and Expected Attention scoring, H2O accumulation and top-k selection.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kvc/kernels/record_codec.h"
#include "reference/reference_ops.h"

namespace kvc::kernels::reference {
namespace {

// All stored keys of a lane, dequantized: [n, head_dim].
std::vector<float> LaneKeys(const PagedArena& arena, const LaneTable& lanes, int32_t lane) {
  const BlockLayout& l = arena.layout;
  const int32_t n = lanes.num_tokens[lane];
  std::vector<float> k(static_cast<size_t>(n) * l.head_dim);
  for (int32_t t = 0; t < n; ++t) {
    int32_t b, s;
    LaneTokenSlot(lanes, l.block_tokens, lane, t, &b, &s);
    DequantizeRecord(l.format, l.head_dim, KeyRecord(arena, b, s),
                     &k[static_cast<size_t>(t) * l.head_dim]);
  }
  return k;
}

float ScoreForRanking(float s) {
  return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
}

}  // namespace

void SnapKvScore(const SnapKvScoreArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const float scale = AttentionScale(d);
  for (int32_t lane = 0; lane < a.lanes.num_lanes; ++lane) {
    const int32_t n = a.lanes.num_tokens[lane];
    const std::vector<float> keys = LaneKeys(a.arena, a.lanes, lane);
    const int32_t* pos = a.key_positions + static_cast<size_t>(lane) * a.lanes.max_tokens;
    std::vector<float> score(n, 0.0f), vote(n), logits(n);
    const int32_t pooled_len = std::max(0, n - a.window);
    for (int g = 0; g < a.group_size; ++g) {
      std::fill(vote.begin(), vote.end(), 0.0f);
      for (int w = 0; w < a.window; ++w) {
        const size_t q_row = (static_cast<size_t>(lane) * a.group_size + g) * a.window + w;
        const int32_t q_pos = a.query_positions[static_cast<size_t>(lane) * a.window + w];
        float m = -std::numeric_limits<float>::infinity();
        for (int32_t t = 0; t < n; ++t) {
          if (pos[t] > q_pos) {
            logits[t] = -std::numeric_limits<float>::infinity();
            continue;
          }
          float dot = 0.0f;
          for (int j = 0; j < d; ++j) {
            dot += LoadElement(a.queries, a.query_dtype, q_row * d + j) *
                   keys[static_cast<size_t>(t) * d + j];
          }
          logits[t] = dot * scale;
          m = std::max(m, logits[t]);
        }
        if (m == -std::numeric_limits<float>::infinity()) continue;  // every key masked
        float sum = 0.0f;
        for (int32_t t = 0; t < n; ++t) sum += std::exp(logits[t] - m);
        for (int32_t t = 0; t < n; ++t) vote[t] += std::exp(logits[t] - m) / sum;
      }
      const int half = a.pool_kernel / 2;
      for (int32_t t = 0; t < n; ++t) {
        float v = vote[t];
        if (t < pooled_len && a.pool_kernel > 1) {
          const int32_t lo = std::max(0, t - half), hi = std::min(pooled_len - 1, t + half);
          if (a.pool == PoolKind::kMax) {
            v = vote[lo];
            for (int32_t u = lo; u <= hi; ++u) v = std::max(v, vote[u]);
          } else {
            v = 0.0f;
            for (int32_t u = lo; u <= hi; ++u) v += vote[u];
            v /= static_cast<float>(a.pool_kernel);  // zero padding counts, as avg_pool1d
          }
        }
        score[t] += v / static_cast<float>(a.group_size);
      }
    }
    float* dst = a.scores + static_cast<size_t>(lane) * a.lanes.max_tokens;
    for (int32_t t = 0; t < n; ++t)
      dst[t] = a.mode == ScoreMode::kAccumulate ? dst[t] + score[t] : score[t];
  }
}

void ExpectedAttentionScore(const ExpectedAttentionScoreArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const float scale = AttentionScale(d);
  const float quad_scale = 0.5f / static_cast<float>(d);  // 1 / (2 head_dim)
  const size_t dd = static_cast<size_t>(d) * d;
  std::vector<float> v(d), ck(d);
  for (int32_t lane = 0; lane < a.lanes.num_lanes; ++lane) {
    const int32_t n = a.lanes.num_tokens[lane];
    const std::vector<float> keys = LaneKeys(a.arena, a.lanes, lane);
    const int32_t* pos = a.key_positions + static_cast<size_t>(lane) * a.lanes.max_tokens;
    std::vector<float> score(n, 0.0f), logits(n);
    for (int g = 0; g < a.group_size; ++g) {
      const size_t head = static_cast<size_t>(lane) * a.group_size + g;
      const float* mean = a.mean + head * d;
      const float* cov = a.cov != nullptr ? a.cov + head * dd : nullptr;
      float m = -std::numeric_limits<float>::infinity();
      for (int32_t t = 0; t < n; ++t) {
        if (pos[t] < a.min_position) continue;  // a sink: outside the softmax
        const float* k = &keys[static_cast<size_t>(t) * d];
        float dot = 0.0f;
        for (int j = 0; j < d; ++j) dot += k[j] * mean[j];
        float quad = 0.0f;
        if (cov != nullptr) {
          for (int i = 0; i < d; ++i) {  // ck = cov k, then k . ck
            float row = 0.0f;
            for (int j = 0; j < d; ++j) row += cov[static_cast<size_t>(i) * d + j] * k[j];
            ck[i] = row;
          }
          for (int i = 0; i < d; ++i) quad += k[i] * ck[i];
        }
        logits[t] = dot * scale + quad * quad_scale;
        m = std::max(m, logits[t]);
      }
      if (m == -std::numeric_limits<float>::infinity()) continue;  // no token in the softmax
      float sum = 0.0f;
      for (int32_t t = 0; t < n; ++t) {
        if (pos[t] >= a.min_position) sum += std::exp(logits[t] - m);
      }
      for (int32_t t = 0; t < n; ++t) {
        if (pos[t] >= a.min_position)
          score[t] += std::exp(logits[t] - m) / sum / static_cast<float>(a.group_size);
      }
    }
    float* dst = a.scores + static_cast<size_t>(lane) * a.lanes.max_tokens;
    for (int32_t t = 0; t < n; ++t) {
      float sc = score[t];
      if (a.value_norm && pos[t] >= a.min_position) {
        int32_t b, s;
        LaneTokenSlot(a.lanes, l.block_tokens, lane, t, &b, &s);
        DequantizeRecord(l.format, d, ValueRecord(a.arena, b, s), v.data());
        float sq = 0.0f;
        for (int j = 0; j < d; ++j) sq += v[j] * v[j];
        sc *= std::sqrt(sq);
      }
      dst[t] = sc;
    }
  }
}

void AccumulateScores(const AccumulateScoresArgs& a) {
  for (int32_t lane = 0; lane < a.num_lanes; ++lane) {
    float* scores = a.scores + static_cast<size_t>(lane) * a.max_tokens;
    for (int32_t t = 0; t < a.num_tokens[lane]; ++t) {
      float sum = 0.0f;
      for (int g = 0; g < a.group_size; ++g)
        sum += a.weights[(static_cast<size_t>(lane) * a.group_size + g) * a.max_tokens + t];
      scores[t] += sum / static_cast<float>(a.group_size);
    }
  }
}

void Select(const SelectArgs& a) {
  for (int32_t lane = 0; lane < a.num_lanes; ++lane) {
    const int32_t n = a.num_tokens[lane];
    const size_t row = static_cast<size_t>(lane) * a.max_tokens;
    uint8_t* keep = a.keep + row;
    std::fill(keep, keep + a.max_tokens, 0);
    const int32_t budget = a.budgets != nullptr ? std::max(0, a.budgets[lane]) : a.budget;
    if (static_cast<int64_t>(n) <= static_cast<int64_t>(a.sinks) + a.recent + budget) {
      std::fill(keep, keep + n, 1);
      continue;
    }
    const int32_t* pos = a.positions + row;
    std::vector<float> score(n);
    for (int32_t t = 0; t < n; ++t) score[t] = ScoreForRanking(a.scores[row + t]);
    std::vector<int32_t> by_pos(n);
    for (int32_t t = 0; t < n; ++t) by_pos[t] = t;
    std::sort(by_pos.begin(), by_pos.end(),
              [&](int32_t x, int32_t y) { return pos[x] != pos[y] ? pos[x] < pos[y] : x < y; });
    for (int32_t i = 0; i < a.sinks; ++i) keep[by_pos[i]] = 1;
    for (int32_t i = n - a.recent; i < n; ++i) keep[by_pos[i]] = 1;
    std::vector<int32_t> rest;
    for (int32_t i = a.sinks; i < n - a.recent; ++i) rest.push_back(by_pos[i]);
    std::sort(rest.begin(), rest.end(), [&](int32_t x, int32_t y) {
      if (score[x] != score[y]) return score[x] > score[y];
      return pos[x] != pos[y] ? pos[x] < pos[y] : x < y;
    });
    for (int32_t i = 0; i < budget; ++i) keep[rest[i]] = 1;
  }
}

void AllocateBudgets(const AllocateBudgetsArgs& a) {
  struct Candidate {
    float score;
    int32_t pos, lane, index;
  };
  // Select's order within a lane, then lower lane.
  auto better = [](const Candidate& x, const Candidate& y) {
    if (x.score != y.score) return x.score > y.score;
    if (x.pos != y.pos) return x.pos < y.pos;
    if (x.lane != y.lane) return x.lane < y.lane;
    return x.index < y.index;
  };
  for (int32_t group = 0; group < a.num_lanes / a.group_lanes; ++group) {
    std::vector<Candidate> pooled;  // candidates left after every lane took its floor
    int64_t floors = 0;
    for (int32_t lane = group * a.group_lanes; lane < (group + 1) * a.group_lanes; ++lane) {
      const int32_t n = a.num_tokens[lane];
      const size_t row = static_cast<size_t>(lane) * a.max_tokens;
      const int32_t* pos = a.positions + row;
      std::vector<Candidate> all;
      all.reserve(static_cast<size_t>(n));
      for (int32_t t = 0; t < n; ++t)
        all.push_back({ScoreForRanking(a.scores[row + t]), pos[t], lane, t});
      // Sinks and recent tokens, by position as Select takes them, are not candidates.
      std::sort(all.begin(), all.end(), [](const Candidate& x, const Candidate& y) {
        return x.pos != y.pos ? x.pos < y.pos : x.index < y.index;
      });
      std::vector<Candidate> mine;
      for (int32_t i = a.sinks; i < n - a.recent; ++i) mine.push_back(all[i]);
      std::sort(mine.begin(), mine.end(), better);
      const int32_t floor = std::min<int32_t>(a.floor, static_cast<int32_t>(mine.size()));
      a.budgets[lane] = floor;
      floors += floor;
      pooled.insert(pooled.end(), mine.begin() + floor, mine.end());
    }
    std::sort(pooled.begin(), pooled.end(), better);
    const int64_t rest = std::max<int64_t>(0, std::max(0, a.totals[group]) - floors);
    for (int64_t i = 0; i < std::min<int64_t>(rest, static_cast<int64_t>(pooled.size())); ++i) {
      ++a.budgets[pooled[i].lane];
    }
  }
}

}  // namespace kvc::kernels::reference
