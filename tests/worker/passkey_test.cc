// Passkey prompt construction and a tiny end-to-end run of the harness with local caches.
#include "worker/eval/passkey.h"

#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace kvc::worker
