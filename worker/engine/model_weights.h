// Llama weights dequantized to f32 once at load (the model is small: ~0.6 GB as f32), so the
// forward pass is plain sgemm. Matrices are row-major [out, in] (ggml's {in, out} layout).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/gguf_file.h"
#include "worker/engine/model_config.h"

namespace kvc::worker {

struct LayerWeights {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> wq;         // [num_q_heads * head_dim, hidden], rows in HF (rotate-half) order
  std::vector<float> wk;         // [num_kv_heads * head_dim, hidden], rows in HF order
  std::vector<float> wv;         // [num_kv_heads * head_dim, hidden]
  std::vector<float> wo;         // [hidden, num_q_heads * head_dim]
  std::vector<float> ffn_norm;   // [hidden]
  std::vector<float> w_gate;     // [intermediate, hidden]
  std::vector<float> w_up;       // [intermediate, hidden]
  std::vector<float> w_down;     // [hidden, intermediate]
};

struct ModelWeights {
  std::vector<float> token_embedding;  // [vocab, hidden]
  std::vector<float> output_norm;      // [hidden]
  std::vector<float> output;           // [vocab, hidden]; empty when tied to token_embedding
  std::vector<LayerWeights> layers;

  const std::vector<float>& output_matrix() const {
    return output.empty() ? token_embedding : output;
  }
};

// Loads and dequantizes every tensor, checking each shape against `config`. NotFound names a
// missing tensor; InvalidArgument a wrong shape or type.
absl::StatusOr<ModelWeights> LoadModelWeights(const GgufFile& file, const ModelConfig& config);

// GGUF stores Q/K rows permuted for interleaved-pair RoPE (llama.cpp's convert script); this
// restores the Hugging Face order (per head: row s*half+i <- row 2*i+s) used with rotate-half.
void UnpermuteQkRows(std::vector<float>& w, int32_t num_heads, int32_t head_dim, int32_t cols);

}  // namespace kvc::worker
