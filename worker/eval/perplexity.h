// Perplexity of a long token sequence under a given KvCache (full cache or an eviction policy):
// the text is fed in chunks, every token after the first is scored from the previous logits.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/engine/kv_cache.h"
#include "worker/engine/llama_model.h"

namespace kvc::worker {

struct PerplexityOptions {
  int32_t chunk = 128;     // tokens per Forward; evictions happen between chunks
  int32_t segment = 1024;  // granularity of the per-segment curve
  std::function<void(int64_t scored, double running_ppl)> progress;  // per chunk, may be empty
};

struct PerplexityResult {
  int64_t tokens_scored = 0;
  double nll_sum = 0;  // natural log
  double perplexity = 0;
  double seconds = 0;
  int64_t max_stored_slots = 0;            // peak KvCache::StoredTokenSlots() after a commit
  std::vector<double> segment_perplexity;  // one per `segment` scored tokens
};

// InvalidArgument for fewer than two tokens; model/cache errors pass through.
absl::StatusOr<PerplexityResult> EvaluatePerplexity(LlamaModel& model, KvCache& kv,
                                                    absl::Span<const int32_t> tokens,
                                                    const PerplexityOptions& options);

}  // namespace kvc::worker
