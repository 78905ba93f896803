// The engine's two KV caches agree: ServiceKvCache (KV cache in a real kvcached over gRPC)
// gives the same attention as the local in-memory cache, on the decode path (the service's
// Attend) and the prefill path (Fetch + local attention), and SnapKV at the end of the
// prompt shrinks what the service holds.
#include "worker/service/service_kv_cache.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"
#include "worker/engine/local_kv_cache.h"

namespace kvc::worker {
namespace {

constexpr int kLayers = 2, kHeads = 2, kQHeads = 4, kDim = 64;

cachesvc::ServerOptions F32Pool() {
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

KvGeometry Geometry() {
  KvGeometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kHeads;
  g.num_q_heads = kQHeads;
  g.head_dim = kDim;
  return g;
}

// Runs a prefill of `prompt` tokens in chunks, then `decode` single-token steps, on `kv`,
// returning every attention output in order.
std::vector<float> Drive(KvCache& kv, int prompt, int chunk, int decode) {
  std::vector<float> outputs;
  int32_t pos = 0;
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
  for (int done = 0; done < prompt; done += chunk) step(std::min(chunk, prompt - done));
  for (int i = 0; i < decode; ++i) step(1);
  return outputs;
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
