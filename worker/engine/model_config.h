// Llama hyper-parameters read from GGUF metadata (llama.* keys).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/gguf_file.h"
#include "worker/engine/kv_cache.h"

namespace kvc::worker {

struct ModelConfig {
  std::string name;
  int32_t num_layers = 0;
  int32_t hidden = 0;
  int32_t intermediate = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;

  KvGeometry kv_geometry() const {
    return {num_layers, num_kv_heads, num_q_heads, head_dim, rope_theta};
  }
};

// InvalidArgument when the architecture is not "llama" or the shapes are inconsistent
// (hidden not divisible by heads, q heads not a multiple of kv heads, partial RoPE).
absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file);

}  // namespace kvc::worker
