// Behaviour every KvCache implementation must show, as a value-parameterized GoogleTest suite.
// A new implementation (e.g. the kvcached-backed cache) instantiates it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(Service, KvCacheConformanceTest,
//       ::testing::Values(KvCacheFactory{"service", [](const KvGeometry& g) { ... }}));
//
// The checks use only the KvCache interface: append/attend against the scalar reference,
// causal visibility, validation without side effects, Fetch contents, layer independence.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/attention.h"
#include "worker/engine/kv_cache.h"

namespace kvc::worker::testing {

struct KvCacheFactory {
  std::string name;
  std::function<std::unique_ptr<KvCache>(const KvGeometry&)> make;
};

inline std::ostream& operator<<(std::ostream& os, const KvCacheFactory& f) { return os << f.name; }

class KvCacheConformanceTest : public ::testing::TestWithParam<KvCacheFactory> {
 protected:
  static constexpr KvGeometry kGeometry{3, 2, 6, 16, 10000.0f};

  std::vector<float> Random(size_t n) {
    std::normal_distribution<float> normal;
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng_);
    return v;
  }
  size_t Rows(size_t n) const { return n * kGeometry.num_kv_heads * kGeometry.head_dim; }
  size_t QueryRows(size_t n) const { return n * kGeometry.num_q_heads * kGeometry.head_dim; }

  std::mt19937 rng_{11};
};

TEST_P(KvCacheConformanceTest, AttendMatchesReferenceOverAppendedTokens) {
  SCOPED_TRACE("seed 11");
  auto kv = GetParam().make(kGeometry);
  std::vector<int32_t> all_pos;
  std::vector<float> all_k, all_v;
  for (int32_t chunk : {5, 1, 7}) {  // prefill-like, decode-like, prefill-like
    std::vector<int32_t> pos;
    pos.reserve(static_cast<size_t>(chunk));
    for (int32_t i = 0; i < chunk; ++i) pos.push_back(static_cast<int32_t>(all_pos.size()) + i);
    const auto k = Random(Rows(pos.size())), v = Random(Rows(pos.size()));
    for (int32_t l = 0; l < kGeometry.num_layers; ++l) ASSERT_TRUE(kv->Append(l, pos, k, v).ok());
    ASSERT_TRUE(kv->CommitStep(pos.back() + 1).ok());
    all_pos.insert(all_pos.end(), pos.begin(), pos.end());
    all_k.insert(all_k.end(), k.begin(), k.end());
    all_v.insert(all_v.end(), v.begin(), v.end());

    const auto q = Random(QueryRows(pos.size()));
    std::vector<float> out(q.size()), ref(q.size());
    ASSERT_TRUE(kv->Attend(1, q, pos, absl::MakeSpan(out)).ok());
    for (int32_t h = 0; h < kGeometry.num_kv_heads; ++h) {
      // Reference over the dense per-head rows of everything appended so far.
      std::vector<float> hk, hv;
      const size_t hd = kGeometry.head_dim;
      for (size_t t = 0; t < all_pos.size(); ++t) {
        const size_t off = (t * kGeometry.num_kv_heads + h) * hd;
        hk.insert(hk.end(), all_k.begin() + off, all_k.begin() + off + hd);
        hv.insert(hv.end(), all_v.begin() + off, all_v.begin() + off + hd);
      }
      HeadKvView view{all_pos.data(), hk.data(), hv.data(), static_cast<int64_t>(all_pos.size())};
      AttendReference(kGeometry, h, view, q, pos, absl::MakeSpan(ref));
    }
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-4) << "i=" << i;
  }
}

TEST_P(KvCacheConformanceTest, FetchReturnsAppendedRowsPerHead) {
  auto kv = GetParam().make(kGeometry);
  const std::vector<int32_t> pos = {0, 1, 2};
  const auto k = Random(Rows(3)), v = Random(Rows(3));
  for (int32_t l = 0; l < kGeometry.num_layers; ++l) ASSERT_TRUE(kv->Append(l, pos, k, v).ok());
  ASSERT_TRUE(kv->CommitStep(3).ok());
  auto layer = kv->Fetch(2);
  ASSERT_TRUE(layer.ok()) << layer.status();
  ASSERT_EQ(layer->heads.size(), static_cast<size_t>(kGeometry.num_kv_heads));
  const size_t hd = kGeometry.head_dim;
  for (int32_t h = 0; h < kGeometry.num_kv_heads; ++h) {
    EXPECT_EQ(layer->heads[h].positions, pos);
    for (size_t t = 0; t < 3; ++t) {
      for (size_t d = 0; d < hd; ++d) {
        const size_t src = (t * kGeometry.num_kv_heads + h) * hd + d;
        EXPECT_NEAR(layer->heads[h].keys[t * hd + d], k[src], 1e-6);
        EXPECT_NEAR(layer->heads[h].values[t * hd + d], v[src], 1e-6);
      }
    }
  }
  EXPECT_EQ(kv->StoredTokenSlots(), int64_t{3} * kGeometry.num_layers * kGeometry.num_kv_heads);
}

TEST_P(KvCacheConformanceTest, QueriesSeeOnlyEarlierPositions) {
  auto kv = GetParam().make(kGeometry);
  const std::vector<int32_t> pos = {10, 11};
  const auto k = Random(Rows(2)), v = Random(Rows(2));
  for (int32_t l = 0; l < kGeometry.num_layers; ++l) ASSERT_TRUE(kv->Append(l, pos, k, v).ok());
  const std::vector<int32_t> qpos = {9, 10};  // the first query precedes every stored key
  const auto q = Random(QueryRows(2));
  std::vector<float> out(q.size(), 1.0f);
  ASSERT_TRUE(kv->Attend(0, q, qpos, absl::MakeSpan(out)).ok());
  const size_t row = kGeometry.num_q_heads * kGeometry.head_dim;
  for (size_t i = 0; i < row; ++i) EXPECT_EQ(out[i], 0.0f);
  // The second query (position 10) sees exactly token 10: output = its value row.
  for (int32_t qh = 0; qh < kGeometry.num_q_heads; ++qh) {
    const int32_t h = qh / kGeometry.group_size();
    for (int32_t d = 0; d < kGeometry.head_dim; ++d) {
      EXPECT_NEAR(out[row + qh * kGeometry.head_dim + d], v[h * kGeometry.head_dim + d], 1e-5);
    }
  }
}

TEST_P(KvCacheConformanceTest, InvalidAppendsChangeNothing) {
  auto kv = GetParam().make(kGeometry);
  const std::vector<int32_t> pos = {0, 1};
  const auto k = Random(Rows(2)), v = Random(Rows(2));
  EXPECT_EQ(kv->Append(kGeometry.num_layers, pos, k, v).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->Append(0, pos, Random(5), v).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv->Append(0, pos, k, v).ok());
  const std::vector<int32_t> stale = {1, 2};
  EXPECT_EQ(kv->Append(0, stale, k, v).code(), absl::StatusCode::kFailedPrecondition);
  auto layer = kv->Fetch(0);
  ASSERT_TRUE(layer.ok());
  EXPECT_EQ(layer->heads[0].positions, pos);
  std::vector<float> out(QueryRows(1));
  EXPECT_EQ(kv->Attend(0, Random(3), std::vector<int32_t>{1}, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace kvc::worker::testing
