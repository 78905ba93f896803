#include "worker/eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/status/status.h"
#include "worker/engine/ops.h"

namespace kvc::worker {

absl::StatusOr<PerplexityResult> EvaluatePerplexity(LlamaModel& model, KvCache& kv,
                                                    absl::Span<const int32_t> tokens,
                                                    const PerplexityOptions& options) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) return absl::InvalidArgumentError("perplexity needs at least two tokens");
  const int64_t chunk = std::max<int32_t>(options.chunk, 1);
  const int64_t vocab = model.config().vocab_size;
  PerplexityResult r;
  double segment_nll = 0;
  int64_t segment_count = 0;
  const auto t0 = std::chrono::steady_clock::now();
  // The last token is only ever a target, so inputs are tokens[0 .. n-2].
  for (int64_t start = 0; start < n - 1; start += chunk) {
    const int64_t len = std::min(chunk, n - 1 - start);
    auto logits =
        model.Forward(tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(len)),
                      static_cast<int32_t>(start), kv, LogitsMode::kAll);
    if (!logits.ok()) return logits.status();
    for (int64_t i = 0; i < len; ++i) {
      const double nll = -LogProb(logits->data() + i * vocab, vocab, tokens[start + i + 1]);
      r.nll_sum += nll;
      segment_nll += nll;
      ++r.tokens_scored;
      if (++segment_count == options.segment) {
        r.segment_perplexity.push_back(std::exp(segment_nll / static_cast<double>(segment_count)));
        segment_nll = 0;
        segment_count = 0;
      }
    }
    r.max_stored_slots = std::max(r.max_stored_slots, kv.StoredTokenSlots());
    if (options.progress) {
      options.progress(r.tokens_scored, std::exp(r.nll_sum / static_cast<double>(r.tokens_scored)));
    }
  }
  if (segment_count > 0) {
    r.segment_perplexity.push_back(std::exp(segment_nll / static_cast<double>(segment_count)));
  }
  r.perplexity = std::exp(r.nll_sum / static_cast<double>(r.tokens_scored));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvc::worker
