// SnapKV's budget allocation through the store: ADAPTIVE (AdaKV) moves a layer's selections
// from a head whose attention is concentrated to one whose attention is spread, keeping the
// layer's total and each head's floor; PYRAMID gives lower layers more with the same average;
// bad values are refused with the field named.
#include <map>
#include <set>

#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/compression_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;
using Eviction = CompressionSpec::Eviction;

constexpr int kTokens = 256, kWindow = 8, kNeedle = 77;

// Keys: noise, plus a needle every head has at kNeedle. The query heads of kv head 0 point
// at the needle (concentrated attention); those of kv head 1 are zero (uniform attention).
struct Planted {
  Geometry g;
  std::vector<float> keys, needle, queries;
  Planted() {
    keys = Gaussian(static_cast<size_t>(kTokens) * g.heads * g.dim, 5, 0.05f);
    needle.assign(static_cast<size_t>(g.dim), 0.0f);
    needle[3] = 1.0f;
    for (int h = 0; h < g.heads; ++h)
      for (int e = 0; e < g.dim; ++e) keys[(kNeedle * g.heads + h) * g.dim + e] = needle[e];
    queries = QueriesAlong(needle, kWindow, g.qheads, 400.0f);  // logit 50: all mass
    const int group = g.qheads / g.heads;
    for (int t = 0; t < kWindow; ++t)
      for (int qh = group; qh < g.qheads; ++qh)  // kv head 1's query heads
        for (int e = 0; e < g.dim; ++e) queries[(t * g.qheads + qh) * g.dim + e] = 0.0f;
  }
  CompressParams Params(const std::string& id, const CompressionSpec& spec) const {
    CompressParams p;
    p.sequence_id = id;
    p.spec = spec;
    for (int l = 0; l < g.layers; ++l) {
      LayerQueries lq;
      lq.layer = l;
      lq.dtype = DType::kF32;
      lq.queries = Bytes(queries);
      for (int t = 0; t < kWindow; ++t) lq.positions.push_back(kTokens - kWindow + t);
      p.queries.push_back(lq);
    }
    return p;
  }
};

CompressionSpec Snap(int budget) {
  CompressionSpec s;
  s.eviction = Eviction::kSnapKv;
  s.window = kWindow;
  s.budget = budget;
  s.pooling_kernel = 1;
  return s;
}

TEST(BudgetAllocationTest, AdaptiveMovesSelectionsToTheDiffuseHeadKeepingTotalAndFloor) {
  const Planted planted;
  struct Case {
    int floor_percent;
    size_t concentrated;  // tokens kv head 0 keeps: window + floor (the needle is its best)
  };
  // Budget 40: 32 selected per head uniformly, 64 per layer.
  for (const Case& c : {Case{20, kWindow + 6}, Case{0, kWindow + 1}, Case{50, kWindow + 16}}) {
    SCOPED_TRACE(::testing::Message() << "floor " << c.floor_percent << "%");
    Fixture f(planted.g);
    KVC_ASSERT_OK(f.AppendAll(0, kTokens, &planted.keys));
    CompressionSpec spec = Snap(40);
    spec.adaptive = true;
    spec.head_floor_percent = c.floor_percent;
    KVC_ASSERT_OK(f.store->Compress(planted.Params(f.id, spec)));
    for (int l = 0; l < planted.g.layers; ++l) {
      const auto positions = f.Positions();
      const std::set<int32_t>& focused = positions.at({l, 0});
      const std::set<int32_t>& diffuse = positions.at({l, 1});
      EXPECT_EQ(focused.size(), c.concentrated) << "layer " << l;
      EXPECT_EQ(focused.size() + diffuse.size(), 2u * 40) << "layer " << l;
      EXPECT_TRUE(focused.count(kNeedle)) << "layer " << l;
      for (int t = kTokens - kWindow; t < kTokens; ++t) {
        EXPECT_TRUE(focused.count(t) && diffuse.count(t)) << "window token " << t;
      }
    }
  }
  // The same budget uniformly: 40 per head.
  Fixture f(planted.g);
  KVC_ASSERT_OK(f.AppendAll(0, kTokens, &planted.keys));
  KVC_ASSERT_OK(f.store->Compress(planted.Params(f.id, Snap(40))));
  for (const auto& [lh, positions] : f.Positions()) EXPECT_EQ(positions.size(), 40u);
}

TEST(BudgetAllocationTest, PyramidGivesLowerLayersMoreWithTheSameAverage) {
  const Planted planted;
  for (bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "adaptive" : "uniform");
    Fixture f(planted.g);
    KVC_ASSERT_OK(f.AppendAll(0, kTokens, &planted.keys));
    CompressionSpec spec = Snap(40);
    spec.pyramid_beta = 20;
    spec.adaptive = adaptive;
    KVC_ASSERT_OK(f.store->Compress(planted.Params(f.id, spec)));
    // 32 selected on average, beta 20: min = 32 / 20 = 1, max = 64 - 1 = 63; two layers.
    std::map<int, size_t> per_layer;
    for (const auto& [lh, positions] : f.Positions()) per_layer[lh.first] += positions.size();
    EXPECT_EQ(per_layer[0], 2u * (kWindow + 63));
    EXPECT_EQ(per_layer[1], 2u * (kWindow + 1));
    KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
    EXPECT_EQ(s.stored_token_heads, 2 * 2 * 40);  // the uniform total
  }
}

TEST(BudgetAllocationTest, OutOfRangeAllocationSettingsAreRefusedAndChangeNothing) {
  const Planted planted;
  Fixture f(planted.g);
  KVC_ASSERT_OK(f.AppendAll(0, kTokens, &planted.keys));
  CompressionSpec spec = Snap(40);
  spec.adaptive = true;
  spec.head_floor_percent = 101;
  EXPECT_THAT(f.store->Compress(planted.Params(f.id, spec)),
              StatusIs(absl::StatusCode::kInvalidArgument, "head_floor_percent is 101"));
  spec.head_floor_percent = 20;
  spec.pyramid_beta = -3;
  EXPECT_THAT(f.store->Compress(planted.Params(f.id, spec)),
              StatusIs(absl::StatusCode::kInvalidArgument, "pyramid_beta is -3"));
  for (const auto& [lh, positions] : f.Positions()) {
    EXPECT_EQ(positions.size(), static_cast<size_t>(kTokens));
  }
}

}  // namespace
}  // namespace kvc::cachesvc
