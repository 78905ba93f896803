// TierLanes: the kernel view (LaneTable) of one tier of every lane of a layer, with the
// lanes' positions and scores packed as the kernels take them ([num_lanes, max_tokens]).
// Valid while the storage is unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "cachesvc/core/sequence/sequence_storage.h"
#include "kvc/kernels/paged_view.h"

namespace kvc::cachesvc {

struct TierLanes {
  std::vector<int32_t> block_offsets;  // [num_lanes + 1]
  std::vector<int32_t> block_ids;
  std::vector<int32_t> num_tokens;  // [num_lanes]
  int32_t max_tokens = 0;
  std::vector<int32_t> positions;  // [num_lanes, max_tokens]
  std::vector<float> scores;       // [num_lanes, max_tokens]

  int32_t num_lanes() const { return static_cast<int32_t>(num_tokens.size()); }
  kernels::LaneTable view() const;
  // Scores of lane `lane` back in stored order (drops the padding).
  std::vector<float> LaneScores(int lane) const;
};

// `with_positions`: also pack positions (decode attention needs only the scores).
TierLanes BuildTierLanes(const SequenceStorage& storage, int layer, int tier,
                         bool with_positions = true);

}  // namespace kvc::cachesvc
