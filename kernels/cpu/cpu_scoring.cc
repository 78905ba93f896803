// CPU H2O accumulation, top-k selection and tail-to-hole compaction (SnapKV scoring:
// cpu_snapkv.cc).
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

}  // namespace

// Block by block: a block's scores are contiguous floats, so the group sum (in the
// reference's order) vectorizes across its tokens.
void AccumulateScores(ThreadPool& pool, const AccumulateScoresArgs& a) {
  const BlockLayout& l = a.arena.layout;
  const int bt = l.block_tokens, G = a.group_size;
  pool.ParallelFor(a.lanes.num_lanes, 1, [&](int64_t l0, int64_t l1) {
    std::vector<float> sum(bt);
    for (int64_t lane = l0; lane < l1; ++lane) {
      const int32_t n = a.lanes.num_tokens[lane];
      const int32_t* ids = a.lanes.block_ids + a.lanes.block_offsets[lane];
      const float* w = a.weights + static_cast<size_t>(lane) * G * a.lanes.max_tokens;
      for (int32_t t0 = 0; t0 < n; t0 += bt) {
        const int count = std::min(bt, n - t0);
        float* KVC_RESTRICT s = sum.data();
        for (int i = 0; i < count; ++i) s[i] = 0.0f;
        for (int g = 0; g < G; ++g) {
          const float* KVC_RESTRICT wg = w + static_cast<size_t>(g) * a.lanes.max_tokens + t0;
          for (int i = 0; i < count; ++i) s[i] += wg[i];
        }
        float* KVC_RESTRICT dst = ScorePtr(a.arena, ids[t0 / bt], 0);
        for (int i = 0; i < count; ++i) dst[i] += s[i] / static_cast<float>(G);
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
      const LaneSlots slots(a.lanes, l.block_tokens, static_cast<int32_t>(lane));
      for (int32_t t = 0; t < n; ++t) {
        int32_t b, s;
        slots.Get(t, &b, &s);
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
      const LaneSlots slots(a.lanes, l.block_tokens, static_cast<int32_t>(lane));
      int32_t hole = 0, src = kept, moved = 0;
      for (;; ++hole, ++src) {
        while (hole < kept && keep[hole]) ++hole;
        while (src < n && !keep[src]) ++src;
        if (hole >= kept || src >= n) break;
        int32_t db, ds, sb, ss;
        slots.Get(hole, &db, &ds);
        slots.Get(src, &sb, &ss);
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
