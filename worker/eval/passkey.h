// Passkey retrieval (needle in a haystack) with local KV stores. Each case is prefilled once
// with the full cache; the K/V are then cloned into one store per policy, the policy is applied
// (as a compression at the end of prefill), and the question is answered from each store:
//  * teacher-forced: log-probability and argmax match of the answer tokens after the lead-in
//    "The pass key is" (works for weak models);
//  * generated: greedy answer, exact match when it contains the pass key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/local_policy.h"

namespace kvc::worker {

struct PasskeyPrompt {
  std::string context;   // instruction + haystack with the needle at `depth`
  std::string question;  // "... What is the pass key? The pass key is"
  std::string answer;    // " 71432"
};

// Builds one case from `haystack` text: about `context_tokens` tokens of context, the needle
// sentence inserted at the sentence boundary nearest to `depth` (0 = start, 1 = end).
PasskeyPrompt MakePasskeyPrompt(const BpeTokenizer& tok, const std::string& haystack,
                                int64_t context_tokens, double depth, const std::string& passkey);

struct PolicySpec {
  std::string name;
  // Makes a fresh policy; returns nullptr for the full cache.
  std::function<std::unique_ptr<LocalEvictionPolicy>()> make;
};

struct PasskeyScore {
  std::string policy;
  int64_t context_tokens = 0;
  double depth = 0;
  double answer_logprob = 0;          // sum over answer tokens, nats
  bool teacher_forced_match = false;  // every answer token is the argmax
  bool generated_match = false;
  std::string generated;
  int64_t kv_slots = 0;  // stored (layer, kv head, token) slots after compression
};

struct PasskeyOptions {
  std::vector<int64_t> lengths = {1024, 2048, 4096};
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int32_t prefill_chunk = 256;
  int32_t answer_max_tokens = 8;
  uint64_t seed = 1234;  // pass keys are random 5-digit numbers
  // Wrap the case in the model's chat template: the context and question form the user turn
  // and "The pass key is" starts the assistant turn.
  bool chat = false;
  std::function<void(const PasskeyScore&)> on_score;  // progress, may be empty
};

absl::StatusOr<std::vector<PasskeyScore>> RunPasskey(LlamaModel& model, const std::string& haystack,
                                                     const std::vector<PolicySpec>& policies,
                                                     const PasskeyOptions& options);

}  // namespace kvc::worker
