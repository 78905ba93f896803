// Passkey retrieval (needle in a haystack). Each case is prefilled once with the full cache (a
// local f32 cache); the prefilled K/V then go to one cache per policy, which applies the policy
// as an engine would when the prompt is complete (a local cache clones and evicts; the
// kvcached-backed cache loads the K/V into a service sequence and compresses there with the
// prompt's last observation-window queries; a query-agnostic policy, Expected Attention, takes
// the context alone with its queries' statistics, and the question is prefilled after it).
// The answer is scored from each cache:
//  * teacher-forced: log-probability and argmax match of the answer tokens after the lead-in
//    "The pass key is" (works for weak models); the answer tokens are fed one decode step at a
//    time (through the cache's Attend, i.e. the service's for kvcached);
//  * generated: greedy answer, exact match when it contains the pass key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/llama_model.h"
#include "worker/engine/local_kv_cache.h"
#include "worker/engine/local_policy.h"
#include "worker/engine/query_stats.h"

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

// A prompt prefilled once with the full cache: what every policy starts from.
struct PrefilledPrompt {
  LocalKvCache* kv = nullptr;  // full cache, positions [0, prompt_tokens)
  int32_t prompt_tokens = 0;
  // The prompt's last queries of every layer ([layer] -> [n, num_q_heads, head_dim] and [n]
  // positions, n <= PasskeyOptions::observation_window), as the engine computed them in prefill:
  // SnapKV's observation window, H2O's prefill scores.
  std::vector<std::vector<float>> window_queries;
  std::vector<std::vector<int32_t>> window_positions;
  // Prompt positions of the pass key's digit tokens (both mentions in the needle).
  std::vector<int32_t> key_positions;
  // The context's length (== prompt_tokens unless the question is in the prompt) and, when a
  // policy is query_agnostic, the statistics of its queries before RoPE ([layer]; positions
  // [kExpectedAttentionSinks, context_tokens)).
  int32_t context_tokens = 0;
  std::vector<QueryStats> query_stats;
};

// What the cache of a policy holds after the policy ran at the end of the prompt.
struct KvFootprint {
  int64_t token_slots = 0;      // stored (layer, kv head, token) slots
  int64_t bytes = 0;            // bytes held (a local cache: token_slots as dense f16)
  int64_t dense_f16_bytes = 0;  // a full f16 cache of the same tokens
};

struct PasskeyPolicy {
  std::string name;
  // A cache holding `prompt` with the policy applied at the end of the prompt.
  std::function<absl::StatusOr<std::unique_ptr<KvCache>>(const PrefilledPrompt&)> load;
  // What that cache holds (called right after `load`).
  std::function<absl::StatusOr<KvFootprint>(KvCache&, const PrefilledPrompt&)> footprint;
  // The newest prompt queries per layer the policy needs (SnapKV's window); the prefill records
  // max(this, PasskeyOptions::observation_window).
  int32_t observation_queries = 0;
  // Query-agnostic (Expected Attention): `load` takes the context alone (context_tokens, with
  // PrefilledPrompt::query_stats) and the question is prefilled after it, through the
  // compressed cache, even with PasskeyOptions::question_in_prompt.
  bool query_agnostic = false;
};

// A local baseline: clones the full cache under `make()` (nullptr = full) and commits.
struct PolicySpec {
  std::string name;
  // Makes a fresh policy; returns nullptr for the full cache.
  std::function<std::unique_ptr<LocalEvictionPolicy>()> make;
};
PasskeyPolicy LocalPasskeyPolicy(const PolicySpec& spec);

struct PasskeyScore {
  std::string policy;
  int64_t context_tokens = 0;  // context (instruction + haystack + needle), as tokens
  int64_t prompt_tokens = 0;   // what was prefilled before the policy ran (a query-agnostic
                               // policy: the context)
  double depth = 0;
  int key_index = 0;  // which of PasskeyOptions::keys_per_cell
  std::string passkey;
  double answer_logprob = 0;          // sum over answer tokens, nats
  std::vector<double> token_logprob;  // per answer token
  bool teacher_forced_match = false;  // every answer token is the argmax
  bool generated_match = false;
  std::string generated;
  KvFootprint kv;  // after the policy ran, before the answer
  // Which of the pass key's digit tokens the cache still holds after the policy ran, over
  // every (layer, kv head): what an eviction policy lost before the model answered.
  int64_t key_slots = 0;  // layers x kv heads x key_positions
  int64_t key_slots_kept = 0;
  std::vector<int32_t> key_kept_by_layer;  // [layer]: kept (kv head, key token) pairs
  double load_seconds = 0;
  double answer_seconds = 0;
  // Kept for the local baselines' JSON.
  int64_t kv_slots = 0;
};

struct PasskeyOptions {
  std::vector<int64_t> lengths = {1024, 2048, 4096};
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int keys_per_cell = 1;
  int32_t prefill_chunk = 256;
  int32_t answer_max_tokens = 8;
  uint64_t seed = 1234;  // pass keys are random 5-digit numbers
  // Wrap the case in the model's chat template: the context and question form the user turn
  // and "The pass key is" starts the assistant turn.
  bool chat = false;
  // The prompt that is prefilled and compressed: false = the context only (the question comes
  // after the policy ran, as a prefill chunk); true = context + question, as `kvc-worker
  // generate` prefills a document with its question (SnapKV's observation window is then the
  // question). Query-agnostic policies always take the context alone.
  bool question_in_prompt = false;
  int32_t observation_window = 32;  // prompt queries kept per layer for PrefilledPrompt
  // Fetch every layer after each policy ran and count the pass key's tokens it holds
  // (PasskeyScore::key_*): one dense read of the cache per policy and case.
  bool count_key_tokens = false;
  std::function<void(const PasskeyScore&)> on_score;    // progress, may be empty
  std::function<void(const std::string&)> on_progress;  // prefill progress, may be empty
};

// One case of the grid: the token ids every policy is given.
struct PasskeyCase {
  int64_t length = 0;  // the requested context length (PasskeyOptions::lengths)
  double depth = 0;
  int key_index = 0;
  std::string passkey;
  std::vector<int32_t> context, question, answer;  // answer: " 71432" as tokens
};

// The grid RunPasskey runs, in its order (lengths x depths x keys; pass keys drawn from
// options.seed): `kvc-worker passkey --cases-out` hands it to other engines (kvpress).
std::vector<PasskeyCase> MakePasskeyCases(const BpeTokenizer& tok, const std::string& haystack,
                                          const PasskeyOptions& options);

absl::StatusOr<std::vector<PasskeyScore>> RunPasskey(LlamaModel& model, const std::string& haystack,
                                                     const std::vector<PasskeyPolicy>& policies,
                                                     const PasskeyOptions& options);
// Local baselines only.
absl::StatusOr<std::vector<PasskeyScore>> RunPasskey(LlamaModel& model, const std::string& haystack,
                                                     const std::vector<PolicySpec>& policies,
                                                     const PasskeyOptions& options);

}  // namespace kvc::worker
