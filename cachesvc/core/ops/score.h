// Scoring for SnapKV, H2O's prefill and Expected Attention: each stored token of a layer gets the
// attention the observation queries pay it (softmax over every stored key of its lane, all tiers),
// as new score arrays; nothing is written to the sequence (the Compress that asked commits them
// with the rest of its change).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/sequence/sequence_storage.h"

namespace kvc::cachesvc {

struct ScoreRequest {
  const void* queries = nullptr;  // [num_kv_heads, group, window, head_dim] of query_dtype
  size_t queries_bytes = 0;       // the size of that array
  DType query_dtype = DType::kF16;
  std::vector<int32_t> positions;  // [num_kv_heads, window]
  int32_t window = 0;
  int32_t pool_kernel = 1;
  kernels::PoolKind pooling = kernels::PoolKind::kMax;
  kernels::ScoreMode mode = kernels::ScoreMode::kOverwrite;
};

// Expected Attention: the query model of every query head ([num_query_heads, head_dim] means,
// [num_query_heads, head_dim, head_dim] covariances or none), already rotated to the
// positions still to come.
struct ExpectedScoreRequest {
  std::vector<float> mean;
  std::vector<float> cov;    // empty: no second-order term
  int32_t min_position = 0;  // tokens below (the sinks) stay out of the softmax, score 0
  bool value_norm = true;
};

// Per kv head of `layer`: the new score of every stored token, tiers in order.
absl::StatusOr<std::vector<std::vector<float>>> ScoreLayer(BlockPool* pool,
                                                           const SequenceStorage& storage,
                                                           int layer, const ScoreRequest& request);

absl::StatusOr<std::vector<std::vector<float>>> ScoreLayerExpected(
    BlockPool* pool, const SequenceStorage& storage, int layer,
    const ExpectedScoreRequest& request);

}  // namespace kvc::cachesvc
