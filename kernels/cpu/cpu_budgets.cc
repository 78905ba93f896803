// CPU budget allocation across a group's lanes (AdaKV). Partial sorts instead of the
// reference's full sorts; the result is the same because every order used is total.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"

namespace kvc::kernels::cpu {
namespace {

struct Candidate {
  float score;  // NaN mapped to -inf
  int32_t pos, lane, index;
};

// Select's order within a lane (score desc, position asc, index asc), then lower lane.
bool Better(const Candidate& x, const Candidate& y) {
  if (x.score != y.score) return x.score > y.score;
  if (x.pos != y.pos) return x.pos < y.pos;
  if (x.lane != y.lane) return x.lane < y.lane;
  return x.index < y.index;
}

bool EarlierPosition(const Candidate& x, const Candidate& y) {
  return x.pos != y.pos ? x.pos < y.pos : x.index < y.index;
}

}  // namespace

void AllocateBudgets(ThreadPool& pool, const AllocateBudgetsArgs& a) {
  const int64_t groups = a.num_lanes / a.group_lanes;
  pool.ParallelFor(groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<Candidate> lane_tokens, pooled;
    for (int64_t group = g0; group < g1; ++group) {
      pooled.clear();
      int64_t floors = 0;
      for (int64_t l = group * a.group_lanes; l < (group + 1) * a.group_lanes; ++l) {
        const auto lane = static_cast<int32_t>(l);
        const int32_t n = a.num_tokens[lane];
        const size_t row = static_cast<size_t>(lane) * a.max_tokens;
        lane_tokens.resize(static_cast<size_t>(n));
        for (int32_t t = 0; t < n; ++t) {
          const float s = a.scores[row + t];
          lane_tokens[t] = {std::isnan(s) ? -std::numeric_limits<float>::infinity() : s,
                            a.positions[row + t], lane, t};
        }
        // [0, sinks) lowest positions and [n - recent, n) highest are not candidates.
        const int32_t lo = std::min(a.sinks, n);
        const int32_t hi = std::max(lo, n - a.recent);
        auto first = lane_tokens.begin(), last = lane_tokens.end();
        if (lo > 0 && lo < n) std::nth_element(first, first + lo, last, EarlierPosition);
        if (hi > lo && hi < n) std::nth_element(first + lo, first + hi, last, EarlierPosition);
        const int32_t floor = std::min(a.floor, hi - lo);
        if (floor > 0 && floor < hi - lo) {
          std::nth_element(first + lo, first + lo + floor, first + hi, Better);
        }
        a.budgets[lane] = floor;
        floors += floor;
        pooled.insert(pooled.end(), first + lo + floor, first + hi);
      }
      const int64_t rest =
          std::min<int64_t>(std::max<int64_t>(0, std::max(0, a.totals[group]) - floors),
                            static_cast<int64_t>(pooled.size()));
      if (rest > 0 && rest < static_cast<int64_t>(pooled.size())) {
        std::nth_element(pooled.begin(), pooled.begin() + rest, pooled.end(), Better);
      }
      for (int64_t i = 0; i < rest; ++i) ++a.budgets[pooled[static_cast<size_t>(i)].lane];
    }
  });
}

}  // namespace kvc::kernels::cpu
