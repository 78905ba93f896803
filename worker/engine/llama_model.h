// The Llama forward pass on CPU (SmolLM2-135M and other GGUF llama models): token embedding,
// per layer RMSNorm -> Q/K/V -> RoPE -> KvCache (append, attend) -> output projection ->
// RMSNorm -> SwiGLU MLP, final RMSNorm and (tied) output projection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvc/kernels/thread_pool.h"
#include "worker/engine/bpe_tokenizer.h"
#include "worker/engine/gguf_file.h"
#include "worker/engine/kv_cache.h"
#include "worker/engine/model_config.h"
#include "worker/engine/model_weights.h"

namespace kvc::worker {

// How attention reaches the cache: KvCache::Attend (computed where the KV lives), or
// KvCache::Fetch + attention computed in the engine. Both must give the same logits.
enum class AttentionPath { kStoreAttend, kFetchLocal };

// Which rows of logits Forward returns.
enum class LogitsMode { kLast, kAll, kNone };

class LlamaModel {
 public:
  // Opens, validates and dequantizes a GGUF llama model and its tokenizer.
  // num_threads <= 0: all cores.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path, int num_threads);

  const ModelConfig& config() const { return config_; }
  const BpeTokenizer& tokenizer() const { return *tokenizer_; }
  kernels::ThreadPool* pool() { return &pool_; }

  // Runs `tokens` at positions start_pos, start_pos + 1, ... through the model, appending their
  // K/V to `kv` and then committing the step (kv.CommitStep(start_pos + n)). Returns logits
  // [rows, vocab]: rows = 1 (kLast), n (kAll) or 0 (kNone). InvalidArgument for an empty input
  // or out-of-vocabulary ids; KvCache errors pass through.
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const int32_t> tokens, int32_t start_pos,
                                             KvCache& kv, LogitsMode mode,
                                             AttentionPath path = AttentionPath::kStoreAttend);

 private:
  explicit LlamaModel(int num_threads) : pool_(num_threads) {}

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<BpeTokenizer> tokenizer_;
  kernels::ThreadPool pool_;
};

}  // namespace kvc::worker
