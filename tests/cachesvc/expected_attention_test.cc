// Expected Attention through the store: the averaged RoPE rotation is the mean of the explicit
// rotations; a Compress keeps exactly the sinks, the window and the tokens a double-precision
// reference of kvpress's score ranks first (one tier, and across a quantized tier plus a raw
// residual); every malformed request is refused with the field named and changes nothing.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "cachesvc/core/plan/query_model.h"
#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "kvc/kernels/rope.h"
#include "tests/cachesvc/compression_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;

constexpr int kTokens = 200;

// The explicit average of R(p) over [first, first + count) as a dense matrix, built by rotating
// the basis vectors with the kernels' RoPE (the engine's rotation).
std::vector<double> ExplicitAverage(const RopeParams& rope, int d, int64_t first, int count) {
  kernels::RopeConfig c;
  c.theta = static_cast<float>(rope.theta);
  c.rotary_dim = rope.rotary_dim;
  c.style = rope.style;
  std::vector<double> r(static_cast<size_t>(d) * d, 0.0);
  for (int k = 0; k < count; ++k) {
    for (int j = 0; j < d; ++j) {
      std::vector<float> e(static_cast<size_t>(d), 0.0f);
      e[static_cast<size_t>(j)] = 1.0f;
      kernels::RopeRotate(c, d, static_cast<int32_t>(first + k), e.data());
      for (int i = 0; i < d; ++i) r[static_cast<size_t>(i) * d + j] += e[i] / count;
    }
  }
  return r;
}

TEST(ExpectedAttentionTest, AveragedRotationIsTheMeanOfTheExplicitRotations) {
  const int d = 32, heads = 3;
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptJ}) {
    for (int rotary : {0, 16}) {
      SCOPED_TRACE(::testing::Message()
                   << "style " << static_cast<int>(style) << " rotary " << rotary);
      RopeParams rope;
      rope.enabled = true;
      rope.theta = 10000;
      rope.rotary_dim = rotary;
      rope.style = style;
      const std::vector<float> mean = Gaussian(static_cast<size_t>(heads) * d, 1);
      const std::vector<float> cov = Gaussian(static_cast<size_t>(heads) * d * d, 2);
      const QueryModel m = AverageRope(rope, d, heads, 1000, 37, mean, cov);
      const std::vector<double> r = ExplicitAverage(rope, d, 1000, 37);
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < d; ++i) {
          double want = 0;
          for (int j = 0; j < d; ++j) want += r[i * d + j] * mean[h * d + j];
          ASSERT_NEAR(m.mean[h * d + i], want, 1e-4) << "head " << h << " dim " << i;
          for (int j = 0; j < d; ++j) {
            double rc = 0;  // (R cov R^T)[i][j]
            for (int a = 0; a < d; ++a)
              for (int b = 0; b < d; ++b)
                rc += r[i * d + a] * cov[(h * d + a) * d + b] * r[j * d + b];
            ASSERT_NEAR(m.cov[(h * d + i) * d + j], rc, 1e-4) << "head " << h;
          }
        }
      }
      // Past the rotary dims nothing moves.
      if (rotary > 0) {
        EXPECT_EQ(m.mean[d - 1], mean[d - 1]);
      }
    }
  }
}

// A query model per layer: mean along a few directions, covariance A A^T / d (positive
// semi-definite, as a real one).
struct Stats {
  std::vector<std::vector<float>> mean, cov;  // [layer]
  Stats(const Geometry& g, bool with_cov) {
    for (int l = 0; l < g.layers; ++l) {
      mean.push_back(Gaussian(static_cast<size_t>(g.qheads) * g.dim, 40 + l, 2.0f));
      if (!with_cov) {
        cov.emplace_back();
        continue;
      }
      const std::vector<float> a =
          Gaussian(static_cast<size_t>(g.qheads) * g.dim * g.dim, 50 + l, 0.5f);
      std::vector<float> c(a.size(), 0.0f);
      const size_t d = static_cast<size_t>(g.dim);
      for (size_t h = 0; h < static_cast<size_t>(g.qheads); ++h)
        for (size_t i = 0; i < d; ++i)
          for (size_t j = 0; j < d; ++j) {
            double s = 0;
            for (size_t k = 0; k < d; ++k)
              s += double{a[(h * d + i) * d + k]} * a[(h * d + j) * d + k];
            c[(h * d + i) * d + j] = static_cast<float>(s / d);
          }
      cov.push_back(std::move(c));
    }
  }
  CompressParams Params(const std::string& id, const CompressionSpec& spec) const {
    CompressParams p;
    p.sequence_id = id;
    p.spec = spec;
    for (size_t l = 0; l < mean.size(); ++l) {
      p.query_stats.push_back({static_cast<int64_t>(l), mean[l], cov[l]});
    }
    return p;
  }
};

CompressionSpec Expected(int sinks, int window, int budget) {
  CompressionSpec s;
  s.eviction = Eviction::kExpectedAttention;
  s.sinks = sinks;
  s.window = window;
  s.budget = budget;
  return s;
}

// kvpress's score in double over what a head stores (f32 as fetched): softmax over the
// non-sink tokens of k.mean'/sqrt(d) + k^T cov' k / (2d) per query head, averaged over the
// group, times ||v||; then the sinks, the window and the best of the rest.
std::set<int32_t> ReferenceKeep(const Fixture::Head& h, const QueryModel& m, int kv_head, int group,
                                int dim, const CompressionSpec& spec) {
  const size_t n = h.pos.size(), d = static_cast<size_t>(dim);
  std::vector<double> score(n, 0.0);
  for (int g = 0; g < group; ++g) {
    const size_t qh = static_cast<size_t>(kv_head * group + g);
    std::vector<double> logit(n, -INFINITY);
    double mx = -INFINITY;
    for (size_t t = 0; t < n; ++t) {
      if (h.pos[t] < spec.sinks) continue;
      const float* k = h.k.data() + t * d;
      double lin = 0, quad = 0;
      for (size_t i = 0; i < d; ++i) {
        lin += double{k[i]} * m.mean[qh * d + i];
        if (m.cov.empty()) continue;
        for (size_t j = 0; j < d; ++j) quad += double{k[i]} * m.cov[(qh * d + i) * d + j] * k[j];
      }
      logit[t] = lin / std::sqrt(double(dim)) + quad / (2.0 * dim);
      mx = std::max(mx, logit[t]);
    }
    double z = 0;
    for (size_t t = 0; t < n; ++t)
      if (h.pos[t] >= spec.sinks) z += std::exp(logit[t] - mx);
    for (size_t t = 0; t < n; ++t)
      if (h.pos[t] >= spec.sinks) score[t] += std::exp(logit[t] - mx) / z / group;
  }
  if (spec.value_norm) {
    for (size_t t = 0; t < n; ++t) {
      double v2 = 0;
      for (size_t i = 0; i < d; ++i) v2 += double{h.v[t * d + i]} * h.v[t * d + i];
      score[t] *= std::sqrt(v2);
    }
  }
  std::set<int32_t> keep;
  std::vector<size_t> rest;
  for (size_t t = 0; t < n; ++t) {
    if (h.pos[t] < spec.sinks || t + static_cast<size_t>(spec.window) >= n) {
      keep.insert(h.pos[t]);
    } else {
      rest.push_back(t);
    }
  }
  std::sort(rest.begin(), rest.end(), [&](size_t a, size_t b) { return score[a] > score[b]; });
  const size_t selected = static_cast<size_t>(spec.budget - spec.sinks - spec.window);
  for (size_t i = 0; i < std::min(selected, rest.size()); ++i) keep.insert(h.pos[rest[i]]);
  return keep;
}

void ExpectReferenceSelection(Fixture& f, const Stats& stats, const CompressionSpec& spec) {
  const Geometry& g = f.geom;
  std::map<std::pair<int, int>, std::set<int32_t>> want;
  for (int l = 0; l < g.layers; ++l) {
    KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
    RopeParams rope;  // as Roped() configures the pool
    rope.enabled = true;
    rope.theta = g.rope_theta;
    const QueryModel m = AverageRope(rope, g.dim, g.qheads, s.layer_tokens[l],
                                     spec.future_positions, stats.mean[l], stats.cov[l]);
    for (int h = 0; h < g.heads; ++h) {
      want[{l, h}] = ReferenceKeep(f.Fetched(l, h), m, h, g.qheads / g.heads, g.dim, spec);
    }
  }
  KVC_ASSERT_OK(f.store->Compress(stats.Params(f.id, spec)));
  const auto got = f.Positions();
  for (const auto& [lh, positions] : want) {
    EXPECT_EQ(got.at(lh), positions) << "layer " << lh.first << " kv head " << lh.second;
    EXPECT_EQ(positions.size(), static_cast<size_t>(spec.budget));
  }
}

Geometry Roped() {
  Geometry g;
  g.rope_theta = 10000;
  return g;
}

TEST(ExpectedAttentionTest, KeepsSinksWindowAndTheTokensTheReferenceRanksFirst) {
  for (bool with_cov : {true, false}) {
    for (bool value_norm : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "covariance " << with_cov << " vnorm " << value_norm);
      Fixture f(Roped());
      KVC_ASSERT_OK(f.AppendAll(0, kTokens));
      const Stats stats(f.geom, with_cov);
      CompressionSpec spec = Expected(4, 16, 60);
      spec.value_norm = value_norm;
      ExpectReferenceSelection(f, stats, spec);
    }
  }
}

TEST(ExpectedAttentionTest, ScoresAcrossAQuantizedTierAndARawResidual) {
  CompressionSpec policy;
  policy.storage = StorageFormat::kInt8;
  policy.storage_set = true;
  policy.residual_tokens = 16;
  Fixture f(Roped(), policy);
  KVC_ASSERT_OK(f.AppendAll(0, kTokens));
  const Stats stats(f.geom, /*with_cov=*/true);
  // The reference scores the dequantized keys Fetch returns: the kernel reads the same INT8.
  ExpectReferenceSelection(f, stats, Expected(4, 16, 48));
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
  EXPECT_EQ(s.stored_token_heads, f.geom.layers * f.geom.heads * 48);
}

TEST(ExpectedAttentionTest, AdaptiveKeepsTheLayerTotal) {
  Fixture f(Roped());
  KVC_ASSERT_OK(f.AppendAll(0, kTokens));
  const Stats stats(f.geom, /*with_cov=*/true);
  CompressionSpec spec = Expected(4, 16, 60);
  spec.adaptive = true;
  KVC_ASSERT_OK(f.store->Compress(stats.Params(f.id, spec)));
  std::map<int, size_t> per_layer;
  for (const auto& [lh, positions] : f.Positions()) {
    per_layer[lh.first] += positions.size();
    for (int32_t p : {0, 1, 2, 3, kTokens - 16, kTokens - 1}) EXPECT_TRUE(positions.count(p)) << p;
  }
  for (const auto& [layer, n] : per_layer) EXPECT_EQ(n, 2u * 60) << "layer " << layer;
}

TEST(ExpectedAttentionTest, MalformedRequestsAreRefusedAndChangeNothing) {
  Fixture f(Roped());
  KVC_ASSERT_OK(f.AppendAll(0, kTokens));
  const Stats stats(f.geom, /*with_cov=*/true);
  const CompressionSpec spec = Expected(4, 16, 60);
  auto refused = [&](const CompressParams& p, absl::StatusCode code, const std::string& says) {
    const absl::Status s = f.store->Compress(p).status();
    EXPECT_THAT(s, StatusIs(code)) << says;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  };
  CompressParams p = stats.Params(f.id, spec);
  p.query_stats.pop_back();
  refused(p, absl::StatusCode::kInvalidArgument, "query_stats for layer 1 are missing");
  p = stats.Params(f.id, spec);
  p.query_stats = {};
  refused(p, absl::StatusCode::kInvalidArgument, "expected_attention needs query_stats");
  p = stats.Params(f.id, spec);
  p.query_stats[1].layer = 0;
  refused(p, absl::StatusCode::kInvalidArgument, "sent twice");
  p = stats.Params(f.id, spec);
  p.query_stats[0].mean = p.query_stats[0].mean.subspan(1);
  refused(p, absl::StatusCode::kInvalidArgument, "have a mean of 255 floats; expected 4");
  p = stats.Params(f.id, spec);
  p.query_stats[1].covariance = {};
  refused(p, absl::StatusCode::kInvalidArgument, "on every layer, or none");
  std::vector<float> nan_mean = stats.mean[0];
  nan_mean[7] = NAN;
  p = stats.Params(f.id, spec);
  p.query_stats[0].mean = nan_mean;
  refused(p, absl::StatusCode::kInvalidArgument, "non-finite");
  p = stats.Params(f.id, spec);
  const std::vector<float> q(static_cast<size_t>(f.geom.qheads) * f.geom.dim, 1.0f);
  p.queries.push_back({0, DType::kF32, Bytes(q), {kTokens - 1}});
  refused(p, absl::StatusCode::kInvalidArgument, "send query_stats only");
  p = stats.Params(f.id, Expected(4, 16, 20));
  refused(p, absl::StatusCode::kInvalidArgument, "larger than sinks + window (20)");
  CompressionSpec far = spec;
  far.future_positions = 0;
  refused(stats.Params(f.id, far), absl::StatusCode::kInvalidArgument, "future_positions is 0");
  CompressionSpec snap;
  snap.eviction = Eviction::kStreamingLlm;
  snap.sinks = 4;
  snap.window = 32;
  refused(stats.Params(f.id, snap), absl::StatusCode::kInvalidArgument,
          "query_stats were sent but streaming_llm does not use them");
  // Nothing was evicted by any of them.
  for (const auto& [lh, positions] : f.Positions()) EXPECT_EQ(positions.size(), size_t{kTokens});

  // Without the pool's RoPE settings the statistics cannot be rotated.
  Fixture plain;
  KVC_ASSERT_OK(plain.AppendAll(0, kTokens));
  const absl::Status s = plain.store->Compress(stats.Params(plain.id, spec)).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("RoPE"), std::string::npos) << s.message();

  // Nor can it run on appends: it needs the statistics.
  CreateSequenceParams c;
  c.policy = spec;
  EXPECT_THAT(f.store->CreateSequence(c).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvc::cachesvc
