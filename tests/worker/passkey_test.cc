// Passkey prompt construction and a tiny end-to-end run of the harness with local caches.
#include "worker/eval/passkey.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/model_paths.h"

namespace kvc::worker {
namespace {

std::string Haystack() {
  std::string text;
  for (int i = 0; i < 400; ++i) {
    text += "Sentence number " + std::to_string(i) + " talks about the weather in the hills. ";
  }
  return text;
}

TEST(PasskeyTest, NeedleLandsAtDepthAndLengthIsClose) {
  KVC_SKIP_WITHOUT_MODEL();
  LlamaModel* model = testing::SharedModel();
  ASSERT_NE(model, nullptr);
  const BpeTokenizer& tok = model->tokenizer();
  for (double depth : {0.0, 0.5, 1.0}) {
    const PasskeyPrompt p = MakePasskeyPrompt(tok, Haystack(), 1000, depth, "48151");
    const size_t at = p.context.find("The pass key is 48151");
    ASSERT_NE(at, std::string::npos);
    const double rel = static_cast<double>(at) / static_cast<double>(p.context.size());
    EXPECT_NEAR(rel, depth, 0.1) << "depth " << depth;
    const int64_t n = static_cast<int64_t>(tok.Encode(p.context, /*parse_special=*/false).size());
    EXPECT_NEAR(static_cast<double>(n), 1000.0, 60.0);
    EXPECT_EQ(p.answer, " 48151");
  }
}

TEST(PasskeyTest, FullCacheBeatsTinyWindowOnAnswerLogProb) {
  KVC_SKIP_WITHOUT_MODEL();
  LlamaModel* model = testing::SharedModel();
  ASSERT_NE(model, nullptr);
  PasskeyOptions opt;
  opt.lengths = {256};
  opt.depths = {0.0};
  opt.answer_max_tokens = 4;
  const std::vector<PolicySpec> policies = {
      {"full", [] { return std::unique_ptr<LocalEvictionPolicy>(); }},
      {"window=32", [] { return MakeLocalWindowPolicy(32); }},
  };
  auto scores = RunPasskey(*model, Haystack(), policies, opt);
  ASSERT_TRUE(scores.ok()) << scores.status();
  ASSERT_EQ(scores->size(), 2u);
  const PasskeyScore& full = (*scores)[0];
  const PasskeyScore& window = (*scores)[1];
  EXPECT_GT(full.answer_logprob, window.answer_logprob + 5.0);
  EXPECT_LT(window.kv_slots, full.kv_slots);
}

// A query-agnostic policy takes the context alone with its queries' statistics, and the
// question is prefilled after it, also when the other policies have it in their prompt. With
// nothing evicted that answers as the full cache does.
TEST(PasskeyTest, QueryAgnosticPolicyGetsTheContextAndItsQueryStatistics) {
  KVC_SKIP_WITHOUT_MODEL();
  LlamaModel* model = testing::SharedModel();
  ASSERT_NE(model, nullptr);
  const KvGeometry g = model->config().kv_geometry();
  PasskeyOptions opt;
  opt.lengths = {256};
  opt.depths = {0.5};
  opt.answer_max_tokens = 4;
  opt.question_in_prompt = true;
  std::vector<PasskeyPolicy> policies = {
      LocalPasskeyPolicy({"full", [] { return std::unique_ptr<LocalEvictionPolicy>(); }})};
  PasskeyPolicy agnostic;
  agnostic.name = "agnostic-full";
  agnostic.query_agnostic = true;
  std::vector<QueryStats> seen;
  int32_t context = 0;
  // Copies the context's K/V: what a service sequence would get from LoadPrompt.
  agnostic.load = [&](const PrefilledPrompt& p) -> absl::StatusOr<std::unique_ptr<KvCache>> {
    seen = p.query_stats;
    context = p.context_tokens;
    auto kv = std::make_unique<LocalKvCache>(g, nullptr, model->pool());
    for (int32_t l = 0; l < g.num_layers; ++l) {
      auto layer = p.kv->Fetch(l);
      if (!layer.ok()) return layer.status();
      const size_t d = static_cast<size_t>(g.head_dim), heads = layer->heads.size();
      const size_t n = static_cast<size_t>(p.context_tokens);
      std::vector<int32_t> positions(n);
      std::vector<float> k(n * heads * d), v(n * heads * d);
      for (size_t t = 0; t < n; ++t) {
        positions[t] = static_cast<int32_t>(t);
        for (size_t h = 0; h < heads; ++h) {
          std::copy_n(&layer->heads[h].keys[t * d], d, &k[(t * heads + h) * d]);
          std::copy_n(&layer->heads[h].values[t * d], d, &v[(t * heads + h) * d]);
        }
      }
      if (auto s = kv->Append(l, positions, k, v); !s.ok()) return s;
    }
    if (auto s = kv->CommitStep(p.context_tokens); !s.ok()) return s;
    return std::unique_ptr<KvCache>(std::move(kv));
  };
  policies.push_back(agnostic);
  auto scores = RunPasskey(*model, Haystack(), policies, opt);
  ASSERT_TRUE(scores.ok()) << scores.status();
  ASSERT_EQ(scores->size(), 2u);
  const PasskeyScore& full = (*scores)[0];
  const PasskeyScore& ag = (*scores)[1];
  EXPECT_EQ(ag.prompt_tokens, ag.context_tokens);
  EXPECT_GT(full.prompt_tokens, full.context_tokens);  // the question is in full's prompt
  EXPECT_EQ(context, ag.context_tokens);
  ASSERT_EQ(seen.size(), static_cast<size_t>(g.num_layers));
  for (const QueryStats& s : seen) {
    EXPECT_EQ(s.count, context - kExpectedAttentionSinks);
    EXPECT_EQ(s.mean.size(), static_cast<size_t>(g.num_q_heads * g.head_dim));
    EXPECT_EQ(s.covariance.size(), static_cast<size_t>(g.num_q_heads * g.head_dim * g.head_dim));
  }
  // The question prefilled over the cache instead of in the prompt: the same answer.
  EXPECT_NEAR(ag.answer_logprob, full.answer_logprob, 1e-2);
  EXPECT_EQ(ag.generated, full.generated);
}

}  // namespace
}  // namespace kvc::worker
