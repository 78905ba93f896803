// Expected Attention's query model (kvpress ExpectedAttentionPress; compression.md §1.10).
// Engines send the mean and covariance of a layer's context queries before RoPE. The queries
// still to come sit at positions [first, first + count), each rotated by its own R(p); the
// service scores keys with the rotation averaged over those positions, R = mean_p R(p):
// mean' = R mean and cov' = R cov R^T (as kvpress; the exact second moment would average
// R(p) cov R(p)^T, which R cov R^T underestimates for fast-turning pairs, whose mean
// rotation shrinks towards 0).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "cachesvc/core/base/types.h"

namespace kvc::cachesvc {

struct QueryModel {
  std::vector<float> mean;  // [heads, head_dim]
  std::vector<float> cov;   // [heads, head_dim, head_dim]; empty when none was given
};

// `mean` is [heads, head_dim]; `cov` is [heads, head_dim, head_dim] or empty. Dimensions
// past the rotary ones are left as they are. count >= 1.
QueryModel AverageRope(const RopeParams& rope, int head_dim, int heads, int64_t first, int count,
                       absl::Span<const float> mean, absl::Span<const float> cov);

}  // namespace kvc::cachesvc
