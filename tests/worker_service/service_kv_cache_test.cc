// The engine's two KV caches agree: ServiceKvCache (KV cache in a real kvcached over gRPC)
// gives the same attention as the local in-memory cache, on the decode path (the service's
// Attend) and the prefill path (Fetch + local attention), and SnapKV at the end of the
// prompt shrinks what the service holds. Expected Attention (query-agnostic) compresses a
// document before its question with the statistics of the document's queries (these tests need
// kvcached's ExpectedAttentionSpec).
#include "worker/service/service_kv_cache.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"
#include "worker/engine/local_kv_cache.h"
#include "worker/engine/query_stats.h"
#include "worker/service/service_policy_parse.h"

namespace kvc::worker {
namespace {

constexpr int kLayers = 2, kHeads = 2, kQHeads = 4, kDim = 64;
constexpr float kTheta = 10000.0f;

cachesvc::ServerOptions F32Pool(bool rope = false) {
  cachesvc::ServerOptions o;
  o.listen = "127.0.0.1:0";
  cachesvc::PoolOptions pool;
  pool.name = "worker";
  pool.capacity_bytes = int64_t{64} << 20;
  pool.geometry.num_layers = kLayers;
  pool.geometry.num_kv_heads = kHeads;
  pool.geometry.num_query_heads = kQHeads;
  pool.geometry.head_dim = kDim;
  pool.geometry.dtype = kernels::DType::kF32;  // exact storage: both caches must agree closely
  if (rope) {  // Expected Attention rotates the statistics with the pool's RoPE
    pool.geometry.rope.enabled = true;
    pool.geometry.rope.theta = kTheta;
  }
  o.store.pools.push_back(pool);
  return o;
}

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

KvGeometry Geometry(float rope_theta = 0.0f) {
  KvGeometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.num_q_heads = kQHeads;
  g.head_dim = kDim;
  g.rope_theta = rope_theta;
  return g;
}

// Runs a prefill of `prompt` tokens in chunks, then `decode` single-token steps, on `kv`,
// returning every attention output in order. With `start`, the positions before it are in
// the cache already (attached) and the prefill runs from there.
std::vector<float> Drive(KvCache& kv, int prompt, int chunk, int decode, int start = 0) {
  std::vector<float> outputs;
  int32_t pos = start;
  auto step = [&](int n) {
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = pos + i;
    for (int l = 0; l < kLayers; ++l) {
      const auto k =
          Gaussian(static_cast<size_t>(n) * kHeads * kDim, 100 * l + static_cast<uint32_t>(pos));
      const auto v = Gaussian(k.size(), 7 + 100 * l + static_cast<uint32_t>(pos));
      EXPECT_THAT(kv.Append(l, positions, k, v), ::kvc::testing::IsOk());
      const auto q = Gaussian(static_cast<size_t>(n) * kQHeads * kDim,
                              55 + 100 * l + static_cast<uint32_t>(pos));
      std::vector<float> out(q.size());
      EXPECT_THAT(kv.Attend(l, q, positions, absl::MakeSpan(out)), ::kvc::testing::IsOk());
      outputs.insert(outputs.end(), out.begin(), out.end());
    }
    pos += n;
    EXPECT_THAT(kv.CommitStep(pos), ::kvc::testing::IsOk());
  };
  for (int done = start; done < prompt; done += chunk) step(std::min(chunk, prompt - done));
  for (int i = 0; i < decode; ++i) step(1);
  return outputs;
}

// The queries Drive makes at [begin, end) of every layer, summarized as Expected Attention's.
std::vector<QueryStats> DriveStats(int prompt, int chunk, int32_t begin, int32_t end) {
  QueryStatsAccumulator acc(Geometry(kTheta));
  for (int32_t pos = 0; pos < prompt; pos += chunk) {
    const int n = std::min(chunk, prompt - pos);
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = pos + i;
    for (int l = 0; l < kLayers; ++l) {
      const auto q = Gaussian(static_cast<size_t>(n) * kQHeads * kDim,
                              55 + 100 * l + static_cast<uint32_t>(pos));
      EXPECT_THAT(acc.Add(l, q, positions, begin, end), ::kvc::testing::IsOk());
    }
  }
  return acc.Finish();
}

TEST(ServiceKvCacheTest, MatchesTheLocalCacheOnPrefillAndDecode) {
  auto t = ::kvc::testing::StartTestServer(F32Pool());
  kernels::ThreadPool threads(2);
  LocalKvCache local(Geometry(), nullptr, &threads);
  for (bool always_fetch : {false, true}) {
    SCOPED_TRACE(always_fetch ? "fetch path" : "attend path");
    KVC_ASSERT_OK_AND_ASSIGN(auto service, ServiceKvCache::Create(t.client.get(), "", Geometry(),
                                                                  {}, always_fetch, &threads));
    const std::vector<float> a = Drive(*service, 40, 16, 6);
    LocalKvCache fresh(Geometry(), nullptr, &threads);
    const std::vector<float> b = Drive(fresh, 40, 16, 6);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << i;
    EXPECT_EQ(service->StoredTokenSlots(), 46 * kLayers * kHeads);
    if (!always_fetch) {
      EXPECT_EQ(service->attend_calls(), 6 * kLayers);
    }
  }
}

TEST(ServiceKvCacheTest, SnapKvAtThePromptEndShrinksTheServiceCache) {
  auto t = ::kvc::testing::StartTestServer(F32Pool());
  kernels::ThreadPool threads(2);
  ServicePolicy policy;
  policy.at_prompt_end =
      client::CompressionSpec::SnapKv(8, 24).WithStorage(client::StorageFormat::kInt4G32);
  policy.compress_at_prompt_end = true;
  policy.query_window = 8;
  KVC_ASSERT_OK_AND_ASSIGN(auto service, ServiceKvCache::Create(t.client.get(), "", Geometry(),
                                                                policy, false, &threads));
  service->ExpectPrompt(100);
  Drive(*service, 100, 32, 3);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, service->Info());
  EXPECT_EQ(info.storage, client::StorageFormat::kInt4G32);
  for (int64_t n : info.stored_tokens) EXPECT_EQ(n, 24 + 3);  // budget + decoded tokens
  EXPECT_EQ(info.visible_tokens, 103);
}

// Keeps the last `window` queries of every layer, like the passkey harness's prefill cache.
class QueryRecorder : public KvCache {
 public:
  QueryRecorder(KvCache* inner, size_t window)
      : inner_(inner), window_(window), q_(kLayers), p_(kLayers) {}
  const KvGeometry& geometry() const override { return inner_->geometry(); }
  absl::Status Append(int32_t layer, absl::Span<const int32_t> positions,
                      absl::Span<const float> keys, absl::Span<const float> values) override {
    return inner_->Append(layer, positions, keys, values);
  }
  absl::Status Attend(int32_t layer, absl::Span<const float> queries,
                      absl::Span<const int32_t> positions, absl::Span<float> out) override {
    auto& q = q_[static_cast<size_t>(layer)];
    auto& p = p_[static_cast<size_t>(layer)];
    q.insert(q.end(), queries.begin(), queries.end());
    p.insert(p.end(), positions.begin(), positions.end());
    while (p.size() > window_) {
      p.erase(p.begin());
      q.erase(q.begin(), q.begin() + kQHeads * kDim);
    }
    return inner_->Attend(layer, queries, positions, out);
  }
  absl::StatusOr<LayerKv> Fetch(int32_t layer) override { return inner_->Fetch(layer); }
  absl::Status CommitStep(int32_t end) override { return inner_->CommitStep(end); }
  int64_t StoredTokenSlots() const override { return inner_->StoredTokenSlots(); }
  std::string Describe() const override { return "recorder"; }

  // The recorded queries and their positions, per layer.
  const std::vector<std::vector<float>>& queries() const { return q_; }
  const std::vector<std::vector<int32_t>>& positions() const { return p_; }

 private:
  KvCache* inner_;
  size_t window_;
  std::vector<std::vector<float>> q_;
  std::vector<std::vector<int32_t>> p_;
};

// The passkey harness prefills once locally and loads the K/V into a service sequence per
// policy: that must leave the service holding exactly what prefilling through the service
// (`generate --kv=kvcached`) leaves, for SnapKV (observation window) and H2O (prefill scores).
TEST(ServiceKvCacheTest, LoadingAPrefilledPromptEqualsPrefillingThroughTheService) {
  auto t = ::kvc::testing::StartTestServer(F32Pool());
  kernels::ThreadPool threads(2);
  for (const char* spec : {"snapkv", "h2o"}) {
    SCOPED_TRACE(spec);
    ServicePolicy policy;
    if (std::string(spec) == "snapkv") {
      policy.at_prompt_end = client::CompressionSpec::SnapKv(8, 24);
    } else {
      policy.automatic = client::CompressionSpec::H2o(12, 12);
      policy.at_prompt_end = client::CompressionSpec::H2o(12, 12);
    }
    policy.compress_at_prompt_end = true;
    policy.query_window = 8;
    // The engine's way: prefill through the service, compressed when the prompt is complete.
    KVC_ASSERT_OK_AND_ASSIGN(auto engine, ServiceKvCache::Create(t.client.get(), "", Geometry(),
                                                                 policy, false, &threads));
    engine->ExpectPrompt(100);
    Drive(*engine, 100, 32, 0);
    // The harness's way: a local full-cache prefill (remembering more queries than needed),
    // loaded into a fresh sequence in small chunks.
    LocalKvCache local(Geometry(), nullptr, &threads);
    QueryRecorder recorder(&local, 20);
    Drive(recorder, 100, 32, 0);
    KVC_ASSERT_OK_AND_ASSIGN(auto loaded, ServiceKvCache::Create(t.client.get(), "", Geometry(),
                                                                 policy, false, &threads));
    ASSERT_THAT(loaded->LoadPrompt(local, 100, recorder.queries(), recorder.positions(),
                                   /*chunk_tokens=*/37),
                ::kvc::testing::IsOk());
    for (int l = 0; l < kLayers; ++l) {
      KVC_ASSERT_OK_AND_ASSIGN(LayerKv a, engine->Fetch(l));
      KVC_ASSERT_OK_AND_ASSIGN(LayerKv b, loaded->Fetch(l));
      for (int h = 0; h < kHeads; ++h) {
        EXPECT_EQ(a.heads[h].positions, b.heads[h].positions) << "layer " << l << " head " << h;
        EXPECT_LT(a.heads[h].positions.size(), 100u);
        EXPECT_EQ(a.heads[h].keys, b.heads[h].keys);
      }
    }
    // And the next decode step attends the same.
    const auto q = Gaussian(kQHeads * kDim, 999);
    std::vector<float> out_a(q.size()), out_b(q.size());
    const int32_t pos[1] = {100};
    const auto k = Gaussian(kHeads * kDim, 5), v = Gaussian(kHeads * kDim, 6);
    for (ServiceKvCache* s : {engine.get(), loaded.get()}) {
      for (int l = 0; l < kLayers; ++l)
        ASSERT_THAT(s->Append(l, pos, k, v), ::kvc::testing::IsOk());
    }
    ASSERT_THAT(engine->Attend(1, q, pos, absl::MakeSpan(out_a)), ::kvc::testing::IsOk());
    ASSERT_THAT(loaded->Attend(1, q, pos, absl::MakeSpan(out_b)), ::kvc::testing::IsOk());
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(out_a[i], out_b[i], 1e-5) << i;
  }
}

ServicePolicy ExpectedAttentionPolicy(int window, int budget) {
  auto policy = ParseServicePolicy(absl::StrCat("expattn=", budget, "/", window), "int4");
  EXPECT_THAT(policy, ::kvc::testing::IsOk());
  return *policy;
}

// Expected Attention with a document (100 tokens) and a question (20): compressed when the
// document is complete, from the statistics of the document's queries after the 4 sinks (the
// question's never enter them), then the question and the answer are appended.
TEST(ServiceKvCacheTest, ExpectedAttentionCompressesTheDocumentBeforeTheQuestion) {
  auto t = ::kvc::testing::StartTestServer(F32Pool(/*rope=*/true));
  kernels::ThreadPool threads(2);
  const ServicePolicy policy = ExpectedAttentionPolicy(8, 24);
  KVC_ASSERT_OK_AND_ASSIGN(
      auto service,
      ServiceKvCache::Create(t.client.get(), "", Geometry(kTheta), policy, false, &threads));
  service->ExpectPrompt(120);
  service->ExpectDocument(100);
  EXPECT_TRUE(service->CompressesAtDocumentEnd());
  Drive(*service, 120, 20, 3);  // a chunk ends at the document's end (prefill_split)
  const std::vector<QueryStats> expect = DriveStats(120, 20, 4, 100);
  const std::vector<QueryStats>& sent = service->query_stats();
  ASSERT_EQ(sent.size(), static_cast<size_t>(kLayers));
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(sent[l].count, 96);
    EXPECT_EQ(sent[l].mean, expect[l].mean);
    EXPECT_EQ(sent[l].covariance, expect[l].covariance);
  }
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, service->Info());
  EXPECT_EQ(info.storage, client::StorageFormat::kInt4G32);
  for (int64_t n : info.stored_tokens) EXPECT_EQ(n, 24 + 20 + 3);  // budget + question + answer
  EXPECT_EQ(info.visible_tokens, 123);
  // The sinks and the document's last `window` tokens stay.
  for (int l = 0; l < kLayers; ++l) {
    KVC_ASSERT_OK_AND_ASSIGN(LayerKv kv, service->Fetch(l));
    for (const HeadKv& h : kv.heads) {
      for (int32_t p : {0, 1, 2, 3, 92, 99, 100, 119, 122}) {
        EXPECT_TRUE(std::binary_search(h.positions.begin(), h.positions.end(), p)) << p;
      }
    }
  }
}

// The passkey harness's way (a local prefill, its statistics, LoadPrompt) leaves the service
// holding what prefilling through the service does.
TEST(ServiceKvCacheTest, ExpectedAttentionLoadedEqualsPrefilledThroughTheService) {
  auto t = ::kvc::testing::StartTestServer(F32Pool(/*rope=*/true));
  kernels::ThreadPool threads(2);
  const ServicePolicy policy = ExpectedAttentionPolicy(8, 24);
  KVC_ASSERT_OK_AND_ASSIGN(auto engine, ServiceKvCache::Create(t.client.get(), "", Geometry(kTheta),
                                                               policy, false, &threads));
  engine->ExpectPrompt(100);
  Drive(*engine, 100, 32, 0);
  LocalKvCache local(Geometry(kTheta), nullptr, &threads);
  Drive(local, 100, 32, 0);
  KVC_ASSERT_OK_AND_ASSIGN(auto loaded, ServiceKvCache::Create(t.client.get(), "", Geometry(kTheta),
                                                               policy, false, &threads));
  EXPECT_THAT(loaded->LoadPrompt(local, 100, {}, {}, 37),
              ::kvc::testing::StatusIs(absl::StatusCode::kFailedPrecondition, "UseQueryStats"));
  KVC_ASSERT_OK_AND_ASSIGN(loaded, ServiceKvCache::Create(t.client.get(), "", Geometry(kTheta),
                                                          policy, false, &threads));
  ASSERT_THAT(loaded->UseQueryStats(DriveStats(100, 32, 4, 100)), ::kvc::testing::IsOk());
  ASSERT_THAT(loaded->LoadPrompt(local, 100, {}, {}, /*chunk_tokens=*/37), ::kvc::testing::IsOk());
  for (int l = 0; l < kLayers; ++l) {
    KVC_ASSERT_OK_AND_ASSIGN(LayerKv a, engine->Fetch(l));
    KVC_ASSERT_OK_AND_ASSIGN(LayerKv b, loaded->Fetch(l));
    for (int h = 0; h < kHeads; ++h) {
      EXPECT_EQ(a.heads[h].positions, b.heads[h].positions) << "layer " << l << " head " << h;
      EXPECT_EQ(a.heads[h].positions.size(), 24u);
    }
  }
}

// ask --reuse: the first request publishes the document's blocks before compressing it; a
// later one attaches them (their queries never pass through its cache) and compresses with
// the first request's statistics, as soon as the attached tokens are committed.
TEST(ServiceKvCacheTest, ExpectedAttentionOnAnAttachedDocumentTakesGivenStatistics) {
  auto t = ::kvc::testing::StartTestServer(F32Pool(/*rope=*/true));
  kernels::ThreadPool threads(2);
  const ServicePolicy policy = ExpectedAttentionPolicy(8, 24);
  std::vector<int32_t> ids(80);
  for (int i = 0; i < 80; ++i) ids[static_cast<size_t>(i)] = 1000 + i;
  const client::Prefix prefix{"test-model", "", ids};
  KVC_ASSERT_OK_AND_ASSIGN(auto first, ServiceKvCache::Create(t.client.get(), "", Geometry(kTheta),
                                                              policy, false, &threads));
  first->ExpectPrompt(80);
  first->ExpectDocument(64);
  first->PublishAtPromptEnd(prefix);
  Drive(*first, 80, 16, 0);
  EXPECT_EQ(first->published().published_tokens, 64);  // the raw document, before compression
  ASSERT_EQ(first->query_stats().size(), static_cast<size_t>(kLayers));
  EXPECT_EQ(first->query_stats()[0].count, 60);

  for (bool give : {false, true}) {
    SCOPED_TRACE(give ? "statistics given" : "no statistics");
    client::Prefix wanted = prefix;
    wanted.token_ids.pop_back();
    KVC_ASSERT_OK_AND_ASSIGN(
        auto later, ServiceKvCache::Create(t.client.get(), "", Geometry(kTheta), policy, false,
                                           &threads, &wanted));
    ASSERT_EQ(later->attached_tokens(), 64);
    later->ExpectPrompt(80);
    later->ExpectDocument(64);
    if (!give) {
      EXPECT_THAT(later->CommitStep(64),
                  ::kvc::testing::StatusIs(absl::StatusCode::kFailedPrecondition, "prefix cache"));
      continue;
    }
    ASSERT_THAT(later->UseQueryStats(first->query_stats()), ::kvc::testing::IsOk());
    ASSERT_THAT(later->CommitStep(64), ::kvc::testing::IsOk());  // Generate's first step
    Drive(*later, 80, 16, 0, /*start=*/64);
    KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, later->Info());
    for (int64_t n : info.stored_tokens) EXPECT_EQ(n, 24 + 16);
    // The same document tokens survive as in the first request.
    for (int l = 0; l < kLayers; ++l) {
      KVC_ASSERT_OK_AND_ASSIGN(LayerKv a, first->Fetch(l));
      KVC_ASSERT_OK_AND_ASSIGN(LayerKv b, later->Fetch(l));
      for (int h = 0; h < kHeads; ++h) EXPECT_EQ(a.heads[h].positions, b.heads[h].positions);
    }
  }
}

// ask --reuse with a query-agnostic policy: the first request keeps its compressed document
// (a fork taken right after the compression, before the question); later requests fork it
// and start after the document, compressing nothing, and read the same document KV.
TEST(ServiceKvCacheTest, AKeptCompressedDocumentIsForkedByLaterRequests) {
  auto t = ::kvc::testing::StartTestServer(F32Pool(/*rope=*/true));
  kernels::ThreadPool threads(2);
  const ServicePolicy policy = ExpectedAttentionPolicy(8, 24);
  KVC_ASSERT_OK_AND_ASSIGN(auto first, ServiceKvCache::Create(t.client.get(), "", Geometry(kTheta),
                                                              policy, false, &threads));
  first->ExpectPrompt(80);
  first->ExpectDocument(64);
  first->KeepDocument();
  Drive(*first, 80, 16, 0);
  const std::string kept = first->kept_document();
  ASSERT_FALSE(kept.empty());
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo kept_info, t.client->GetSequence(kept));
  EXPECT_EQ(kept_info.visible_tokens, 64) << "the document, not the question";
  for (int64_t n : kept_info.stored_tokens) EXPECT_EQ(n, 24);

  KVC_ASSERT_OK_AND_ASSIGN(auto later, ServiceKvCache::Fork(t.client.get(), kept, Geometry(kTheta),
                                                            policy, false, &threads));
  EXPECT_EQ(later->forked_tokens(), 64);
  later->ExpectPrompt(80);
  Drive(*later, 80, 16, 0, /*start=*/64);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, later->Info());
  for (int64_t n : info.stored_tokens) EXPECT_EQ(n, 24 + 16) << "compressed once, not again";
  for (int l = 0; l < kLayers; ++l) {
    KVC_ASSERT_OK_AND_ASSIGN(LayerKv a, first->Fetch(l));
    KVC_ASSERT_OK_AND_ASSIGN(LayerKv b, later->Fetch(l));
    for (int h = 0; h < kHeads; ++h) EXPECT_EQ(a.heads[h].positions, b.heads[h].positions);
  }
  later.reset();
  first.reset();
  KVC_ASSERT_OK_AND_ASSIGN(kept_info, t.client->GetSequence(kept));
  EXPECT_EQ(kept_info.visible_tokens, 64) << "the kept document is the caller's to release";
  KVC_ASSERT_OK(t.client->Release(kept));
}

// The service rotates the statistics with the pool's RoPE: it must be the model's.
TEST(ServiceKvCacheTest, ExpectedAttentionRefusesAPoolWithAnotherRope) {
  const ServicePolicy policy = ExpectedAttentionPolicy(8, 24);
  auto plain = ::kvc::testing::StartTestServer(F32Pool(/*rope=*/false));
  EXPECT_THAT(
      ServiceKvCache::Create(plain.client.get(), "", Geometry(kTheta), policy, false, nullptr),
      ::kvc::testing::StatusIs(absl::StatusCode::kFailedPrecondition, "RoPE: none"));
  auto rope = ::kvc::testing::StartTestServer(F32Pool(/*rope=*/true));
  EXPECT_THAT(
      ServiceKvCache::Create(rope.client.get(), "", Geometry(2 * kTheta), policy, false, nullptr),
      ::kvc::testing::StatusIs(absl::StatusCode::kFailedPrecondition, "base 10000"));
  KVC_EXPECT_OK(
      ServiceKvCache::Create(rope.client.get(), "", Geometry(kTheta), policy, false, nullptr));
  // Policies that need no RoPE do not ask.
  KVC_EXPECT_OK(ServiceKvCache::Create(plain.client.get(), "", Geometry(), {}, false, nullptr));
}

TEST(ServiceKvCacheTest, RefusesAPoolOfAnotherShape) {
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions());
  EXPECT_THAT(ServiceKvCache::Create(t.client.get(), "", Geometry(), {}, false, nullptr),
              ::kvc::testing::StatusIs(absl::StatusCode::kFailedPrecondition, "is shaped"));
}

}  // namespace
}  // namespace kvc::worker

// The engine's KvCache conformance suite, run against the kvcached-backed cache.
#include "tests/worker/kv_cache_conformance.h"

namespace kvc::worker::testing {
namespace {

::kvc::testing::TestServer& ConformanceServer() {
  static ::kvc::testing::TestServer* server = [] {
    cachesvc::ServerOptions o;
    o.listen = "127.0.0.1:0";
    cachesvc::PoolOptions pool;
    pool.name = "conformance";
    pool.capacity_bytes = int64_t{64} << 20;
    pool.geometry.num_layers = 3;
    pool.geometry.num_kv_heads = 2;
    pool.geometry.num_query_heads = 6;
    pool.geometry.head_dim = 16;
    pool.geometry.dtype = kernels::DType::kF32;
    o.store.pools.push_back(pool);
    return new ::kvc::testing::TestServer(::kvc::testing::StartTestServer(o));
  }();
  return *server;
}

INSTANTIATE_TEST_SUITE_P(Kvcached, KvCacheConformanceTest,
                         ::testing::Values(KvCacheFactory{
                             "kvcached", [](const KvGeometry& g) -> std::unique_ptr<KvCache> {
                               auto store = ServiceKvCache::Create(ConformanceServer().client.get(),
                                                                   "", g, {}, false, nullptr);
                               return store.ok() ? std::move(*store) : nullptr;
                             }}));

}  // namespace
}  // namespace kvc::worker::testing
