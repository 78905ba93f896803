// Which tokens of a layer's lanes survive an eviction rule, decided from metadata alone
// (positions and scores; the Select op reads no KV memory), over every tier of each lane
// plus the rows an append is about to add. With the rule's re-rotation, also the position
// change of each survivor: consecutive in-cache positions ending at the newest one (exact
// for RoPE keys), so every distance the model sees stays inside the cache span.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/plan/eviction_rule.h"
#include "cachesvc/core/sequence/sequence_storage.h"
#include "kvc/kernels/backend.h"

namespace kvc::cachesvc {

struct LaneSelection {
  std::vector<std::vector<uint8_t>> keep;   // [tier][stored index]
  std::vector<uint8_t> incoming_keep;       // [incoming row]
  std::vector<std::vector<int32_t>> delta;  // [tier][stored index]; empty without re-rotation
  std::vector<int32_t> incoming_delta;      // [incoming row]; empty without re-rotation
  int64_t evicted = 0;                      // token-heads dropped
};

// One selection per kv head of `layer`. `scores` (optional): per lane, the scores to rank
// by, tiers in order then incoming rows; by default the stored scores (0 for incoming).
absl::StatusOr<std::vector<LaneSelection>> SelectLayer(
    kernels::KernelBackend* backend, const SequenceStorage& storage, int layer,
    const EvictionRule& rule, const std::vector<int32_t>& incoming_positions,
    const std::vector<std::vector<float>>* scores = nullptr);

}  // namespace kvc::cachesvc
