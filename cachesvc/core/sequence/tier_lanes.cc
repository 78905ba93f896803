#include "cachesvc/core/sequence/tier_lanes.h"

#include <algorithm>

namespace kvc::cachesvc {

kernels::LaneTable TierLanes::view() const {
  kernels::LaneTable t;
  t.num_lanes = num_lanes();
  t.block_offsets = block_offsets.data();
  t.block_ids = block_ids.data();
  t.num_tokens = num_tokens.data();
  t.max_tokens = max_tokens;
  return t;
}

std::vector<float> TierLanes::LaneScores(int lane) const {
  const auto begin = scores.begin() + static_cast<std::ptrdiff_t>(lane) * max_tokens;
  return std::vector<float>(begin, begin + num_tokens[static_cast<size_t>(lane)]);
}

TierLanes BuildTierLanes(const SequenceStorage& storage, int layer, int tier, bool with_positions) {
  TierLanes t;
  const int heads = storage.num_kv_heads();
  t.block_offsets.push_back(0);
  for (int h = 0; h < heads; ++h) {
    const Segment& s = storage.lane(layer, h)[static_cast<size_t>(tier)];
    t.block_ids.insert(t.block_ids.end(), s.blocks.begin(), s.blocks.end());
    t.block_offsets.push_back(static_cast<int32_t>(t.block_ids.size()));
    t.num_tokens.push_back(static_cast<int32_t>(s.size()));
    t.max_tokens = std::max(t.max_tokens, static_cast<int32_t>(s.size()));
  }
  const size_t stride = static_cast<size_t>(t.max_tokens);
  if (with_positions) t.positions.assign(static_cast<size_t>(heads) * stride, 0);
  t.scores.assign(static_cast<size_t>(heads) * stride, 0.0f);
  for (int h = 0; h < heads; ++h) {
    const Segment& s = storage.lane(layer, h)[static_cast<size_t>(tier)];
    if (with_positions) {
      std::copy(s.positions.begin(), s.positions.end(), t.positions.begin() + h * stride);
    }
    std::copy(s.scores.begin(), s.scores.end(), t.scores.begin() + h * stride);
  }
  return t;
}

}  // namespace kvc::cachesvc
