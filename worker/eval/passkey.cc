#include "worker/eval/passkey.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "worker/engine/chat_template.h"
#include "worker/engine/local_kv_store.h"
#include "worker/engine/ops.h"
#include "worker/engine/sampler.h"

namespace kvc::worker {
namespace {

constexpr char kInstruction[] =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it "
    "and memorize it. I will quiz you about the important information there.\n\n";

// Feeds `tokens` from `start` in chunks; returns the logits of every fed token ([n, vocab]) when
// `all`, else of the last one.
absl::StatusOr<std::vector<float>> Feed(LlamaModel& model, KvStore& kv,
                                        const std::vector<int32_t>& tokens, int32_t start,
                                        int32_t chunk, bool all) {
  std::vector<float> out;
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(chunk)) {
    const size_t len = std::min(static_cast<size_t>(chunk), tokens.size() - i);
    const bool last = i + len == tokens.size();
    auto logits =
        model.Forward(absl::MakeConstSpan(tokens).subspan(i, len), start + static_cast<int32_t>(i),
                      kv, all ? LogitsMode::kAll : (last ? LogitsMode::kLast : LogitsMode::kNone));
    if (!logits.ok()) return logits.status();
    out.insert(out.end(), logits->begin(), logits->end());
  }
  return out;
}

}  // namespace

PasskeyPrompt MakePasskeyPrompt(const BpeTokenizer& tok, const std::string& haystack,
                                int64_t context_tokens, double depth, const std::string& passkey) {
  const std::string needle =
      absl::StrCat(" The pass key is ", passkey, ". Remember it. ", passkey, " is the pass key.");
  const int64_t budget = context_tokens -
                         static_cast<int64_t>(tok.Encode(kInstruction, false).size()) -
                         static_cast<int64_t>(tok.Encode(needle, false).size());
  // Take whole haystack characters until the budget is met (about 4 characters per token,
  // refined by measuring).
  size_t chars = static_cast<size_t>(std::max<int64_t>(budget, 0) * 4);
  chars = std::min(chars, haystack.size());
  for (int iter = 0; iter < 4; ++iter) {
    const int64_t got = static_cast<int64_t>(tok.Encode(haystack.substr(0, chars), false).size());
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

absl::StatusOr<std::vector<PasskeyScore>> RunPasskey(LlamaModel& model, const std::string& haystack,
                                                     const std::vector<PolicySpec>& policies,
                                                     const PasskeyOptions& options) {
  const BpeTokenizer& tok = model.tokenizer();
  const int64_t vocab = model.config().vocab_size;
  std::mt19937_64 rng(options.seed);
  std::vector<PasskeyScore> scores;
  for (int64_t length : options.lengths) {
    for (double depth : options.depths) {
      const std::string passkey = std::to_string(10000 + rng() % 90000);
      PasskeyPrompt p = MakePasskeyPrompt(tok, haystack, length, depth, passkey);
      if (options.chat) {
        p.context = absl::StrCat("<|im_start|>system\n", kSmolLmDefaultSystem,
                                 "<|im_end|>\n<|im_start|>user\n", p.context);
        p.question = "\n\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is";
      }
      const std::vector<int32_t> context = tok.Encode(p.context, options.chat);
      const std::vector<int32_t> question = tok.Encode(p.question, options.chat);
      const std::vector<int32_t> answer = tok.Encode(p.answer, false);
      LocalKvStore prefilled(model.config().kv_geometry(), nullptr, model.pool());
      auto pre = Feed(model, prefilled, context, 0, options.prefill_chunk, /*all=*/false);
      if (!pre.ok()) return pre.status();
      const int32_t qpos = static_cast<int32_t>(context.size());

      for (const PolicySpec& spec : policies) {
        PasskeyScore s;
        s.policy = spec.name;
        s.context_tokens = static_cast<int64_t>(context.size());
        s.depth = depth;
        // Teacher-forced: question + answer in one pass over a compressed clone.
        {
          auto kv = prefilled.Clone(spec.make());
          if (auto st = kv->CommitStep(qpos); !st.ok()) return st;  // compress the context
          s.kv_slots = kv->StoredTokenSlots();
          std::vector<int32_t> qa = question;
          qa.insert(qa.end(), answer.begin(), answer.end());
          auto logits = Feed(model, *kv, qa, qpos, options.prefill_chunk, /*all=*/true);
          if (!logits.ok()) return logits.status();
          s.teacher_forced_match = true;
          for (size_t i = 0; i < answer.size(); ++i) {
            const float* row = logits->data() + (question.size() - 1 + i) * vocab;
            s.answer_logprob += LogProb(row, vocab, answer[i]);
            s.teacher_forced_match &=
                ArgMax(absl::MakeConstSpan(row, static_cast<size_t>(vocab))) == answer[i];
          }
        }
        // Generated: greedy continuation after the question.
        {
          auto kv = prefilled.Clone(spec.make());
          if (auto st = kv->CommitStep(qpos); !st.ok()) return st;
          auto logits = Feed(model, *kv, question, qpos, options.prefill_chunk, /*all=*/false);
          if (!logits.ok()) return logits.status();
          std::vector<int32_t> out;
          int32_t pos = qpos + static_cast<int32_t>(question.size());
          for (int32_t t = 0; t < options.answer_max_tokens; ++t) {
            const int32_t next = ArgMax(*logits);
            if (next == tok.eos_id()) break;
            out.push_back(next);
            const int32_t one[1] = {next};
            auto step = model.Forward(one, pos++, *kv, LogitsMode::kLast);
            if (!step.ok()) return step.status();
            logits = std::move(step);
          }
          s.generated = tok.Decode(out);
          s.generated_match = s.generated.find(passkey) != std::string::npos;
        }
        if (options.on_score) options.on_score(s);
        scores.push_back(std::move(s));
      }
    }
  }
  return scores;
}

}  // namespace kvc::worker
