// Dense causal attention over stored (position, key, value) rows of one kv head, the math
// behind KvStore::Attend for the local store and the Fetch + local attention path. Uses
// OpenBLAS sgemm for QK^T and PV; softmax rows are spread over the thread pool.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "worker/engine/kv_store.h"
#include "worker/engine/thread_pool.h"

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
void AttendKvHead(const KvGeometry& geometry, int32_t kv_head, const HeadKvView& kv,
                  absl::Span<const float> queries, absl::Span<const int32_t> query_positions,
                  absl::Span<float> out, ThreadPool* pool);

// Slow, obvious version (one query, one head, scalar loops): the oracle for tests.
void AttendReference(const KvGeometry& geometry, int32_t kv_head, const HeadKvView& kv,
                     absl::Span<const float> queries, absl::Span<const int32_t> query_positions,
                     absl::Span<float> out);

// All heads of a layer held as LayerKv (the Fetch path).
void AttendLayer(const KvGeometry& geometry, const LayerKv& layer, absl::Span<const float> queries,
                 absl::Span<const int32_t> query_positions, absl::Span<float> out,
                 ThreadPool* pool);

}  // namespace kvc::worker
