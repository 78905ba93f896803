// Policy semantics on synthetic KV with planted structure: StreamingLLM keeps the sinks and
// the last window, SnapKV keeps a needle the observation queries attend to, H2O keeps the
// heavy hitters, Attend equals dense attention over exactly what is kept, low-bit formats
// store and return what they should, a refused spec changes nothing, and memory comes back.
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/compression_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

TEST(CompressionTest, StreamingLlmCompressKeepsExactlySinksAndWindow) {
  Fixture f;
  KVC_ASSERT_OK(f.AppendAll(0, 300));
  CompressParams p;
  p.sequence_id = f.id;
  p.spec = Streaming(4, 100);
  KVC_ASSERT_OK_AND_ASSIGN(CompressResult r, f.store->Compress(p));
  std::set<int32_t> expected;
  for (int i = 0; i < 4; ++i) expected.insert(i);
  for (int i = 200; i < 300; ++i) expected.insert(i);
  for (const auto& [lh, positions] : f.Positions()) EXPECT_EQ(positions, expected);
  EXPECT_EQ(r.layers[0].token_heads_before, 300 * f.geom.heads);
  EXPECT_EQ(r.layers[0].token_heads_after, 104 * f.geom.heads);
  EXPECT_LT(r.bytes_after, r.bytes_before);
  // Logical length still counts every appended token.
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
  EXPECT_EQ(s.visible_tokens, 300);
  EXPECT_EQ(s.stored_token_heads, 104 * f.geom.heads * f.geom.layers);
}

TEST(CompressionTest, AutomaticStreamingLlmRunsAMillionTokensInConstantMemory) {
  Geometry g;
  g.layers = 1;
  g.heads = 1;
  g.qheads = 1;
  g.dim = 16;
  Fixture f(g, Streaming(4, 252));
  constexpr int64_t kChunk = 4096, kTotal = int64_t{1} << 20;
  const std::vector<float> keys = Gaussian(kChunk * g.dim, 1);
  int64_t peak = 0, after_first = 0;
  for (int64_t start = 0; start < kTotal; start += kChunk) {
    KVC_ASSERT_OK(f.AppendAll(start, kChunk, &keys));
    KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, f.store->stats().GetPoolStats("c"));
    if (start == 0) after_first = stats.used_bytes;
    peak = std::max(peak, stats.used_bytes);
  }
  EXPECT_EQ(peak, after_first);  // not one byte more after a million tokens
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
  EXPECT_EQ(s.visible_tokens, kTotal);
  EXPECT_LE(s.stored_token_heads, 4 + 252 + g.block);
  const auto positions = f.Positions().at({0, 0});
  for (int32_t p = 0; p < 4; ++p) EXPECT_TRUE(positions.count(p)) << p;
  for (int32_t p = kTotal - 252; p < kTotal; ++p) ASSERT_TRUE(positions.count(p)) << p;
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, f.store->stats().GetPoolStats("c"));
  ASSERT_GE(stats.evicted_token_heads.size(), 2u);
  EXPECT_EQ(stats.evicted_token_heads[1].first, "streaming_llm");
  EXPECT_EQ(stats.evicted_token_heads[1].second, kTotal - s.stored_token_heads);
}

TEST(CompressionTest, SnapKvKeepsTheNeedleAtEveryBudgetAboveTheWindow) {
  Geometry g;
  constexpr int kTokens = 256, kWindow = 8, kNeedle = 77;
  // Keys: small noise; the needle's key is a unit direction the queries point at.
  std::vector<float> keys = Gaussian(kTokens * g.heads * g.dim, 5, 0.05f);
  std::vector<float> needle(g.dim, 0.0f);
  needle[3] = 1.0f;
  for (int h = 0; h < g.heads; ++h)
    for (int e = 0; e < g.dim; ++e) keys[(kNeedle * g.heads + h) * g.dim + e] = needle[e];
  // Without pooling the needle alone has the top score: it survives every budget above the
  // window. Max pooling (kernel 7) gives its 3 neighbours on each side the same pooled score
  // (that is its purpose: keep the context around a hit), and ties go to the lowest
  // position, so the needle is 4th of 7 equals: it survives every budget >= window + 4.
  struct Case {
    int pooling_kernel, budget;
  };
  std::vector<Case> cases;
  for (int budget : {kWindow + 1, kWindow + 2, 16, 64, 200}) cases.push_back({1, budget});
  for (int budget : {kWindow + 4, kWindow + 5, 16, 64, 200}) cases.push_back({7, budget});
  for (const Case& c : cases) {
    const int budget = c.budget;
    SCOPED_TRACE(::testing::Message() << "budget " << budget << " pooling " << c.pooling_kernel);
    Fixture f(g);
    KVC_ASSERT_OK(f.AppendAll(0, kTokens, &keys));
    const std::vector<float> q = QueriesAlong(needle, kWindow, g.qheads, 40.0f);
    CompressParams p;
    p.sequence_id = f.id;
    p.spec.eviction = Eviction::kSnapKv;
    p.spec.window = kWindow;
    p.spec.budget = budget;
    p.spec.pooling_kernel = c.pooling_kernel;
    for (int l = 0; l < g.layers; ++l) {
      LayerQueries lq;
      lq.layer = l;
      lq.dtype = DType::kF32;
      lq.queries = Bytes(q);
      for (int t = 0; t < kWindow; ++t) lq.positions.push_back(kTokens - kWindow + t);
      p.queries.push_back(lq);
    }
    KVC_ASSERT_OK(f.store->Compress(p));
    for (const auto& [lh, positions] : f.Positions()) {
      EXPECT_EQ(positions.size(), static_cast<size_t>(budget));
      EXPECT_TRUE(positions.count(kNeedle)) << "layer " << lh.first << " head " << lh.second;
      for (int t = kTokens - kWindow; t < kTokens; ++t) EXPECT_TRUE(positions.count(t));
    }
  }
}

class AttendAfterCompressTest : public ::testing::TestWithParam<StorageFormat> {};

TEST_P(AttendAfterCompressTest, AttendEqualsDenseAttentionOverWhatIsKept) {
  Geometry g;
  Fixture f(g);
  KVC_ASSERT_OK(f.AppendAll(0, 200));
  CompressParams p;
  p.sequence_id = f.id;
  p.spec = Streaming(4, 60);
  p.spec.storage = GetParam();
  p.spec.storage_set = true;
  KVC_ASSERT_OK(f.store->Compress(p));
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
  EXPECT_EQ(s.storage, GetParam());
  const std::vector<float> q = Gaussian(g.qheads * g.dim, 99);
  for (int l = 0; l < g.layers; ++l) {
    AttendParams a;
    a.sequence_id = f.id;
    a.layer = l;
    a.dtype = DType::kF32;
    a.queries = Bytes(q);
    a.positions = {200};
    KVC_ASSERT_OK_AND_ASSIGN(AttendResult r, f.store->Attend(a));
    const float* out = reinterpret_cast<const float*>(r.output.data());
    const int group = g.qheads / g.heads;
    for (int qh = 0; qh < g.qheads; ++qh) {
      // The reference reads back exactly what is stored (dequantized), so the comparison
      // checks the fused kernel, not the format's error.
      const Fixture::Head head = f.Fetched(l, qh / group);
      ASSERT_EQ(head.pos.size(), 64u);
      const std::vector<float> qv(q.begin() + qh * g.dim, q.begin() + (qh + 1) * g.dim);
      const std::vector<double> ref = Attention(qv, head.k, head.v, g.dim);
      for (int e = 0; e < g.dim; ++e) {
        EXPECT_NEAR(out[qh * g.dim + e], ref[e], 1e-4) << "layer " << l << " qhead " << qh;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, AttendAfterCompressTest,
                         ::testing::Values(StorageFormat::kF32, StorageFormat::kF16,
                                           StorageFormat::kBF16, StorageFormat::kFp8E4M3,
                                           StorageFormat::kInt8, StorageFormat::kInt4G32,
                                           StorageFormat::kInt4G64, StorageFormat::kNvfp4),
                         [](const auto& info) {
                           return std::string(kernels::StorageFormatName(info.param));
                         });

TEST(CompressionTest, H2oKeepsTheHeavyHittersAttendAccumulated) {
  Geometry g;
  g.layers = 1;
  Fixture f(g);
  constexpr int kTokens = 100;
  std::vector<float> keys = Gaussian(kTokens * g.heads * g.dim, 3, 0.05f);
  std::vector<float> dir(g.dim, 0.0f);
  dir[5] = 1.0f;
  const std::set<int32_t> heavy = {7, 31, 64};
  for (int32_t t : heavy)
    for (int h = 0; h < g.heads; ++h)
      for (int e = 0; e < g.dim; ++e) keys[(t * g.heads + h) * g.dim + e] = dir[e];
  KVC_ASSERT_OK(f.AppendAll(0, kTokens, &keys));
  CompressParams p;
  p.sequence_id = f.id;
  p.spec.eviction = Eviction::kH2o;
  p.spec.heavy = 3;
  p.spec.recent = 5;
  EXPECT_THAT(f.store->Compress(p), StatusIs(Code::kFailedPrecondition, "no"));
  const std::vector<float> q = QueriesAlong(dir, 1, g.qheads, 30.0f);
  KVC_ASSERT_OK(f.AttendSteps(q, kTokens - 1, 3));
  KVC_ASSERT_OK(f.store->Compress(p));
  std::set<int32_t> expected = heavy;
  for (int t = kTokens - 5; t < kTokens; ++t) expected.insert(t);
  for (const auto& [lh, positions] : f.Positions()) EXPECT_EQ(positions, expected);
}

TEST(CompressionTest, RefusedSpecsLeaveTheSequenceUnchanged) {
  Geometry g;
  Fixture f(g);
  KVC_ASSERT_OK(f.AppendAll(0, 50));
  const auto before = f.Fetched(1, 1);
  auto compress = [&](CompressionSpec spec, std::vector<LayerQueries> queries = {}) {
    CompressParams p;
    p.sequence_id = f.id;
    p.spec = spec;
    p.queries = std::move(queries);
    return f.store->Compress(p).status();
  };
  CompressionSpec snap;
  snap.eviction = Eviction::kSnapKv;
  snap.window = 8;
  snap.budget = 8;
  EXPECT_THAT(compress(snap), StatusIs(Code::kInvalidArgument, "larger than window"));
  snap.budget = 16;
  EXPECT_THAT(compress(snap), StatusIs(Code::kInvalidArgument, "snapkv needs queries"));
  const std::vector<float> q(8 * g.qheads * g.dim, 0.1f);
  LayerQueries lq;
  lq.layer = 0;
  lq.dtype = DType::kF32;
  lq.queries = Bytes(q);
  lq.positions.assign(8, 49);
  EXPECT_THAT(compress(snap, {lq}),
              StatusIs(Code::kInvalidArgument, "queries for layer 1 are missing"));
  LayerQueries bad = lq;
  bad.layer = 1;
  bad.queries = bad.queries.substr(0, 100);
  EXPECT_THAT(compress(snap, {lq, bad}), StatusIs(Code::kInvalidArgument, "have 100 bytes"));
  bad = lq;
  bad.layer = 1;
  bad.positions.resize(5);
  EXPECT_THAT(compress(snap, {lq, bad}), StatusIs(Code::kInvalidArgument, "snapkv.window = 8"));
  CompressionSpec h2o;
  h2o.eviction = Eviction::kH2o;
  h2o.heavy = 4;
  h2o.recent = 4;
  EXPECT_THAT(compress(h2o), StatusIs(Code::kFailedPrecondition, "h2o needs accumulated"));
  h2o.residual_tokens = 20;
  EXPECT_THAT(compress(h2o), StatusIs(Code::kInvalidArgument, "residual_tokens (20) is larger"));
  CompressionSpec fmt;
  fmt.storage = StorageFormat::kInt4G64;
  fmt.storage_set = true;
  Fixture narrow(Geometry{2, 2, 4, 32, 16});
  KVC_ASSERT_OK(narrow.AppendAll(0, 5));
  CompressParams p;
  p.sequence_id = narrow.id;
  p.spec = fmt;
  EXPECT_THAT(narrow.store->Compress(p),
              StatusIs(Code::kInvalidArgument, "cannot store head_dim 32"));

  const auto after = f.Fetched(1, 1);
  EXPECT_EQ(before.k, after.k);
  EXPECT_EQ(before.v, after.v);
  EXPECT_EQ(before.pos, after.pos);
}

TEST(CompressionTest, CompressThatDoesNotFitIsRefusedWhole) {
  Geometry g;
  g.layers = 1;
  // Capacity for the raw tokens and little more: converting to f16 needs new blocks first.
  const int64_t raw_block = static_cast<int64_t>(
      kernels::MakeBlockLayout(StorageFormat::kF32, g.dim, g.block).block_bytes);
  Fixture f(g, {}, 8 * raw_block);
  KVC_ASSERT_OK(f.AppendAll(0, 64));  // 4 blocks per head x 2 heads = all 8 blocks
  const auto before = f.Fetched(0, 0);
  CompressParams p;
  p.sequence_id = f.id;
  p.spec.storage = StorageFormat::kF16;
  p.spec.storage_set = true;
  EXPECT_THAT(f.store->Compress(p), StatusIs(Code::kResourceExhausted));
  const auto after = f.Fetched(0, 0);
  EXPECT_EQ(before.k, after.k);
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
  EXPECT_EQ(s.storage, StorageFormat::kF32);
}

TEST(CompressionTest, CyclesOfAppendCompressReleaseLeaveNoBlocksBehind) {
  Geometry g;
  auto store = KvStore::Create(Options(g));
  ASSERT_TRUE(store.ok());
  std::mt19937 rng(11);
  for (int cycle = 0; cycle < 40; ++cycle) {
    CreateSequenceParams cp;
    if (cycle % 3 == 0) cp.policy = Streaming(2, 30);
    if (cycle % 4 == 1) {
      cp.policy.storage = StorageFormat::kInt4G32;
      cp.policy.storage_set = true;
    }
    KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot seq, (*store)->CreateSequence(cp));
    const int64_t n = 20 + static_cast<int64_t>(rng() % 150);
    for (int l = 0; l < g.layers; ++l) {
      const std::vector<float> k = Gaussian(static_cast<size_t>(n * g.heads * g.dim), cycle);
      AppendParams a;
      a.sequence_id = seq.id;
      a.layer = l;
      a.num_tokens = n;
      a.dtype = DType::kF32;
      a.keys = Bytes(k);
      a.values = Bytes(k);
      KVC_ASSERT_OK((*store)->Append(a));
    }
    KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot before, (*store)->stats().GetPoolStats(""));
    CompressParams p;
    p.sequence_id = seq.id;
    p.spec = Streaming(1, 10);
    p.spec.storage = cycle % 2 ? StorageFormat::kFp8E4M3 : StorageFormat::kNvfp4;
    p.spec.storage_set = true;
    KVC_ASSERT_OK_AND_ASSIGN(CompressResult r, (*store)->Compress(p));
    KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot after, (*store)->stats().GetPoolStats(""));
    // What Compress reports freed is gone from the pool at once.
    EXPECT_EQ(before.used_bytes - after.used_bytes, r.bytes_before - r.bytes_after);
    KVC_ASSERT_OK((*store)->Release(seq.id));
  }
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, (*store)->stats().GetPoolStats(""));
  EXPECT_EQ(stats.used_bytes, 0);
  EXPECT_EQ(stats.used_blocks, 0);
}

}  // namespace
}  // namespace kvc::cachesvc

namespace kvc::cachesvc {
namespace {

// NeoX ("rotate half") RoPE of `x` at `position`, theta 10000, all dims rotated.
std::vector<float> Rope(const std::vector<float>& x, int position) {
  const int d = static_cast<int>(x.size()), half = d / 2;
  std::vector<float> out(x.size());
  for (int i = 0; i < half; ++i) {
    const double angle = position * std::pow(10000.0, -2.0 * i / d);
    const double c = std::cos(angle), s = std::sin(angle);
    out[i] = static_cast<float>(x[i] * c - x[i + half] * s);
    out[i + half] = static_cast<float>(x[i] * s + x[i + half] * c);
  }
  return out;
}

TEST(CompressionTest, StreamingLlmRerotationGivesInCachePositionsWithExactKeys) {
  Geometry g;
  g.layers = 1;
  KvStoreOptions options = Options(g);
  options.pools[0].geometry.rope.enabled = true;
  options.pools[0].geometry.rope.theta = 10000;
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(options));
  CreateSequenceParams cp;
  cp.policy = Streaming(4, 100);
  cp.policy.rerotate_keys = true;
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot seq, store->CreateSequence(cp));
  // Every key of head h is the same vector k0[h] rotated to its token's position, so a key
  // moved to position q must equal k0[h] rotated to q.
  std::vector<std::vector<float>> k0 = {Gaussian(g.dim, 1), Gaussian(g.dim, 2)};
  constexpr int kTokens = 300;
  std::vector<float> keys;
  for (int t = 0; t < kTokens; ++t)
    for (int h = 0; h < g.heads; ++h) {
      const auto r = Rope(k0[static_cast<size_t>(h)], t);
      keys.insert(keys.end(), r.begin(), r.end());
    }
  for (int start = 0; start < kTokens; start += 50) {
    AppendParams a;
    a.sequence_id = seq.id;
    a.layer = 0;
    a.start_position = start;
    a.num_tokens = 50;
    a.dtype = DType::kF32;
    a.keys =
        absl::string_view(reinterpret_cast<const char*>(keys.data()) + start * g.heads * g.dim * 4,
                          50 * g.heads * g.dim * 4);
    a.values = a.keys;
    KVC_ASSERT_OK(store->Append(a));
  }
  CompressParams p;
  p.sequence_id = seq.id;
  p.spec = Streaming(4, 100);
  p.spec.rerotate_keys = true;
  KVC_ASSERT_OK(store->Compress(p));
  FetchParams f;
  f.sequence_id = seq.id;
  f.dtype = DType::kF32;
  std::map<int, std::set<int32_t>> positions;
  KVC_ASSERT_OK(store->Fetch(f, [&](FetchChunk& c) {
    const float* k = reinterpret_cast<const float*>(c.keys.data());
    for (int i = 0; i < c.num_tokens; ++i) {
      const int32_t q = c.positions[static_cast<size_t>(i)];
      positions[c.kv_head].insert(q);
      const auto expected = Rope(k0[static_cast<size_t>(c.kv_head)], q);
      for (int e = 0; e < g.dim; ++e)
        EXPECT_NEAR(k[i * g.dim + e], expected[static_cast<size_t>(e)], 2e-4);
    }
    return true;
  }));
  std::set<int32_t> expected;
  for (int q = kTokens - 104; q < kTokens; ++q)
    expected.insert(q);  // consecutive, ending at the newest
  EXPECT_EQ(positions[0], expected);
  EXPECT_EQ(positions[1], expected);
}

TEST(CompressionTest, RerotationNeedsThePoolsRope) {
  Fixture f;  // no RoPE parameters in this pool
  CompressParams p;
  p.sequence_id = f.id;
  p.spec = Streaming(4, 10);
  p.spec.rerotate_keys = true;
  EXPECT_THAT(f.store->Compress(p), StatusIs(Code::kFailedPrecondition, "geometry.rope"));
}

}  // namespace
}  // namespace kvc::cachesvc
