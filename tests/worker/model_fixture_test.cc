// End-to-end logits of the C++ engine against two independent implementations of the same GGUF
// (fixtures/logits_cases.txt, made by scripts/worker/make_fixtures.py):
//  * NumPy f32 forward pass on gguf-package dequantized weights: same math as ours, so tight.
//  * llama.cpp: quantizes activations to 8 bits inside its matmuls and keeps an f16 KV cache,
//    so agreement is statistical (top-1 agreement, max |diff| on its top-8, KL on the last row).
// Also: the Fetch + local attention path and chunked prefill reproduce the one-shot logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/worker/model_paths.h"
#include "worker/engine/chat_template.h"
#include "worker/engine/dequantize.h"
#include "worker/engine/generator.h"
#include "worker/engine/local_kv_cache.h"
#include "worker/engine/sampler.h"

namespace kvc::worker {
namespace {

struct TopEntry {
  int32_t id;
  float llama;
  float numpy;
};

struct LogitsCase {
  std::string name;
  std::vector<int32_t> ids;
  std::vector<int32_t> top1_llama, top1_numpy;
  std::vector<std::vector<TopEntry>> top;  // per position, llama.cpp's top-8
};

std::vector<LogitsCase> ReadCases() {
  std::ifstream in(testing::FixturePath("logits_cases.txt"));
  std::vector<LogitsCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string tag;
    ss >> tag;
    if (tag == "PROMPT") {
      cases.emplace_back();
      ss >> cases.back().name;
    } else if (tag == "IDS") {
      int32_t id;
      while (ss >> id) cases.back().ids.push_back(id);
    } else if (tag == "POS") {
      int32_t pos, a, b;
      ss >> pos >> a >> b;
      cases.back().top1_llama.push_back(a);
      cases.back().top1_numpy.push_back(b);
      std::vector<TopEntry> row;
      std::string item;
      while (ss >> item) {
        TopEntry e{};
        if (std::sscanf(item.c_str(), "%d:%f:%f", &e.id, &e.llama, &e.numpy) == 3) {
          row.push_back(e);
        }
      }
      cases.back().top.push_back(row);
    }
  }
  return cases;
}

std::vector<float> ReadF16(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint16_t> h;
  uint16_t v;
  while (in.read(reinterpret_cast<char*>(&v), 2)) h.push_back(v);
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = HalfToFloat(h[i]);
  return out;
}

// KL(p || q) of the softmax distributions of two logit rows, in nats.
double KlDivergence(const float* p_logits, const float* q_logits, int64_t n) {
  auto log_softmax = [n](const float* x) {
    const double mx = *std::max_element(x, x + n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
    std::vector<double> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] - mx - std::log(sum);
    return out;
  };
  const auto lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

class ModelFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVC_SKIP_WITHOUT_MODEL();
    model_ = testing::SharedModel();
    ASSERT_NE(model_, nullptr) << "model failed to load: " << testing::ModelPath();
    cases_ = ReadCases();
    ASSERT_EQ(cases_.size(), 3u) << "fixture missing: logits_cases.txt";
  }

  std::vector<float> Logits(const std::vector<int32_t>& ids, AttentionPath path, int64_t chunk) {
    LocalKvCache kv(model_->config().kv_geometry(), nullptr, model_->pool());
    std::vector<float> all;
    for (size_t start = 0; start < ids.size(); start += static_cast<size_t>(chunk)) {
      const size_t len = std::min(static_cast<size_t>(chunk), ids.size() - start);
      auto out = model_->Forward(absl::MakeConstSpan(ids).subspan(start, len),
                                 static_cast<int32_t>(start), kv, LogitsMode::kAll, path);
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return {};
      all.insert(all.end(), out->begin(), out->end());
    }
    return all;
  }

  LlamaModel* model_ = nullptr;
  std::vector<LogitsCase> cases_;
};

TEST_F(ModelFixtureTest, LogitsMatchNumpyAndLlamaCpp) {
  const int64_t vocab = model_->config().vocab_size;
  for (const LogitsCase& c : cases_) {
    SCOPED_TRACE(c.name);
    const std::vector<float> logits = Logits(c.ids, AttentionPath::kStoreAttend, 512);
    ASSERT_EQ(logits.size(), c.ids.size() * static_cast<size_t>(vocab));
    double max_np = 0, max_llama = 0, np_llama = 0;
    int agree_np = 0, agree_llama = 0;
    const int64_t n = static_cast<int64_t>(c.ids.size());
    for (int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * vocab;
      const int32_t top1 = ArgMax(absl::MakeConstSpan(row, static_cast<size_t>(vocab)));
      agree_np += top1 == c.top1_numpy[i];
      agree_llama += top1 == c.top1_llama[i];
      for (const TopEntry& e : c.top[i]) {
        max_np = std::max(max_np, std::abs(double{row[e.id]} - e.numpy));
        max_llama = std::max(max_llama, std::abs(double{row[e.id]} - e.llama));
        np_llama = std::max(np_llama, std::abs(double{e.numpy} - e.llama));
      }
    }
    const std::vector<float> last_llama =
        ReadF16(testing::FixturePath("logits_last_" + c.name + ".f16"));
    const std::vector<float> last_np =
        ReadF16(testing::FixturePath("logits_last_" + c.name + ".np.f16"));
    ASSERT_EQ(last_llama.size(), static_cast<size_t>(vocab));
    ASSERT_EQ(last_np.size(), static_cast<size_t>(vocab));
    const float* last = logits.data() + (n - 1) * vocab;
    double max_np_last = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      max_np_last = std::max(max_np_last, std::abs(double{last[j]} - last_np[j]));
    }
    const double kl_llama = KlDivergence(last_llama.data(), last, vocab);
    const double kl_np = KlDivergence(last_np.data(), last, vocab);
    std::printf(
        "[%s] %lld tokens | vs numpy: top-1 %d/%lld, max|diff| top-8 %.4f, last row %.4f, KL %.2e "
        "| vs llama.cpp: top-1 %d/%lld, max|diff| top-8 %.4f (numpy vs llama.cpp %.4f), last-row "
        "KL %.2e\n",
        c.name.c_str(), static_cast<long long>(n), agree_np, static_cast<long long>(n), max_np,
        max_np_last, kl_np, agree_llama, static_cast<long long>(n), max_llama, np_llama, kl_llama);
    // Same f32 math as NumPy: differences are summation order only (fixture rounded to f16 and
    // 4 decimals).
    EXPECT_EQ(agree_np, n);
    EXPECT_LT(max_np, 0.02);
    EXPECT_LT(max_np_last, 0.05);
    EXPECT_LT(kl_np, 1e-4);
    // llama.cpp: 8-bit activations and f16 KV; bounds are ~2x what NumPy itself shows against it.
    EXPECT_GE(agree_llama, static_cast<int>(0.9 * static_cast<double>(n)));
    EXPECT_LT(max_llama, 2.0 * np_llama + 0.05);
    EXPECT_LT(kl_llama, 0.02);
  }
}

TEST_F(ModelFixtureTest, FetchPathAndChunkedPrefillReproduceLogits) {
  const std::vector<int32_t>& ids = cases_[2].ids;  // the longest prompt
  const std::vector<float> one_shot = Logits(ids, AttentionPath::kStoreAttend, 512);
  const std::vector<float> fetched = Logits(ids, AttentionPath::kFetchLocal, 512);
  const std::vector<float> chunked = Logits(ids, AttentionPath::kStoreAttend, 37);
  ASSERT_EQ(one_shot.size(), fetched.size());
  ASSERT_EQ(one_shot.size(), chunked.size());
  double d_fetch = 0, d_chunk = 0;
  for (size_t i = 0; i < one_shot.size(); ++i) {
    d_fetch = std::max(d_fetch, std::abs(double{one_shot[i]} - fetched[i]));
    d_chunk = std::max(d_chunk, std::abs(double{one_shot[i]} - chunked[i]));
  }
  EXPECT_EQ(d_fetch, 0.0);   // same attention code on the same rows
  EXPECT_LT(d_chunk, 1e-3);  // only sgemm blocking differs
}

TEST_F(ModelFixtureTest, GreedyChatAnswerNamesParis) {
  const std::string prompt = ApplyChatTemplate({{"user", "What is the capital of France?"}},
                                               /*add_generation_prompt=*/true);
  const std::vector<int32_t> ids = model_->tokenizer().Encode(prompt, /*parse_special=*/true);
  EXPECT_EQ(ids, cases_[0].ids);  // the chat fixture's prompt
  LocalKvCache kv(model_->config().kv_geometry(), nullptr, model_->pool());
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  opt.stop_ids = {model_->tokenizer().eos_id()};
  auto result = Generate(*model_, kv, ids, opt);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->text.find("Paris"), std::string::npos) << result->text;
}

// Records the CommitStep ends a cache sees.
class CommitRecorder : public KvCache {
 public:
  explicit CommitRecorder(KvCache* inner) : inner_(inner) {}
  const KvGeometry& geometry() const override { return inner_->geometry(); }
  absl::Status Append(int32_t layer, absl::Span<const int32_t> positions,
                      absl::Span<const float> keys, absl::Span<const float> values) override {
    return inner_->Append(layer, positions, keys, values);
  }
  absl::Status Attend(int32_t layer, absl::Span<const float> queries,
                      absl::Span<const int32_t> positions, absl::Span<float> out) override {
    return inner_->Attend(layer, queries, positions, out);
  }
  absl::StatusOr<LayerKv> Fetch(int32_t layer) override { return inner_->Fetch(layer); }
  absl::Status CommitStep(int32_t end) override {
    commits.push_back(end);
    return inner_->CommitStep(end);
  }
  int64_t StoredTokenSlots() const override { return inner_->StoredTokenSlots(); }
  std::string Describe() const override { return "commit recorder"; }

  std::vector<int32_t> commits;

 private:
  KvCache* inner_;
};

// A document's end (prefill_split) ends a prefill chunk, so a cache can compress the document
// before the question is prefilled; tokens already in the cache are committed first.
TEST_F(ModelFixtureTest, PrefillSplitEndsAChunkAndCachedTokensAreCommittedFirst) {
  const std::vector<int32_t>& ids = cases_[2].ids;
  ASSERT_GT(ids.size(), 60u);
  const int32_t n = static_cast<int32_t>(ids.size());
  LocalKvCache local(model_->config().kv_geometry(), nullptr, model_->pool());
  CommitRecorder kv(&local);
  GenerateOptions opt;
  opt.max_new_tokens = 1;
  opt.prefill_chunk = 16;
  opt.prefill_split = 37;
  auto split = Generate(*model_, kv, ids, opt);
  ASSERT_TRUE(split.ok()) << split.status();
  std::vector<int32_t> expect = {16, 32, 37};
  for (int32_t end = 37 + 16; end < n; end += 16) expect.push_back(end);
  expect.push_back(n);
  EXPECT_EQ(kv.commits, expect);
  // The same answer as without the split.
  LocalKvCache plain(model_->config().kv_geometry(), nullptr, model_->pool());
  opt.prefill_split = 0;
  auto unsplit = Generate(*model_, plain, ids, opt);
  ASSERT_TRUE(unsplit.ok()) << unsplit.status();
  EXPECT_EQ(split->tokens, unsplit->tokens);

  // 20 tokens already cached (as if attached from kvcached's prefix cache).
  LocalKvCache attached(model_->config().kv_geometry(), nullptr, model_->pool());
  ASSERT_TRUE(
      model_->Forward(absl::MakeConstSpan(ids).subspan(0, 20), 0, attached, LogitsMode::kNone)
          .ok());
  CommitRecorder rest(&attached);
  opt.cached_prompt_tokens = 20;
  opt.prefill_split = 30;
  ASSERT_TRUE(Generate(*model_, rest, ids, opt).ok());
  ASSERT_GE(rest.commits.size(), 3u);
  EXPECT_EQ(rest.commits[0], 20);
  EXPECT_EQ(rest.commits[1], 30);
  EXPECT_EQ(rest.commits[2], 46);
}

TEST_F(ModelFixtureTest, SinkWindowCacheStaysBoundedWhileDecoding) {
  const KvGeometry g = model_->config().kv_geometry();
  LocalKvCache kv(g, MakeLocalSinkWindowPolicy(4, 28), model_->pool());
  GenerateOptions opt;
  opt.max_new_tokens = 24;
  opt.prefill_chunk = 16;
  opt.sampling.temperature = 0.8f;
  auto result = Generate(*model_, kv, cases_[1].ids, opt);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tokens.size(), 24u);
  EXPECT_LE(kv.StoredTokenSlots(), int64_t{g.num_layers} * g.num_kv_heads * 32);
}

}  // namespace
}  // namespace kvc::worker
