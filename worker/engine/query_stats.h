// Statistics of a context's queries for query-agnostic eviction (Expected Attention, kvpress
// ExpectedAttentionPress; kvcached's ExpectedAttentionSpec): per (layer, query head) the mean
// and the population covariance (divided by n, kvpress's einsum(centered, centered) / n) of
// the queries BEFORE RoPE, without the first kExpectedAttentionSinks positions.
//
// The engine hands its caches queries after RoPE (rotate-half / NeoX pairs (i, i + head_dim/2),
// frequencies theta^(-2i/head_dim) over the whole head, kernels::RopeSinCos; kv_cache.h), so
// each query is first rotated back by its own position: the transpose of ApplyRope's rotation
// with the same angles. Streaming: sums (shifted by the layer's first query, for accuracy) are
// kept in double; no query is stored. Depends on Abseil and kernels/ only.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/engine/kv_cache.h"

namespace kvc::worker {

// Expected Attention's sink tokens (kvpress n_sink; kvcached's default): always kept, and left
// out of the query statistics.
inline constexpr int32_t kExpectedAttentionSinks = 4;

// One layer's statistics.
struct QueryStats {
  int64_t count = 0;              // queries summarized
  std::vector<float> mean;        // [num_q_heads, head_dim]
  std::vector<float> covariance;  // [num_q_heads, head_dim, head_dim]; empty = mean only
};

class QueryStatsAccumulator {
 public:
  // `geometry.rope_theta` must be the base the queries were rotated with (> 0).
  explicit QueryStatsAccumulator(const KvGeometry& geometry, bool covariance = true);

  // Adds the queries of `layer` whose position lies in [begin, end).
  //   queries: [n, num_q_heads, head_dim], rotated at `positions` ([n]).
  // InvalidArgument on a bad layer or shape, FailedPrecondition without rope_theta.
  absl::Status Add(int32_t layer, absl::Span<const float> queries,
                   absl::Span<const int32_t> positions, int32_t begin, int32_t end);

  // Queries added to `layer` so far.
  int64_t count(int32_t layer) const;

  // Every layer's mean and covariance ([num_layers]); zeros for a layer without queries.
  std::vector<QueryStats> Finish() const;

  const KvGeometry& geometry() const { return geometry_; }

 private:
  struct Layer {
    int64_t n = 0;
    std::vector<double> shift;  // [q_heads, d]: the layer's first query (un-rotated)
    std::vector<double> sum;    // [q_heads, d]: sum of (x - shift)
    std::vector<double> outer;  // [q_heads, d, d], upper triangle: sum of (x - shift)(x - shift)^T
  };

  KvGeometry geometry_;
  bool covariance_;
  std::vector<Layer> layers_;
};

}  // namespace kvc::worker
