#include "cachesvc/core/ops/selection.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "cachesvc/core/pool/op_stage.h"
#include "common/check.h"

namespace kvc::cachesvc {
namespace {

// Position changes that give a lane's survivors consecutive positions ending at the newest.
std::vector<int32_t> InCacheDeltas(const std::vector<int32_t>& positions,
                                   const std::vector<uint8_t>& keep) {
  std::vector<size_t> kept;
  for (size_t i = 0; i < positions.size(); ++i) {
    if (keep[i]) kept.push_back(i);
  }
  std::sort(kept.begin(), kept.end(),
            [&](size_t a, size_t b) { return positions[a] < positions[b]; });
  std::vector<int32_t> delta(positions.size(), 0);
  if (kept.empty()) return delta;
  const int32_t newest = positions[kept.back()];
  for (size_t r = 0; r < kept.size(); ++r) {
    const int32_t target = newest - static_cast<int32_t>(kept.size() - 1 - r);
    delta[kept[r]] = target - positions[kept[r]];
  }
  return delta;
}

}  // namespace

absl::StatusOr<std::vector<LaneSelection>> SelectLayer(
    kernels::KernelBackend* backend, const SequenceStorage& storage, int layer,
    const EvictionRule& rule, const std::vector<int32_t>& incoming_positions,
    const std::vector<std::vector<float>>* scores) {
  const int heads = storage.num_kv_heads();
  const size_t tiers = storage.tiers().size();
  // Every lane's tokens in one row: tier 0, tier 1, ..., then the incoming rows.
  std::vector<int32_t> counts(static_cast<size_t>(heads));
  int32_t max_tokens = 0;
  for (int h = 0; h < heads; ++h) {
    counts[static_cast<size_t>(h)] = static_cast<int32_t>(
        storage.lane_tokens(layer, h) + static_cast<int64_t>(incoming_positions.size()));
    max_tokens = std::max(max_tokens, counts[static_cast<size_t>(h)]);
  }
  const size_t stride = static_cast<size_t>(max_tokens);
  std::vector<int32_t> positions(static_cast<size_t>(heads) * stride, 0);
  std::vector<float> ranks(positions.size(), 0.0f);
  for (int h = 0; h < heads; ++h) {
    size_t at = static_cast<size_t>(h) * stride;
    const std::vector<Segment>& lane = storage.lane(layer, h);
    for (const Segment& s : lane) {
      std::copy(s.positions.begin(), s.positions.end(), positions.begin() + at);
      std::copy(s.scores.begin(), s.scores.end(), ranks.begin() + at);
      at += static_cast<size_t>(s.size());
    }
    std::copy(incoming_positions.begin(), incoming_positions.end(), positions.begin() + at);
    if (scores != nullptr) {
      const std::vector<float>& mine = (*scores)[static_cast<size_t>(h)];
      KVC_CHECK(mine.size() == static_cast<size_t>(counts[static_cast<size_t>(h)]));
      std::copy(mine.begin(), mine.end(), ranks.begin() + static_cast<size_t>(h) * stride);
    }
  }
  // Candidates per head: what the longest lane could select beyond its sinks and window.
  const int32_t budget =
      LayerBudget(rule, layer, storage.num_layers(),
                  std::max<int64_t>(0, int64_t{max_tokens} - rule.sinks - rule.recent));
  std::vector<int32_t> budgets;
  if (rule.adaptive && max_tokens > 0) {
    budgets.assign(static_cast<size_t>(heads), 0);
    const std::vector<int32_t> total = {static_cast<int32_t>(
        std::min<int64_t>(int64_t{budget} * heads, std::numeric_limits<int32_t>::max()))};
    kernels::AllocateBudgetsArgs b;
    b.num_lanes = heads;
    b.num_tokens = counts.data();
    b.max_tokens = max_tokens;
    b.positions = positions.data();
    b.scores = ranks.data();
    b.sinks = rule.sinks;
    b.recent = rule.recent;
    b.group_lanes = heads;
    b.totals = total.data();
    b.floor = static_cast<int32_t>(int64_t{budget} * rule.floor_percent / 100);
    b.budgets = budgets.data();
    const kernels::KernelStatus ks = backend->AllocateBudgets(b, {});
    if (!ks.ok()) return KernelFailure(ks, "AllocateBudgets");
  }
  std::vector<uint8_t> keep(positions.size(), 0);
  kernels::SelectArgs a;
  a.num_lanes = heads;
  a.num_tokens = counts.data();
  a.max_tokens = max_tokens;
  a.positions = positions.data();
  a.scores = ranks.data();
  a.sinks = rule.sinks;
  a.recent = rule.recent;
  a.budget = budget;
  if (!budgets.empty()) a.budgets = budgets.data();
  a.keep = keep.data();
  if (max_tokens > 0) {
    const kernels::KernelStatus ks = backend->Select(a, {});
    if (!ks.ok()) return KernelFailure(ks, "Select");
  }

  std::vector<LaneSelection> out(static_cast<size_t>(heads));
  for (int h = 0; h < heads; ++h) {
    LaneSelection& sel = out[static_cast<size_t>(h)];
    const size_t row = static_cast<size_t>(h) * stride;
    const size_t n = static_cast<size_t>(counts[static_cast<size_t>(h)]);
    const std::vector<uint8_t> lane_keep(keep.begin() + row, keep.begin() + row + n);
    const std::vector<int32_t> lane_pos(positions.begin() + row, positions.begin() + row + n);
    std::vector<int32_t> delta;
    if (rule.rerotate) delta = InCacheDeltas(lane_pos, lane_keep);
    size_t at = 0;
    for (size_t t = 0; t < tiers; ++t) {
      const size_t size = storage.lane(layer, h)[t].positions.size();
      sel.keep.emplace_back(lane_keep.begin() + at, lane_keep.begin() + at + size);
      if (rule.rerotate) sel.delta.emplace_back(delta.begin() + at, delta.begin() + at + size);
      at += size;
    }
    sel.incoming_keep.assign(lane_keep.begin() + at, lane_keep.end());
    if (rule.rerotate) sel.incoming_delta.assign(delta.begin() + at, delta.end());
    sel.evicted = static_cast<int64_t>(n) - std::accumulate(lane_keep.begin(), lane_keep.end(), 0);
  }
  return out;
}

}  // namespace kvc::cachesvc
