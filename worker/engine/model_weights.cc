#include "worker/engine/model_weights.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/dequantize.h"

namespace kvc::worker {
namespace {

absl::Status LoadTensor(const GgufFile& file, const std::string& name,
                        const std::vector<int64_t>& expect_dims, std::vector<float>& out) {
  const GgufTensor* t = file.FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor ", name, " missing"));
  if (t->dims != expect_dims) {
    std::string got, want;
    for (int64_t d : t->dims) absl::StrAppend(&got, d, " ");
    for (int64_t d : expect_dims) absl::StrAppend(&want, d, " ");
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has dims [", got, "], expected [", want, "]"));
  }
  out.resize(static_cast<size_t>(t->num_elements()));
  if (auto s = Dequantize(t->type, t->data, t->num_elements(), out.data()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

void UnpermuteQkRows(std::vector<float>& w, int32_t num_heads, int32_t head_dim, int32_t cols) {
  const int32_t half = head_dim / 2;
  std::vector<float> head(static_cast<size_t>(head_dim) * cols);
  for (int32_t h = 0; h < num_heads; ++h) {
    float* base = w.data() + static_cast<size_t>(h) * head_dim * cols;
    for (int32_t s = 0; s < 2; ++s) {
      for (int32_t i = 0; i < half; ++i) {
        const float* src = base + static_cast<size_t>(2 * i + s) * cols;
        std::copy(src, src + cols, head.data() + static_cast<size_t>(s * half + i) * cols);
      }
    }
    std::copy(head.begin(), head.end(), base);
  }
}

absl::StatusOr<ModelWeights> LoadModelWeights(const GgufFile& file, const ModelConfig& c) {
  ModelWeights w;
  const int64_t hidden = c.hidden, q_dim = int64_t{c.num_q_heads} * c.head_dim,
                kv_dim = int64_t{c.num_kv_heads} * c.head_dim, ff = c.intermediate;
  if (auto s = LoadTensor(file, "token_embd.weight", {hidden, c.vocab_size}, w.token_embedding);
      !s.ok()) {
    return s;
  }
  if (auto s = LoadTensor(file, "output_norm.weight", {hidden}, w.output_norm); !s.ok()) return s;
  if (file.FindTensor("output.weight") != nullptr) {
    if (auto s = LoadTensor(file, "output.weight", {hidden, c.vocab_size}, w.output); !s.ok()) {
      return s;
    }
  }
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    struct Spec {
      const char* name;
      std::vector<int64_t> dims;
      std::vector<float>* out;
    };
    const Spec specs[] = {
        {"attn_norm.weight", {hidden}, &lw.attn_norm},
        {"attn_q.weight", {hidden, q_dim}, &lw.wq},
        {"attn_k.weight", {hidden, kv_dim}, &lw.wk},
        {"attn_v.weight", {hidden, kv_dim}, &lw.wv},
        {"attn_output.weight", {q_dim, hidden}, &lw.wo},
        {"ffn_norm.weight", {hidden}, &lw.ffn_norm},
        {"ffn_gate.weight", {hidden, ff}, &lw.w_gate},
        {"ffn_up.weight", {hidden, ff}, &lw.w_up},
        {"ffn_down.weight", {ff, hidden}, &lw.w_down},
    };
    for (const Spec& s : specs) {
      if (auto st = LoadTensor(file, p + s.name, s.dims, *s.out); !st.ok()) return st;
    }
    UnpermuteQkRows(lw.wq, c.num_q_heads, c.head_dim, c.hidden);
    UnpermuteQkRows(lw.wk, c.num_kv_heads, c.head_dim, c.hidden);
  }
  return w;
}

}  // namespace kvc::worker
