// LocalKvCache: validation, per-head retention (different token sets per kv head), policies,
// and Attend == Fetch + local attention.
#include "worker/engine/local_kv_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tests/worker/kv_cache_conformance.h"
#include "worker/engine/attention.h"
#include "worker/engine/ops.h"

namespace kvc::worker {
namespace {

const KvGeometry kGeom{2, 2, 4, 8};

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

absl::Status AppendRange(LocalKvCache& kv, int32_t layer, int32_t begin, int32_t end,
                         std::mt19937& rng) {
  std::vector<int32_t> pos;
  for (int32_t p = begin; p < end; ++p) pos.push_back(p);
  const size_t n = pos.size() * kGeom.num_kv_heads * kGeom.head_dim;
  return kv.Append(layer, pos, Random(n, rng), Random(n, rng));
}

TEST(LocalKvCacheTest, RejectsBadLayerShapeAndOrder) {
  std::mt19937 rng(1);
  LocalKvCache kv(kGeom, nullptr, /*pool=*/nullptr);
  EXPECT_EQ(AppendRange(kv, 2, 0, 4, rng).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> pos = {0, 1};
  EXPECT_EQ(kv.Append(0, pos, Random(3, rng), Random(3, rng)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(AppendRange(kv, 0, 0, 4, rng).ok());
  EXPECT_EQ(AppendRange(kv, 0, 3, 5, rng).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv.StoredTokenSlots(), 4 * kGeom.num_kv_heads);  // the failed append left nothing
}

TEST(LocalKvCacheTest, HeadsMayKeepDifferentTokens) {
  std::mt19937 rng(2);
  LocalKvCache kv(kGeom, nullptr, /*pool=*/nullptr);
  for (int32_t l = 0; l < kGeom.num_layers; ++l) ASSERT_TRUE(AppendRange(kv, l, 0, 10, rng).ok());
  const std::vector<int64_t> keep0 = {0, 3, 9}, keep1 = {1, 2, 4, 5};
  ASSERT_TRUE(kv.Retain(0, 0, keep0).ok());
  ASSERT_TRUE(kv.Retain(0, 1, keep1).ok());
  EXPECT_EQ(kv.Retain(0, 1, std::vector<int64_t>{2, 1}).code(), absl::StatusCode::kInvalidArgument);
  auto layer = kv.Fetch(0);
  ASSERT_TRUE(layer.ok());
  EXPECT_EQ(layer->heads[0].positions, (std::vector<int32_t>{0, 3, 9}));
  EXPECT_EQ(layer->heads[1].positions, (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(kv.StoredTokenSlots(), 3 + 4 + 2 * 10);

  // Attend over the retained sets equals the reference on the fetched rows.
  const std::vector<int32_t> qpos = {4, 10};
  const auto q = Random(qpos.size() * kGeom.num_q_heads * kGeom.head_dim, rng);
  std::vector<float> out(q.size()), ref(q.size());
  ASSERT_TRUE(kv.Attend(0, q, qpos, absl::MakeSpan(out)).ok());
  for (int32_t h = 0; h < kGeom.num_kv_heads; ++h) {
    const HeadKv& hk = layer->heads[h];
    HeadKvView v{hk.positions.data(), hk.keys.data(), hk.values.data(),
                 static_cast<int64_t>(hk.positions.size())};
    AttendReference(kGeom, h, v, q, qpos, absl::MakeSpan(ref));
  }
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 1e-5);
}

TEST(LocalKvCacheTest, SinkWindowPolicyKeepsSinksAndRecentTokens) {
  std::mt19937 rng(3);
  LocalKvCache kv(kGeom, MakeLocalSinkWindowPolicy(2, 3), /*pool=*/nullptr);
  for (int32_t l = 0; l < kGeom.num_layers; ++l) ASSERT_TRUE(AppendRange(kv, l, 0, 10, rng).ok());
  ASSERT_TRUE(kv.CommitStep(10).ok());
  auto layer = kv.Fetch(1);
  ASSERT_TRUE(layer.ok());
  EXPECT_EQ(layer->heads[1].positions, (std::vector<int32_t>{0, 1, 7, 8, 9}));
  EXPECT_EQ(kv.Describe(), "local sinks=2 window=3");
}

TEST(LocalKvCacheTest, ReRotationMovesSinkKeysExactly) {
  std::mt19937 rng(4);
  KvGeometry g = kGeom;
  g.rope_theta = 100000.0f;
  LocalKvCache kv(g, MakeLocalSinkWindowPolicy(1, 2, /*close_gaps=*/true), /*pool=*/nullptr);
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 6, 7};
  const size_t n = pos.size() * g.num_kv_heads * g.head_dim;
  const std::vector<float> raw = Random(n, rng), values = Random(n, rng);
  std::vector<float> keys = raw;
  ApplyRope(keys.data(), pos, g.num_kv_heads, g.head_dim, g.rope_theta);
  for (int32_t l = 0; l < g.num_layers; ++l) ASSERT_TRUE(kv.Append(l, pos, keys, values).ok());
  ASSERT_TRUE(kv.CommitStep(8).ok());
  auto layer = kv.Fetch(0);
  ASSERT_TRUE(layer.ok());
  // Sink (position 0) now sits right before the window {6, 7}, rotated as if it were at 5.
  EXPECT_EQ(layer->heads[1].positions, (std::vector<int32_t>{5, 6, 7}));
  std::vector<float> expect(raw.begin() + 1 * g.head_dim, raw.begin() + 2 * g.head_dim);
  const int32_t at5[1] = {5};
  ApplyRope(expect.data(), at5, 1, g.head_dim, g.rope_theta);
  for (int32_t d = 0; d < g.head_dim; ++d) EXPECT_NEAR(layer->heads[1].keys[d], expect[d], 1e-5);
  // Without rope_theta the cache cannot move keys.
  LocalKvCache no_theta(kGeom, MakeLocalSinkWindowPolicy(1, 2, /*close_gaps=*/true),
                        /*pool=*/nullptr);
  for (int32_t l = 0; l < g.num_layers; ++l)
    ASSERT_TRUE(no_theta.Append(l, pos, keys, values).ok());
  EXPECT_EQ(no_theta.CommitStep(8).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(LocalKvCacheTest, WindowPolicyKeepsOnlyRecentTokens) {
  auto policy = MakeLocalWindowPolicy(4);
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(policy->SelectKeep(0, 0, pos), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(policy->SelectKeep(0, 0, std::vector<int32_t>{7, 9}), (std::vector<int64_t>{0, 1}));
}

}  // namespace
}  // namespace kvc::worker

namespace kvc::worker::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Local, KvCacheConformanceTest,
                         ::testing::Values(KvCacheFactory{
                             "local_full", [](const KvGeometry& g) -> std::unique_ptr<KvCache> {
                               return std::make_unique<LocalKvCache>(g, nullptr, nullptr);
                             }}));

}  // namespace
}  // namespace kvc::worker::testing
