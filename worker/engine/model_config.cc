#include "worker/engine/model_config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvc::worker {

absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file) {
  auto arch = file.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama") {
    return absl::InvalidArgumentError(
        absl::StrCat("general.architecture is '", *arch, "'; this engine runs llama only"));
  }
  ModelConfig c;
  if (auto name = file.GetString("general.name"); name.ok()) c.name = *name;
  struct IntKey {
    const char* key;
    int32_t* field;
  };
  for (const IntKey& k :
       {IntKey{"llama.block_count", &c.num_layers}, IntKey{"llama.embedding_length", &c.hidden},
        IntKey{"llama.feed_forward_length", &c.intermediate},
        IntKey{"llama.attention.head_count", &c.num_q_heads},
        IntKey{"llama.context_length", &c.context_length}}) {
    auto v = file.GetInt(k.key);
    if (!v.ok()) return v.status();
    if (*v <= 0 || *v > (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrCat(k.key, " = ", *v));
    }
    *k.field = static_cast<int32_t>(*v);
  }
  c.num_kv_heads = c.num_q_heads;
  if (auto v = file.GetInt("llama.attention.head_count_kv"); v.ok()) {
    c.num_kv_heads = static_cast<int32_t>(*v);
  }
  if (auto v = file.GetFloat("llama.rope.freq_base"); v.ok()) c.rope_theta = static_cast<float>(*v);
  if (auto v = file.GetFloat("llama.attention.layer_norm_rms_epsilon"); v.ok()) {
    c.rms_eps = static_cast<float>(*v);
  }
  if (c.hidden % c.num_q_heads != 0 || c.num_kv_heads <= 0 || c.num_q_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("inconsistent heads: hidden ", c.hidden, ", ",
                                                   c.num_q_heads, " q heads, ", c.num_kv_heads,
                                                   " kv heads"));
  }
  c.head_dim = c.hidden / c.num_q_heads;
  if (c.head_dim % 2 != 0) return absl::InvalidArgumentError("odd head_dim");
  if (auto v = file.GetInt("llama.rope.dimension_count"); v.ok() && *v != c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial RoPE (", *v, " of ", c.head_dim, " dims) is not supported"));
  }
  auto tokens = file.GetArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  c.vocab_size = static_cast<int32_t>((*tokens)->strings.size());
  if (auto v = file.GetInt("llama.vocab_size"); v.ok() && *v != c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama.vocab_size ", *v, " != ", c.vocab_size, " tokens"));
  }
  return c;
}

}  // namespace kvc::worker
