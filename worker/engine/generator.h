// Prompt prefill (in chunks) and the token-by-token decode loop over a KvCache, with timings.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/engine/kv_cache.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/sampler.h"

namespace kvc::worker {

struct GenerateOptions {
  int32_t max_new_tokens = 128;
  int32_t prefill_chunk = 256;  // tokens per prefill Forward (bounds the score matrix)
  SamplingOptions sampling;
  AttentionPath path = AttentionPath::kStoreAttend;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these (not included)
  std::function<void(int32_t token)> on_token;  // streaming callback, may be empty
  // The first `cached_prompt_tokens` prompt tokens are in the cache already (attached from
  // kvcached's prefix cache): prefill starts after them. At most prompt size - 1: the last
  // prompt token is always run, for its logits.
  int64_t cached_prompt_tokens = 0;
  // > 0: a prefill chunk ends at this prompt position (a document's end, where a cache may
  // compress the document before the question after it is prefilled; ServiceKvCache's
  // ExpectDocument).
  int64_t prefill_split = 0;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, stop token excluded
  std::string text;
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;  // forward passes in the decode loop
};

// Prefills `prompt` at positions 0.. into `kv` (empty, or holding the first
// options.cached_prompt_tokens: CommitStep(cached_prompt_tokens) first tells the cache they are
// complete), then decodes. InvalidArgument for an empty prompt; model and cache errors pass
// through.
absl::StatusOr<GenerateResult> Generate(LlamaModel& model, KvCache& kv,
                                        absl::Span<const int32_t> prompt,
                                        const GenerateOptions& options);

}  // namespace kvc::worker
