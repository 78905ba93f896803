#include "worker/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"

namespace kvc::worker {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

absl::StatusOr<GenerateResult> Generate(LlamaModel& model, KvCache& kv,
                                        absl::Span<const int32_t> prompt,
                                        const GenerateOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t chunk = std::max<int32_t>(options.prefill_chunk, 1);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  if (options.cached_prompt_tokens < 0 || options.cached_prompt_tokens >= result.prompt_tokens) {
    return absl::InvalidArgumentError(
        "cached_prompt_tokens must leave at least the last prompt token to run");
  }
  if (options.cached_prompt_tokens > 0) {
    // The attached tokens are complete in every layer: a policy due there runs now.
    if (auto s = kv.CommitStep(static_cast<int32_t>(options.cached_prompt_tokens)); !s.ok()) {
      return s;
    }
  }
  const int64_t split = options.prefill_split;
  for (int64_t start = options.cached_prompt_tokens, len = 0; start < result.prompt_tokens;
       start += len) {
    len = std::min(chunk, result.prompt_tokens - start);
    if (start < split && split < start + len) len = split - start;
    const bool last = start + len == result.prompt_tokens;
    auto out = model.Forward(prompt.subspan(static_cast<size_t>(start), static_cast<size_t>(len)),
                             static_cast<int32_t>(start), kv,
                             last ? LogitsMode::kLast : LogitsMode::kNone, options.path);
    if (!out.ok()) return out.status();
    logits = std::move(*out);
  }
  result.prefill_seconds = Seconds(t0);

  Sampler sampler(options.sampling);
  t0 = std::chrono::steady_clock::now();
  int32_t pos = static_cast<int32_t>(result.prompt_tokens);
  for (int32_t step = 0; step < options.max_new_tokens; ++step) {
    const int32_t next = sampler.Sample(logits);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) !=
        options.stop_ids.end()) {
      break;
    }
    result.tokens.push_back(next);
    if (options.on_token) options.on_token(next);
    if (step + 1 == options.max_new_tokens) break;
    const int32_t one[1] = {next};
    auto out = model.Forward(one, pos++, kv, LogitsMode::kLast, options.path);
    if (!out.ok()) return out.status();
    logits = std::move(*out);
    ++result.decode_steps;
  }
  result.decode_seconds = Seconds(t0);
  result.text = model.tokenizer().Decode(result.tokens);
  return result;
}

}  // namespace kvc::worker
