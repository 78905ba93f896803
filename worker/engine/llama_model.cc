#include "worker/engine/llama_model.h"

#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/attention.h"
#include "worker/engine/ops.h"

namespace kvc::worker {

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                             int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  std::unique_ptr<LlamaModel> m(new LlamaModel(num_threads));
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  m->file_ = std::move(*file);
  auto config = ReadModelConfig(*m->file_);
  if (!config.ok()) return config.status();
  m->config_ = *config;
  auto weights = LoadModelWeights(*m->file_, m->config_);
  if (!weights.ok()) return weights.status();
  m->weights_ = std::move(*weights);
  auto tok = BpeTokenizer::FromGguf(*m->file_);
  if (!tok.ok()) return tok.status();
  m->tokenizer_ = std::move(*tok);
  SetBlasThreads(num_threads);
  return m;
}

absl::StatusOr<std::vector<float>> LlamaModel::Forward(absl::Span<const int32_t> tokens,
                                                       int32_t start_pos, KvCache& kv,
                                                       LogitsMode mode, AttentionPath path) {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("Forward needs at least one token");
  const KvGeometry& g = kv.geometry();
  if (g.num_layers != c.num_layers || g.num_kv_heads != c.num_kv_heads ||
      g.num_q_heads != c.num_q_heads || g.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KvCache geometry does not match the model");
  }
  const int64_t d = c.hidden, hd = c.head_dim;
  const int64_t q_dim = int64_t{c.num_q_heads} * hd, kv_dim = int64_t{c.num_kv_heads} * hd;
  const int64_t ff = c.intermediate;

  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[i] = start_pos + static_cast<int32_t>(i);
  const RopeAngles rope = ComputeRopeAngles(positions, c.head_dim, c.rope_theta);

  std::vector<float> x(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", tokens[i], " out of range"));
    }
    const float* e = weights_.token_embedding.data() + int64_t{tokens[i]} * d;
    std::copy(e, e + d, x.data() + i * d);
  }

  std::vector<float> h(static_cast<size_t>(n * d)), q(static_cast<size_t>(n * q_dim)),
      k(static_cast<size_t>(n * kv_dim)), v(static_cast<size_t>(n * kv_dim)),
      attn(static_cast<size_t>(n * q_dim)), gate(static_cast<size_t>(n * ff)),
      up(static_cast<size_t>(n * ff));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    RmsNorm(x.data(), w.attn_norm.data(), h.data(), n, d, c.rms_eps);
    MatMul(h.data(), w.wq.data(), q.data(), n, d, q_dim, /*accumulate=*/false);
    MatMul(h.data(), w.wk.data(), k.data(), n, d, kv_dim, /*accumulate=*/false);
    MatMul(h.data(), w.wv.data(), v.data(), n, d, kv_dim, /*accumulate=*/false);
    ApplyRope(q.data(), rope, c.num_q_heads, c.head_dim);
    ApplyRope(k.data(), rope, c.num_kv_heads, c.head_dim);
    if (auto s = kv.Append(l, positions, k, v); !s.ok()) return s;
    if (path == AttentionPath::kStoreAttend) {
      if (auto s = kv.Attend(l, q, positions, absl::MakeSpan(attn)); !s.ok()) return s;
    } else {
      auto layer = kv.Fetch(l);
      if (!layer.ok()) return layer.status();
      AttendLayer(g, *layer, q, positions, absl::MakeSpan(attn), &pool_);
    }
    MatMul(attn.data(), w.wo.data(), x.data(), n, q_dim, d, /*accumulate=*/true);

    RmsNorm(x.data(), w.ffn_norm.data(), h.data(), n, d, c.rms_eps);
    MatMul(h.data(), w.w_gate.data(), gate.data(), n, d, ff, /*accumulate=*/false);
    MatMul(h.data(), w.w_up.data(), up.data(), n, d, ff, /*accumulate=*/false);
    SiluMul(gate.data(), up.data(), n * ff, &pool_);
    MatMul(gate.data(), w.w_down.data(), x.data(), n, ff, d, /*accumulate=*/true);
  }
  if (auto s = kv.CommitStep(start_pos + static_cast<int32_t>(n)); !s.ok()) return s;

  const int64_t rows = mode == LogitsMode::kAll ? n : (mode == LogitsMode::kLast ? 1 : 0);
  std::vector<float> logits(static_cast<size_t>(rows * c.vocab_size));
  if (rows == 0) return logits;
  const float* last = x.data() + (n - rows) * d;
  RmsNorm(last, weights_.output_norm.data(), h.data(), rows, d, c.rms_eps);
  MatMul(h.data(), weights_.output_matrix().data(), logits.data(), rows, d, c.vocab_size,
         /*accumulate=*/false);
  return logits;
}

}  // namespace kvc::worker
