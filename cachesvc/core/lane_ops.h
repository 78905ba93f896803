// Lane operations shared by the append, compression and residual paths: write rows into a
// lane's slots, read rows back as f32, and compact lanes by a keep mask. A lane is the
// block list of one (layer, kv head) in one BlockTable, in one storage format. Callers hold
// the owning sequence's lock.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/block_pool.h"
#include "cachesvc/core/block_table.h"

namespace kvc::cachesvc {

// Rows of one lane read back as f32 ([n, head_dim] keys and values), with their positions
// and scores.
struct LaneRows {
  std::vector<float> keys, values, scores;
  std::vector<int32_t> positions;
  int64_t size() const { return static_cast<int64_t>(positions.size()); }
};

// Writes `n` rows into stored indices [first, first + n) of lane (layer, kv_head), which the
// caller has already grown (blocks pushed, tokens counted). keys/values are [n, row_stride]
// of `dtype`. With `scores`, each row's score is set (WriteTokens resets it to 0), so H2O
// rankings survive a move between formats.
absl::Status WriteLaneRows(BlockPool* pool, StorageFormat format, const BlockTable& table,
                           int layer, int kv_head, int64_t first, int64_t n, DType dtype,
                           const void* keys, const void* values, int64_t row_stride,
                           const int32_t* positions, const float* scores);

// Appends `rows` (f32) at the end of the lane: pushes `fresh` blocks (from the front of
// *fresh, consumed) as needed, then writes keys, values, positions and scores.
absl::Status AppendLaneRows(BlockPool* pool, StorageFormat format, BlockTable& table, int layer,
                            int kv_head, const LaneRows& rows, std::vector<BlockId>* fresh);

// Reads stored indices `indices` of lane (layer, kv_head) as f32.
absl::StatusOr<LaneRows> ReadLaneRows(BlockPool* pool, StorageFormat format,
                                      const BlockTable& table, int layer, int kv_head,
                                      const std::vector<int64_t>& indices);

// Positions of every stored token of a lane, by stored index (host arena).
std::vector<int32_t> LanePositions(BlockPool* pool, StorageFormat format, const BlockTable& table,
                                   int layer, int kv_head);

// Compacts every lane of `layer` by `keep` ([num_kv_heads, stride], 1 = keep, by stored
// index; tail-to-hole), shrinks the lanes and returns emptied blocks to the pool. Returns the
// token-heads removed.
absl::StatusOr<int64_t> CompactLayer(BlockPool* pool, StorageFormat format, BlockTable& table,
                                     int layer, const std::vector<uint8_t>& keep, size_t stride);

}  // namespace kvc::cachesvc
