// Expected Attention's query statistics: queries the engine rotated with its RoPE (ApplyRope,
// rotate-half) go in; the mean and population covariance of the queries BEFORE RoPE come out,
// per (layer, query head), for the positions asked for only.
#include "worker/engine/query_stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "worker/engine/ops.h"

namespace kvc::worker {
namespace {

constexpr int32_t kLayers = 2, kQHeads = 3, kDim = 64;

KvGeometry Geometry(float theta = 100000.0f) {
  KvGeometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = 1;
  g.num_q_heads = kQHeads;
  g.head_dim = kDim;
  g.rope_theta = theta;
  return g;
}

// Pre-RoPE queries [n, kQHeads, kDim]: a per-(head, dim) offset plus correlated noise (x_i
// mixes its neighbour), so the covariance has off-diagonal structure.
std::vector<float> PreRope(size_t n, uint32_t seed, float offset) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> q(n * kQHeads * kDim);
  for (size_t t = 0; t < n; ++t) {
    for (int h = 0; h < kQHeads; ++h) {
      float prev = normal(rng);
      for (int i = 0; i < kDim; ++i) {
        const float z = normal(rng);
        q[(t * kQHeads + h) * kDim + i] =
            offset * static_cast<float>(1 + h) * std::sin(0.3f * static_cast<float>(i)) +
            (0.5f + 0.02f * static_cast<float>(i)) * (z + 0.6f * prev);
        prev = z;
      }
    }
  }
  return q;
}

// Direct mean and population covariance of rows [n, kQHeads, kDim] of `q`, in double.
void Direct(const std::vector<float>& q, const std::vector<size_t>& rows, std::vector<double>* mean,
            std::vector<double>* cov) {
  mean->assign(kQHeads * kDim, 0.0);
  cov->assign(kQHeads * kDim * kDim, 0.0);
  const double n = static_cast<double>(rows.size());
  for (size_t t : rows) {
    for (int j = 0; j < kQHeads * kDim; ++j) (*mean)[j] += q[t * kQHeads * kDim + j] / n;
  }
  for (size_t t : rows) {
    for (int h = 0; h < kQHeads; ++h) {
      const float* x = &q[(t * kQHeads + h) * kDim];
      const double* m = &(*mean)[h * kDim];
      for (int i = 0; i < kDim; ++i) {
        for (int j = 0; j < kDim; ++j) {
          (*cov)[(h * kDim + i) * kDim + j] += (x[i] - m[i]) * (x[j] - m[j]) / n;
        }
      }
    }
  }
}

// Largest |a - b| relative to the largest |b|.
double RelError(const std::vector<float>& a, const std::vector<double>& b) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return err / scale;
}

TEST(QueryStatsTest, UndoesTheEnginesRopeAndMatchesTheDirectStatistics) {
  const KvGeometry g = Geometry();
  // A prompt of 300 tokens from position 0, in chunks of 64 (the last short); statistics over
  // [4, 250): no sinks, no "question".
  constexpr int32_t kTokens = 300, kBegin = 4, kEnd = 250;
  QueryStatsAccumulator acc(g);
  std::vector<std::vector<float>> pre(kLayers);
  for (int32_t l = 0; l < kLayers; ++l) pre[l] = PreRope(kTokens, 11 + l, 2.0f + l);
  for (int32_t start = 0; start < kTokens; start += 64) {
    const int32_t n = std::min(64, kTokens - start);
    std::vector<int32_t> positions(n);
    for (int32_t i = 0; i < n; ++i) positions[i] = start + i;
    for (int32_t l = 0; l < kLayers; ++l) {
      // What the engine hands its cache: the queries rotated at their positions.
      std::vector<float> q(pre[l].begin() + static_cast<ptrdiff_t>(start) * kQHeads * kDim,
                           pre[l].begin() + static_cast<ptrdiff_t>(start + n) * kQHeads * kDim);
      ApplyRope(q.data(), positions, kQHeads, kDim, g.rope_theta);
      ASSERT_TRUE(acc.Add(l, q, positions, kBegin, kEnd).ok());
    }
  }
  std::vector<size_t> rows;
  for (size_t t = kBegin; t < kEnd; ++t) rows.push_back(t);
  const std::vector<QueryStats> stats = acc.Finish();
  ASSERT_EQ(stats.size(), static_cast<size_t>(kLayers));
  for (int32_t l = 0; l < kLayers; ++l) {
    SCOPED_TRACE(l);
    EXPECT_EQ(acc.count(l), kEnd - kBegin);
    EXPECT_EQ(stats[l].count, kEnd - kBegin);
    std::vector<double> mean, cov;
    Direct(pre[l], rows, &mean, &cov);
    ASSERT_EQ(stats[l].mean.size(), mean.size());
    ASSERT_EQ(stats[l].covariance.size(), cov.size());
    EXPECT_LT(RelError(stats[l].mean, mean), 1e-5);
    EXPECT_LT(RelError(stats[l].covariance, cov), 1e-5);
    // Symmetric, as a covariance is.
    for (int i = 0; i < kDim; ++i) {
      for (int j = 0; j < kDim; ++j) {
        ASSERT_EQ(stats[l].covariance[i * kDim + j], stats[l].covariance[j * kDim + i]);
      }
    }
  }
}

TEST(QueryStatsTest, OneQueryAtManyPositionsHasItsOwnMeanAndNoSpread) {
  // The same pre-RoPE query at scattered (large) positions: rotated differently each time,
  // un-rotated to the same vector, so the covariance is ~0 and the mean is the query.
  const KvGeometry g = Geometry(10000.0f);
  const std::vector<float> x = PreRope(1, 3, 1.5f);
  const std::vector<int32_t> positions = {7, 100, 4095, 65536, 1000003};
  std::vector<float> q;
  for (size_t i = 0; i < positions.size(); ++i) q.insert(q.end(), x.begin(), x.end());
  ApplyRope(q.data(), positions, kQHeads, kDim, g.rope_theta);
  QueryStatsAccumulator acc(g);
  ASSERT_TRUE(acc.Add(1, q, positions, 0, 2000000).ok());
  const QueryStats s = acc.Finish()[1];
  EXPECT_EQ(s.count, 5);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(s.mean[i], x[i], 1e-5 * (1 + std::abs(x[i])));
  for (float c : s.covariance) ASSERT_NEAR(c, 0.0f, 1e-9);
  // Layer 0 saw nothing: zeros.
  const QueryStats none = acc.Finish()[0];
  EXPECT_EQ(none.count, 0);
  for (float v : none.mean) ASSERT_EQ(v, 0.0f);
  for (float v : none.covariance) ASSERT_EQ(v, 0.0f);
}

TEST(QueryStatsTest, LargeMeansKeepAnAccurateCovariance) {
  // Queries with a mean 1000x their spread (massive activations): the sums are shifted by the
  // first query, so E[xx^T] - mm^T does not cancel away the covariance.
  const KvGeometry g = Geometry();
  constexpr size_t kN = 200;
  std::vector<float> pre = PreRope(kN, 21, 0.0f);
  for (size_t j = 0; j < pre.size(); ++j) pre[j] += 1000.0f;
  std::vector<int32_t> positions(kN);
  for (size_t t = 0; t < kN; ++t) positions[t] = static_cast<int32_t>(t);
  std::vector<float> q = pre;
  ApplyRope(q.data(), positions, kQHeads, kDim, g.rope_theta);
  QueryStatsAccumulator acc(g);
  ASSERT_TRUE(acc.Add(0, q, positions, 0, kN).ok());
  std::vector<size_t> rows(kN);
  for (size_t t = 0; t < kN; ++t) rows[t] = t;
  std::vector<double> mean, cov;
  Direct(pre, rows, &mean, &cov);
  const QueryStats s = acc.Finish()[0];
  EXPECT_LT(RelError(s.mean, mean), 1e-6);
  // The float round trip through RoPE moves each value by ~1000 * 2^-24: small against the
  // covariance's unit scale.
  EXPECT_LT(RelError(s.covariance, cov), 2e-3);
}

TEST(QueryStatsTest, MeanOnlyAndErrors) {
  const KvGeometry g = Geometry();
  QueryStatsAccumulator mean_only(g, /*covariance=*/false);
  const std::vector<float> q = PreRope(2, 5, 1.0f);
  const std::vector<int32_t> positions = {10, 11};
  ASSERT_TRUE(mean_only.Add(0, q, positions, 0, 100).ok());
  EXPECT_TRUE(mean_only.Finish()[0].covariance.empty());
  EXPECT_EQ(mean_only.Finish()[0].mean.size(), static_cast<size_t>(kQHeads * kDim));

  QueryStatsAccumulator acc(g);
  EXPECT_EQ(acc.Add(2, q, positions, 0, 100).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Add(0, absl::MakeConstSpan(q).subspan(1), positions, 0, 100).code(),
            absl::StatusCode::kInvalidArgument);
  QueryStatsAccumulator no_rope(Geometry(0.0f));
  EXPECT_EQ(no_rope.Add(0, q, positions, 0, 100).code(), absl::StatusCode::kFailedPrecondition);
  // Outside [begin, end): nothing counted.
  ASSERT_TRUE(acc.Add(0, q, positions, 12, 100).ok());
  ASSERT_TRUE(acc.Add(0, q, positions, 0, 10).ok());
  EXPECT_EQ(acc.count(0), 0);
  ASSERT_TRUE(acc.Add(0, q, positions, 11, 12).ok());
  EXPECT_EQ(acc.count(0), 1);
}

}  // namespace
}  // namespace kvc::worker
