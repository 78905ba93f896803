// Dense causal attention over stored (position, key, value) rows of one kv head, the math
// behind KvCache::Attend for the local cache and the Fetch + local attention path. Uses
// OpenBLAS sgemm for QK^T and PV; softmax rows are spread over the thread pool.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "kvc/kernels/thread_pool.h"
#include "worker/engine/kv_cache.h"

namespace kvc::worker {

// Non-owning view of the tokens one (layer, kv head) holds.
struct HeadKvView {
  const int32_t* positions = nullptr;  // [num_tokens], strictly increasing
  const float* keys = nullptr;         // [num_tokens, head_dim]
  const float* values = nullptr;       // [num_tokens, head_dim]
  int64_t num_tokens = 0;
};

// Attention of every query head of kv head `kv_head`, written into its slice of `out`.
//   queries: [n, num_q_heads, head_dim]; query_positions: [n]; out: [n, num_q_heads, head_dim].
//   lse (optional, may be empty): [n, num_q_heads]; receives each row's log-sum-exp of the
//   scaled scores (-inf when the query sees no token), so partial results combine exactly.
void AttendKvHead(const KvGeometry& geometry, int32_t kv_head, const HeadKvView& kv,
                  absl::Span<const float> queries, absl::Span<const int32_t> query_positions,
                  absl::Span<float> out, kernels::ThreadPool* pool, absl::Span<float> lse = {});

// Slow, obvious version (one query, one head, scalar loops): the oracle for tests.
void AttendReference(const KvGeometry& geometry, int32_t kv_head, const HeadKvView& kv,
                     absl::Span<const float> queries, absl::Span<const int32_t> query_positions,
                     absl::Span<float> out);

// All heads of a layer held as LayerKv (the Fetch path). lse as in AttendKvHead.
void AttendLayer(const KvGeometry& geometry, const LayerKv& layer, absl::Span<const float> queries,
                 absl::Span<const int32_t> query_positions, absl::Span<float> out,
                 kernels::ThreadPool* pool, absl::Span<float> lse = {});

// Combines attention computed over two disjoint key sets (e.g. the tokens a service has
// committed and the chunk still being appended) into attention over their union:
//   out = (e^lse_a * out_a + e^lse_b * out_b) / (e^lse_a + e^lse_b), per (token, q head).
// out_*: [n, num_q_heads, head_dim]; lse_*: [n, num_q_heads]. `out_a`/`lse_a` are overwritten
// with the result.
void MergeAttention(const KvGeometry& geometry, absl::Span<float> out_a, absl::Span<float> lse_a,
                    absl::Span<const float> out_b, absl::Span<const float> lse_b);

}  // namespace kvc::worker
