// Segment: the stored tokens of one lane (one layer x kv head of a sequence) in one storage
// format: the blocks that hold their records and, by stored index, each token's original
// position and accumulated attention score. Positions, scores and block ids are host-side
// metadata; the pool's memory holds only the records (kvc/kernels/block_layout.h), reached
// through kernel ops. Stored token i lives in blocks[i / block_tokens], slot
// i % block_tokens; blocks.size() == ceil(size() / block_tokens).
//
// A lane is an ordered list of segments, one per tier of its sequence (oldest tier first).
// Without a raw residual a sequence has one tier; with one, the newest tier holds the newest
// `limit` tokens in the pool's raw format and the older tier everything else.
#pragma once

#include <cstdint>
#include <vector>

#include "cachesvc/core/base/types.h"

namespace kvc::cachesvc {

struct Segment {
  StorageFormat format = StorageFormat::kF16;
  std::vector<BlockId> blocks;
  std::vector<int32_t> positions;  // [size()]
  std::vector<float> scores;       // [size()]

  int64_t size() const { return static_cast<int64_t>(positions.size()); }
  BlockId block_of(int64_t index, int block_tokens) const {
    return blocks[static_cast<size_t>(index / block_tokens)];
  }
  static int32_t slot_of(int64_t index, int block_tokens) {
    return static_cast<int32_t>(index % block_tokens);
  }
};

// One tier of a sequence: the format of its segments and how many tokens it may hold
// (kUnlimited for the oldest tier).
struct Tier {
  static constexpr int64_t kUnlimited = -1;
  StorageFormat format = StorageFormat::kF16;
  int64_t limit = kUnlimited;
};

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace kvc::cachesvc
