// The engine's KV cache boundary. The forward pass never touches keys and values directly: it
// appends each layer's new K/V here and asks for attention outputs. Implementations: the local
// in-memory LocalKvCache (tests, evaluation baselines) and ServiceKvCache (worker/service/),
// backed by kvcached through the client library. Depends on Abseil only.
//
// Conventions every implementation follows:
//  - Keys are stored after RoPE (rotate-half / NeoX layout, the Hugging Face layout: the engine
//    undoes GGUF's Q/K row permutation at load), rotated at the position stored with them: the
//    token's original position, unless the cache re-rotated the key (rotating by p' - p moves
//    it to p' exactly; StreamingLLM uses this to keep distances inside the trained context).
//  - Each (layer, kv head) may hold a different set of tokens (SnapKV and H2O select per head);
//    positions within one (layer, kv head) are strictly increasing.
//  - Grouped-query attention: query head q reads kv head q / (num_q_heads / num_kv_heads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvc::worker {

struct KvGeometry {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t num_q_heads = 0;
  int32_t head_dim = 0;
  // RoPE base the keys were rotated with (rotate-half layout); 0 when unknown. A cache needs it
  // only to move keys to new positions (StreamingLLM re-rotation).
  float rope_theta = 0.0f;

  int32_t group_size() const { return num_q_heads / num_kv_heads; }
};

// What one (layer, kv head) holds, densely. Row t of keys/values belongs to positions[t].
struct HeadKv {
  std::vector<int32_t> positions;  // [t], strictly increasing
  std::vector<float> keys;         // [t, head_dim], rotated at positions[t]
  std::vector<float> values;       // [t, head_dim]
};

// All kv heads of one layer.
struct LayerKv {
  std::vector<HeadKv> heads;  // [num_kv_heads]
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  virtual const KvGeometry& geometry() const = 0;

  // Appends n tokens to `layer` (every kv head gets all n).
  //   positions: [n], strictly increasing, each greater than any position appended to `layer`.
  //   keys, values: [n, num_kv_heads, head_dim] row-major f32; keys already rotated.
  // The tokens are visible to Attend/Fetch on `layer` as soon as this returns (the forward pass
  // attends to a chunk's own keys). A backend that publishes a chunk only once every layer has
  // it can still comply: attend over what it has published, attend locally over the pending
  // chunk (AttendKvHead with lse) and combine with MergeAttention (attention.h). InvalidArgument on
  // a bad layer or shape, FailedPrecondition on out-of-order positions; on error nothing is stored.
  virtual absl::Status Append(int32_t layer, absl::Span<const int32_t> positions,
                              absl::Span<const float> keys, absl::Span<const float> values) = 0;

  // Causal attention for n queries of `layer`: query i sees the stored tokens of its kv head
  // whose position <= query_positions[i], with weights softmax(q . k / sqrt(head_dim)).
  //   queries: [n, num_q_heads, head_dim], rotated at query_positions.
  //   query_positions: [n].
  //   out: [n, num_q_heads, head_dim]; a query that sees no token gets zeros.
  virtual absl::Status Attend(int32_t layer, absl::Span<const float> queries,
                              absl::Span<const int32_t> query_positions, absl::Span<float> out) = 0;

  // Dense copy of what `layer` stores now (for Fetch + local attention, and inspection).
  virtual absl::StatusOr<LayerKv> Fetch(int32_t layer) = 0;

  // Every layer now holds all appended tokens with position < end_position: the point at which
  // a token range is complete and an eviction policy may run.
  virtual absl::Status CommitStep(int32_t end_position) = 0;

  // Tokens stored, summed over (layer, kv head); a full cache holds
  // num_layers * num_kv_heads * appended tokens.
  virtual int64_t StoredTokenSlots() const = 0;

  // Short description for logs ("local full", "local sinks=4 window=1020").
  virtual std::string Describe() const = 0;
};

}  // namespace kvc::worker
