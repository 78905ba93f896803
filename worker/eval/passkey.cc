#include "worker/eval/passkey.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/engine/chat_template.h"
#include "worker/engine/ops.h"
#include "worker/engine/sampler.h"

namespace kvc::worker {
namespace {

constexpr char kInstruction[] =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it "
    "and memorize it. I will quiz you about the important information there.\n\n";

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The full-cache prefill cache: forwards to a LocalKvCache and keeps the newest `window`
// queries of every layer (what a compressing engine remembers for SnapKV/H2O) and, with
// `stats_end` > 0, the statistics of the queries at positions [kExpectedAttentionSinks,
// stats_end) (Expected Attention's).
class RecordingKvCache : public KvCache {
 public:
  RecordingKvCache(LocalKvCache* inner, int32_t window, int32_t stats_end = 0)
      : inner_(inner),
        window_(static_cast<size_t>(std::max(window, 1))),
        queries_(static_cast<size_t>(inner->geometry().num_layers)),
        positions_(queries_.size()),
        stats_end_(stats_end) {
    if (stats_end_ > 0) stats_.emplace(inner->geometry());
  }

  const KvGeometry& geometry() const override { return inner_->geometry(); }
  absl::Status Append(int32_t layer, absl::Span<const int32_t> positions,
                      absl::Span<const float> keys, absl::Span<const float> values) override {
    return inner_->Append(layer, positions, keys, values);
  }
  absl::Status Attend(int32_t layer, absl::Span<const float> queries,
                      absl::Span<const int32_t> query_positions, absl::Span<float> out) override {
    const KvGeometry& g = inner_->geometry();
    const size_t row = static_cast<size_t>(g.num_q_heads) * static_cast<size_t>(g.head_dim);
    auto& q = queries_[static_cast<size_t>(layer)];
    auto& p = positions_[static_cast<size_t>(layer)];
    q.insert(q.end(), queries.begin(), queries.end());
    p.insert(p.end(), query_positions.begin(), query_positions.end());
    if (p.size() > window_) {
      const size_t drop = p.size() - window_;
      p.erase(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(drop));
      q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(drop * row));
    }
    if (stats_) {
      if (auto s =
              stats_->Add(layer, queries, query_positions, kExpectedAttentionSinks, stats_end_);
          !s.ok()) {
        return s;
      }
    }
    return inner_->Attend(layer, queries, query_positions, out);
  }
  absl::StatusOr<LayerKv> Fetch(int32_t layer) override { return inner_->Fetch(layer); }
  absl::Status CommitStep(int32_t end_position) override {
    return inner_->CommitStep(end_position);
  }
  int64_t StoredTokenSlots() const override { return inner_->StoredTokenSlots(); }
  std::string Describe() const override { return inner_->Describe(); }

  std::vector<std::vector<float>>& queries() { return queries_; }
  std::vector<std::vector<int32_t>>& positions() { return positions_; }
  std::vector<QueryStats> query_stats() const {
    return stats_ ? stats_->Finish() : std::vector<QueryStats>{};
  }

 private:
  LocalKvCache* inner_;
  size_t window_;
  std::vector<std::vector<float>> queries_;
  std::vector<std::vector<int32_t>> positions_;
  int32_t stats_end_;
  std::optional<QueryStatsAccumulator> stats_;
};

// Feeds `tokens` from `start` in chunks; returns the logits of the last fed token.
absl::StatusOr<std::vector<float>> Feed(LlamaModel& model, KvCache& kv,
                                        const std::vector<int32_t>& tokens, int32_t start,
                                        int32_t chunk) {
  std::vector<float> out;
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(chunk)) {
    const size_t len = std::min(static_cast<size_t>(chunk), tokens.size() - i);
    const bool last = i + len == tokens.size();
    auto logits =
        model.Forward(absl::MakeConstSpan(tokens).subspan(i, len), start + static_cast<int32_t>(i),
                      kv, last ? LogitsMode::kLast : LogitsMode::kNone);
    if (!logits.ok()) return logits.status();
    out = std::move(*logits);
  }
  return out;
}

// Greedy decoding from `logits` (the prediction for position `pos`) for up to `max` tokens.
absl::StatusOr<std::vector<int32_t>> Greedy(LlamaModel& model, KvCache& kv,
                                            std::vector<float> logits, int32_t pos, int32_t max,
                                            std::vector<int32_t> out) {
  const int32_t eos = model.tokenizer().eos_id();
  while (static_cast<int32_t>(out.size()) < max) {
    const int32_t next = ArgMax(logits);
    if (next == eos) break;
    out.push_back(next);
    if (static_cast<int32_t>(out.size()) == max) break;
    const int32_t one[1] = {next};
    auto step = model.Forward(one, pos++, kv, LogitsMode::kLast);
    if (!step.ok()) return step.status();
    logits = std::move(*step);
  }
  return out;
}

// Every occurrence of the pass key's tokens in `prompt`, as positions.
std::vector<int32_t> KeyPositions(const BpeTokenizer& tok, const std::vector<int32_t>& prompt,
                                  const std::string& passkey) {
  const std::vector<int32_t> key = tok.Encode(passkey, /*parse_special=*/false);
  std::vector<int32_t> out;
  if (key.empty()) return out;
  for (size_t at = 0; at + key.size() <= prompt.size(); ++at) {
    if (std::equal(key.begin(), key.end(), prompt.begin() + static_cast<std::ptrdiff_t>(at))) {
      for (size_t i = 0; i < key.size(); ++i) out.push_back(static_cast<int32_t>(at + i));
    }
  }
  return out;
}

// Fills s.key_* from what `kv` holds now.
absl::Status CountKeyTokens(KvCache& kv, const std::vector<int32_t>& key_positions,
                            PasskeyScore& s) {
  const KvGeometry& g = kv.geometry();
  for (int32_t layer = 0; layer < g.num_layers; ++layer) {
    auto held = kv.Fetch(layer);
    if (!held.ok()) return held.status();
    int32_t kept = 0;
    for (const HeadKv& head : held->heads) {
      for (int32_t p : key_positions) {
        kept += std::binary_search(head.positions.begin(), head.positions.end(), p) ? 1 : 0;
      }
    }
    s.key_kept_by_layer.push_back(kept);
    s.key_slots_kept += kept;
    s.key_slots += static_cast<int64_t>(held->heads.size() * key_positions.size());
  }
  return absl::OkStatus();
}

}  // namespace

PasskeyPrompt MakePasskeyPrompt(const BpeTokenizer& tok, const std::string& haystack,
                                int64_t context_tokens, double depth, const std::string& passkey) {
  const std::string needle =
      absl::StrCat(" The pass key is ", passkey, ". Remember it. ", passkey, " is the pass key.");
  const int64_t budget =
      context_tokens -
      static_cast<int64_t>(tok.Encode(kInstruction, /*parse_special=*/false).size()) -
      static_cast<int64_t>(tok.Encode(needle, /*parse_special=*/false).size());
  // Take whole haystack characters until the budget is met (about 4 characters per token,
  // refined by measuring).
  size_t chars = static_cast<size_t>(std::max<int64_t>(budget, 0) * 4);
  chars = std::min(chars, haystack.size());
  for (int iter = 0; iter < 4; ++iter) {
    const int64_t got =
        static_cast<int64_t>(tok.Encode(haystack.substr(0, chars), /*parse_special=*/false).size());
    if (got == 0) break;
    chars = std::min(haystack.size(), static_cast<size_t>(static_cast<double>(chars) *
                                                          static_cast<double>(budget) / got));
  }
  std::string hay = haystack.substr(0, chars);
  // Needle after the sentence end nearest to the requested depth.
  size_t at = static_cast<size_t>(depth * static_cast<double>(hay.size()));
  if (at < hay.size()) {
    const size_t dot = hay.rfind(". ", at);
    at = dot == std::string::npos ? 0 : dot + 1;
  }
  at = std::min(at, hay.size());
  PasskeyPrompt p;
  p.context = absl::StrCat(kInstruction, hay.substr(0, at), needle, hay.substr(at));
  p.question = "\n\nWhat is the pass key? The pass key is";
  p.answer = absl::StrCat(" ", passkey);
  return p;
}

PasskeyPolicy LocalPasskeyPolicy(const PolicySpec& spec) {
  PasskeyPolicy p;
  p.name = spec.name;
  auto make = spec.make;
  p.load = [make](const PrefilledPrompt& prompt) -> absl::StatusOr<std::unique_ptr<KvCache>> {
    std::unique_ptr<LocalKvCache> kv = prompt.kv->Clone(make());
    if (auto s = kv->CommitStep(prompt.prompt_tokens); !s.ok()) return s;
    return std::unique_ptr<KvCache>(std::move(kv));
  };
  p.footprint = [](KvCache& kv, const PrefilledPrompt& prompt) -> absl::StatusOr<KvFootprint> {
    const KvGeometry& g = kv.geometry();
    const int64_t slot_bytes = int64_t{2} * 2 * g.head_dim;  // K and V as f16
    KvFootprint f;
    f.token_slots = kv.StoredTokenSlots();
    f.bytes = f.token_slots * slot_bytes;
    f.dense_f16_bytes = int64_t{g.num_layers} * g.num_kv_heads * prompt.prompt_tokens * slot_bytes;
    return f;
  };
  return p;
}

absl::StatusOr<std::vector<PasskeyScore>> RunPasskey(LlamaModel& model, const std::string& haystack,
                                                     const std::vector<PolicySpec>& policies,
                                                     const PasskeyOptions& options) {
  std::vector<PasskeyPolicy> local;
  local.reserve(policies.size());
  for (const PolicySpec& spec : policies) local.push_back(LocalPasskeyPolicy(spec));
  return RunPasskey(model, haystack, local, options);
}

std::vector<PasskeyCase> MakePasskeyCases(const BpeTokenizer& tok, const std::string& haystack,
                                          const PasskeyOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::vector<PasskeyCase> cases;
  for (int64_t length : options.lengths) {
    for (double depth : options.depths) {
      for (int key = 0; key < std::max(options.keys_per_cell, 1); ++key) {
        PasskeyCase c{length, depth, key, std::to_string(10000 + rng() % 90000), {}, {}, {}};
        PasskeyPrompt p = MakePasskeyPrompt(tok, haystack, length, depth, c.passkey);
        if (options.chat) {
          p.context = absl::StrCat("<|im_start|>system\n", kSmolLmDefaultSystem,
                                   "<|im_end|>\n<|im_start|>user\n", p.context);
          p.question =
              "\n\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is";
        }
        c.context = tok.Encode(p.context, options.chat);
        c.question = tok.Encode(p.question, options.chat);
        c.answer = tok.Encode(p.answer, /*parse_special=*/false);
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

absl::StatusOr<std::vector<PasskeyScore>> RunPasskey(LlamaModel& model, const std::string& haystack,
                                                     const std::vector<PasskeyPolicy>& policies,
                                                     const PasskeyOptions& options) {
  const BpeTokenizer& tok = model.tokenizer();
  const int64_t vocab = model.config().vocab_size;
  std::vector<PasskeyScore> scores;
  for (const PasskeyCase& c : MakePasskeyCases(tok, haystack, options)) {
    const double depth = c.depth;
    const int key = c.key_index;
    const std::string& passkey = c.passkey;
    const std::vector<int32_t>& context = c.context;
    const std::vector<int32_t>& question = c.question;
    const std::vector<int32_t>& answer = c.answer;
    std::vector<int32_t> prompt = context;
    if (options.question_in_prompt) prompt.insert(prompt.end(), question.begin(), question.end());

    const auto t_prefill = std::chrono::steady_clock::now();
    LocalKvCache full(model.config().kv_geometry(), nullptr, model.pool());
    int32_t observed = options.observation_window;
    bool stats = false;
    for (const PasskeyPolicy& policy : policies) {
      observed = std::max(observed, policy.observation_queries);
      stats = stats || policy.query_agnostic;
    }
    RecordingKvCache recorder(&full, observed, stats ? static_cast<int32_t>(context.size()) : 0);
    auto prompt_logits = Feed(model, recorder, prompt, 0, options.prefill_chunk);
    if (!prompt_logits.ok()) return prompt_logits.status();
    PrefilledPrompt prefilled;
    prefilled.kv = &full;
    prefilled.prompt_tokens = static_cast<int32_t>(prompt.size());
    prefilled.window_queries = std::move(recorder.queries());
    prefilled.window_positions = std::move(recorder.positions());
    prefilled.key_positions = KeyPositions(tok, prompt, passkey);
    prefilled.context_tokens = static_cast<int32_t>(context.size());
    prefilled.query_stats = recorder.query_stats();
    if (options.on_progress) {
      options.on_progress(
          absl::StrFormat("prefilled %d tokens (context %d, depth %.2f, key %d) in %.1f s",
                          prompt.size(), context.size(), depth, key, Since(t_prefill)));
    }

    for (const PasskeyPolicy& policy : policies) {
      // The question is prefilled after the policy ran (through its cache), or it was
      // part of the prompt.
      const bool question_after = !options.question_in_prompt || policy.query_agnostic;
      const int32_t policy_prompt =
          static_cast<int32_t>(question_after ? context.size() : prompt.size());
      PasskeyScore s;
      s.policy = policy.name;
      s.context_tokens = static_cast<int64_t>(context.size());
      s.prompt_tokens = policy_prompt;
      s.depth = depth;
      s.key_index = key;
      s.passkey = passkey;
      auto t0 = std::chrono::steady_clock::now();
      auto kv = policy.load(prefilled);
      if (!kv.ok()) return kv.status();
      if (policy.footprint) {
        auto f = policy.footprint(**kv, prefilled);
        if (!f.ok()) return f.status();
        s.kv = *f;
      }
      s.kv_slots = s.kv.token_slots;
      if (options.count_key_tokens && !prefilled.key_positions.empty()) {
        if (auto c = CountKeyTokens(**kv, prefilled.key_positions, s); !c.ok()) return c;
      }
      s.load_seconds = Since(t0);
      t0 = std::chrono::steady_clock::now();
      // After the policy ran: feeds the question through `cache` when it was not part of the
      // prompt, moving `pos` past it and `logits` to its last token's prediction.
      auto feed_question = [&](KvCache& cache, int32_t& at,
                               std::vector<float>& last) -> absl::Status {
        if (!question_after) return absl::OkStatus();
        auto q = Feed(model, cache, question, at, options.prefill_chunk);
        if (!q.ok()) return q.status();
        last = std::move(*q);
        at += static_cast<int32_t>(question.size());
        return absl::OkStatus();
      };
      // The prediction for the first answer token: from the prompt's prefill, or from the
      // question fed after the policy ran.
      int32_t pos = policy_prompt;
      std::vector<float> logits = *prompt_logits;
      if (auto st = feed_question(**kv, pos, logits); !st.ok()) return st;
      // Teacher forcing, one decode step per answer token.
      s.teacher_forced_match = true;
      size_t diverged = answer.size();
      for (size_t i = 0; i < answer.size(); ++i) {
        const double lp = LogProb(logits.data(), vocab, answer[i]);
        s.token_logprob.push_back(lp);
        s.answer_logprob += lp;
        if (ArgMax(logits) != answer[i] && diverged == answer.size()) diverged = i;
        if (i + 1 == answer.size()) break;
        const int32_t one[1] = {answer[i]};
        auto step = model.Forward(one, pos++, **kv, LogitsMode::kLast);
        if (!step.ok()) return step.status();
        logits = std::move(*step);
      }
      s.teacher_forced_match = diverged == answer.size();
      // Greedy decoding makes the same steps while it agrees with the answer: continue
      // this cache after a full match, else decode again from a fresh cache.
      std::vector<int32_t> generated;
      if (s.teacher_forced_match &&
          static_cast<int32_t>(answer.size()) >= options.answer_max_tokens) {
        generated = answer;
      } else if (s.teacher_forced_match) {
        const int32_t one[1] = {answer.back()};
        auto step = model.Forward(one, pos++, **kv, LogitsMode::kLast);
        if (!step.ok()) return step.status();
        auto g = Greedy(model, **kv, std::move(*step), pos, options.answer_max_tokens, answer);
        if (!g.ok()) return g.status();
        generated = std::move(*g);
      } else {
        kv->reset();  // a kvcached sequence is released before the next is made
        auto fresh = policy.load(prefilled);
        if (!fresh.ok()) return fresh.status();
        int32_t gpos = policy_prompt;
        std::vector<float> first = *prompt_logits;
        if (auto st = feed_question(**fresh, gpos, first); !st.ok()) return st;
        auto g = Greedy(model, **fresh, std::move(first), gpos, options.answer_max_tokens, {});
        if (!g.ok()) return g.status();
        generated = std::move(*g);
      }
      s.generated = tok.Decode(generated);
      s.generated_match = s.generated.find(passkey) != std::string::npos;
      s.answer_seconds = Since(t0);
      if (options.on_score) options.on_score(s);
      scores.push_back(std::move(s));
    }
  }
  return scores;
}

}  // namespace kvc::worker
