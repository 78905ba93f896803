// SequenceStorage: what one sequence stores. Per lane (layer x kv head) one Segment per tier
// (segment.h), the tier list, running totals (stored token-heads, blocks per format) and the
// generations. Plain metadata: it never touches pool memory. Mutations go through a
// Transaction (transaction.h), whose commit is the only caller of Replace/Extend; anything that
// moves, rewrites or drops a stored token bumps the generation there, so a reader holding
// stored indices from an older generation knows they are stale. Not thread-safe: the owning
// Sequence's lock guards it.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "cachesvc/core/base/segment.h"
#include "cachesvc/core/base/types.h"

namespace kvc::cachesvc {

class SequenceStorage {
 public:
  // `raw` is the pool's raw format: what the engine's values are, exactly.
  SequenceStorage(int num_layers, int num_kv_heads, StorageFormat raw, std::vector<Tier> tiers);

  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int lane_index(int layer, int kv_head) const { return layer * num_kv_heads_ + kv_head; }
  const std::vector<Tier>& tiers() const { return tiers_; }
  // The oldest tier's format: what a Compress converts and GetSequence reports.
  StorageFormat format() const { return tiers_.front().format; }
  // Limit of the raw residual tier (0 = none).
  int64_t residual_limit() const { return tiers_.size() > 1 ? tiers_.back().limit : 0; }
  // True once some tier held its tokens in a lossy format: from then on no stored token may
  // be passed off as raw (a residual can no longer be set).
  bool ever_lossy() const { return ever_lossy_; }

  const std::vector<Segment>& lane(int index) const { return lanes_[static_cast<size_t>(index)]; }
  const std::vector<Segment>& lane(int layer, int kv_head) const {
    return lane(lane_index(layer, kv_head));
  }
  // Stored tokens of a lane, every tier.
  int64_t lane_tokens(int layer, int kv_head) const;
  int64_t stored_token_heads() const { return stored_token_heads_; }
  int64_t blocks(StorageFormat format) const {
    return blocks_by_format_[static_cast<size_t>(format)];
  }
  // Per layer: bumped whenever a stored token of the layer moved, was rewritten or went
  // away (an append does not), so readers of other layers are not disturbed.
  uint64_t generation(int layer) const { return generations_[static_cast<size_t>(layer)]; }

  // Transaction::Commit only.
  void Replace(int lane, int tier, Segment segment);
  // Appends tokens after a segment's own (which stay as they are).
  void Extend(int lane, int tier, const std::vector<BlockId>& blocks,
              const std::vector<int32_t>& positions, const std::vector<float>& scores);
  // A new tier list; lanes gain empty segments for new tiers (Replace fills them).
  void SetTiers(std::vector<Tier> tiers);
  void BumpGeneration(int layer) { ++generations_[static_cast<size_t>(layer)]; }
  void BumpAllGenerations() {
    for (uint64_t& g : generations_) ++g;
  }
  // New scores for one tier of a lane (Attend's H2O accumulation): metadata only, no token
  // moves, so no new generation.
  void SetScores(int lane, int tier, std::vector<float> scores);

  // Empties every lane and returns its blocks by format (Release).
  std::vector<std::pair<StorageFormat, std::vector<BlockId>>> TakeAllBlocks();

 private:
  void Count(const Segment& segment, int64_t sign);

  void NoteLossy();

  int num_layers_;
  int num_kv_heads_;
  StorageFormat raw_;
  bool ever_lossy_ = false;
  std::vector<Tier> tiers_;
  std::vector<std::vector<Segment>> lanes_;  // [layer * num_kv_heads + kv head][tier]
  int64_t stored_token_heads_ = 0;
  std::array<int64_t, kernels::kNumStorageFormats> blocks_by_format_{};
  std::vector<uint64_t> generations_;  // [layer]
};

}  // namespace kvc::cachesvc
