// The raw recent residual (CompressionSpec.residual_tokens): the newest tokens stay raw, bit
// for bit, the rest is stored low-bit exactly as a sequence without a residual stores it,
// Attend merges both parts into the attention over everything stored, eviction and scoring
// see both parts, a residual that cannot apply is refused, and every block comes back.
#include <cmath>
#include <map>
#include <set>

#include "tests/cachesvc/compression_fixture.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

CompressionSpec LowBit(StorageFormat format, int residual) {
  CompressionSpec s;
  s.storage = format;
  s.storage_set = true;
  s.residual_tokens = residual;
  return s;
}

// Appends `sizes` chunks to every layer of `f`; returns the total.
int64_t AppendChunks(Fixture& f, const std::vector<int64_t>& sizes) {
  int64_t at = 0;
  for (int64_t n : sizes) {
    EXPECT_THAT(f.AppendAll(at, n), ::kvc::testing::IsOk());
    at += n;
  }
  return at;
}

// What Fixture::AppendAll wrote for (layer, head, position) given the chunk schedule.
struct Appended {
  std::vector<float> k, v;  // [dim]
};
Appended Original(const Fixture& f, const std::vector<int64_t>& sizes, int layer, int head,
                  int64_t position) {
  int64_t start = 0;
  for (int64_t n : sizes) {
    if (position < start + n) {
      const size_t count = static_cast<size_t>(n * f.geom.heads * f.geom.dim);
      const std::vector<float> k = Gaussian(count, 1000 * layer + static_cast<uint32_t>(start));
      const std::vector<float> v =
          Gaussian(count, 7777 + 1000 * layer + static_cast<uint32_t>(start));
      const size_t at =
          static_cast<size_t>(((position - start) * f.geom.heads + head) * f.geom.dim);
      return {std::vector<float>(k.begin() + at, k.begin() + at + f.geom.dim),
              std::vector<float>(v.begin() + at, v.begin() + at + f.geom.dim)};
    }
    start += n;
  }
  ADD_FAILURE() << "position " << position << " was never appended";
  return {};
}

// Dense K/V of one (layer, head) keyed by position.
std::map<int32_t, Appended> ByPosition(Fixture& f, int layer, int head) {
  const Fixture::Head h = f.Fetched(layer, head);
  std::map<int32_t, Appended> out;
  const size_t d = static_cast<size_t>(f.geom.dim);
  for (size_t i = 0; i < h.pos.size(); ++i) {
    out[h.pos[i]] = {std::vector<float>(h.k.begin() + i * d, h.k.begin() + (i + 1) * d),
                     std::vector<float>(h.v.begin() + i * d, h.v.begin() + (i + 1) * d)};
  }
  return out;
}

TEST(ResidualTest, NewestTokensStayRawAndTheRestIsStoredLikeWithoutAResidual) {
  const std::vector<int64_t> sizes = {1, 7, 50, 3, 33, 1, 1, 19};  // 115 tokens
  Fixture with(Geometry{}, LowBit(StorageFormat::kInt4G32, 20));
  Fixture without(Geometry{}, LowBit(StorageFormat::kInt4G32, 0));
  const int64_t total = AppendChunks(with, sizes);
  AppendChunks(without, sizes);
  for (int l = 0; l < with.geom.layers; ++l) {
    for (int h = 0; h < with.geom.heads; ++h) {
      SCOPED_TRACE(::testing::Message() << "layer " << l << " head " << h);
      const auto got = ByPosition(with, l, h);
      const auto quantized = ByPosition(without, l, h);
      ASSERT_EQ(got.size(), static_cast<size_t>(total));
      int differs = 0;
      for (const auto& [pos, kv] : got) {
        if (pos >= total - 20) {  // the residual: exactly what was appended
          const Appended want = Original(with, sizes, l, h, pos);
          EXPECT_EQ(kv.k, want.k) << "position " << pos;
          EXPECT_EQ(kv.v, want.v) << "position " << pos;
          differs += kv.k != quantized.at(pos).k;
        } else {  // aged out: the same bytes as INT4 storage without a residual
          EXPECT_EQ(kv.k, quantized.at(pos).k) << "position " << pos;
          EXPECT_EQ(kv.v, quantized.at(pos).v) << "position " << pos;
        }
      }
      EXPECT_EQ(differs, 20);  // INT4 would have changed every residual token
    }
  }
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, with.store->GetSequence(with.id));
  EXPECT_EQ(s.visible_tokens, total);
  EXPECT_EQ(s.stored_token_heads, total * with.geom.heads * with.geom.layers);
  ASSERT_EQ(s.bytes_by_format.size(), 2u);
  EXPECT_EQ(s.bytes_by_format[0].format, StorageFormat::kInt4G32);
  EXPECT_EQ(s.bytes_by_format[1].format, StorageFormat::kF32);
  // 20 raw tokens per lane = 2 blocks of 16; 95 INT4 tokens = 6 blocks.
  EXPECT_EQ(s.bytes_by_format[1].blocks, 2 * with.geom.heads * with.geom.layers);
  EXPECT_EQ(s.bytes_by_format[0].blocks, 6 * with.geom.heads * with.geom.layers);
  EXPECT_EQ(s.bytes, s.bytes_by_format[0].bytes + s.bytes_by_format[1].bytes);

  // A stored-format Fetch says which chunks are raw.
  FetchParams fp;
  fp.sequence_id = with.id;
  fp.format = FetchFormat::kStored;
  std::map<StorageFormat, int64_t> tokens_by_format;
  KVC_ASSERT_OK(with.store->Fetch(fp, [&](FetchChunk& c) {
    tokens_by_format[c.storage] += c.num_tokens;
    EXPECT_EQ(c.keys.size(), static_cast<size_t>(c.num_tokens) * c.record_bytes);
    return true;
  }));
  EXPECT_EQ(tokens_by_format[StorageFormat::kF32], 20 * with.geom.heads * with.geom.layers);
  EXPECT_EQ(tokens_by_format[StorageFormat::kInt4G32], 95 * with.geom.heads * with.geom.layers);
}

class ResidualAttendTest : public ::testing::TestWithParam<StorageFormat> {};

TEST_P(ResidualAttendTest, AttendIsAttentionOverBothParts) {
  Geometry g;
  Fixture f(g, LowBit(GetParam(), 24));
  const int64_t total = AppendChunks(f, {40, 37, 1, 22});
  const std::vector<float> q = Gaussian(g.qheads * g.dim, 5);
  const int group = g.qheads / g.heads;
  for (int l = 0; l < g.layers; ++l) {
    AttendParams a;
    a.sequence_id = f.id;
    a.layer = l;
    a.dtype = DType::kF32;
    a.queries = Bytes(q);
    a.positions = {static_cast<int32_t>(total)};
    a.want_weights = true;
    KVC_ASSERT_OK_AND_ASSIGN(AttendResult r, f.store->Attend(a));
    ASSERT_EQ(r.max_stored, total);
    const float* out = reinterpret_cast<const float*>(r.output.data());
    for (int qh = 0; qh < g.qheads; ++qh) {
      const Fixture::Head head = f.Fetched(l, qh / group);
      const std::vector<float> qv(q.begin() + qh * g.dim, q.begin() + (qh + 1) * g.dim);
      const std::vector<double> ref = Attention(qv, head.k, head.v, g.dim);
      for (int e = 0; e < g.dim; ++e)
        ASSERT_NEAR(out[qh * g.dim + e], ref[e], 1e-4) << "layer " << l << " qhead " << qh;
      double sum = 0;
      std::set<int32_t> positions;
      for (int64_t t = 0; t < total; ++t) {
        sum += r.weights[static_cast<size_t>(qh * total + t)];
        positions.insert(r.weight_positions[static_cast<size_t>((qh / group) * total + t)]);
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
      EXPECT_EQ(positions.size(), static_cast<size_t>(total));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ResidualAttendTest,
                         ::testing::Values(StorageFormat::kInt8, StorageFormat::kInt4G32,
                                           StorageFormat::kFp8E4M3, StorageFormat::kNvfp4),
                         [](const auto& info) {
                           return std::string(kernels::StorageFormatName(info.param));
                         });

TEST(ResidualTest, SnapKvScoresBothPartsAndKeepsTheResidualRaw) {
  Geometry g;
  constexpr int kTokens = 256, kWindow = 8, kNeedle = 77, kResidual = 8;
  std::vector<float> keys = Gaussian(kTokens * g.heads * g.dim, 5, 0.05f);
  std::vector<float> needle(g.dim, 0.0f);
  needle[3] = 1.0f;
  for (int h = 0; h < g.heads; ++h)
    for (int e = 0; e < g.dim; ++e) keys[(kNeedle * g.heads + h) * g.dim + e] = needle[e];
  Fixture f(g, LowBit(StorageFormat::kInt8, kResidual));
  KVC_ASSERT_OK(f.AppendAll(0, kTokens, &keys));
  const std::vector<float> q = QueriesAlong(needle, kWindow, g.qheads, 40.0f);
  CompressParams p;
  p.sequence_id = f.id;
  p.spec.eviction = Eviction::kSnapKv;
  p.spec.window = kWindow;
  p.spec.budget = kWindow + 1;
  p.spec.pooling_kernel = 1;
  for (int l = 0; l < g.layers; ++l) {
    LayerQueries lq;
    lq.layer = l;
    lq.dtype = DType::kF32;
    lq.queries = Bytes(q);
    for (int t = 0; t < kWindow; ++t) lq.positions.push_back(kTokens - kWindow + t);
    p.queries.push_back(lq);
  }
  KVC_ASSERT_OK_AND_ASSIGN(CompressResult r, f.store->Compress(p));
  EXPECT_EQ(r.layers[0].token_heads_after, (kWindow + 1) * g.heads);
  std::set<int32_t> expected = {kNeedle};
  for (int t = kTokens - kWindow; t < kTokens; ++t) expected.insert(t);
  for (const auto& [lh, positions] : f.Positions()) EXPECT_EQ(positions, expected);
  // The residual (the observation window here) is still raw: bit-exact keys.
  const auto stored = ByPosition(f, 1, 1);
  for (int t = kTokens - kResidual; t < kTokens; ++t) {
    const std::vector<float> want(keys.begin() + (t * g.heads + 1) * g.dim,
                                  keys.begin() + (t * g.heads + 2) * g.dim);
    EXPECT_EQ(stored.at(t).k, want) << t;
  }
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot snap, f.store->GetSequence(f.id));
  ASSERT_EQ(snap.bytes_by_format.size(), 2u);
  EXPECT_EQ(snap.bytes_by_format[0].format, StorageFormat::kInt8);  // the needle's block
}

TEST(ResidualTest, CompressSetsTheResidualOnASequenceStillRaw) {
  Geometry g;
  Fixture f(g);
  KVC_ASSERT_OK(f.AppendAll(0, 100));
  CompressParams p;
  p.sequence_id = f.id;
  p.spec = LowBit(StorageFormat::kInt4G32, 16);
  KVC_ASSERT_OK(f.store->Compress(p));
  KVC_ASSERT_OK(f.AppendAll(100, 10));
  const std::vector<int64_t> sizes = {100, 10};
  const auto stored = ByPosition(f, 0, 1);
  ASSERT_EQ(stored.size(), 110u);
  int exact = 0;
  for (const auto& [pos, kv] : stored) {
    const bool raw = kv.k == Original(f, sizes, 0, 1, pos).k;
    EXPECT_EQ(raw, pos >= 94) << "position " << pos;
    exact += raw;
  }
  EXPECT_EQ(exact, 16);
  // The residual is set once; a quantized sequence cannot get one.
  p.spec = LowBit(StorageFormat::kInt4G32, 8);
  EXPECT_THAT(f.store->Compress(p), StatusIs(Code::kFailedPrecondition, "cannot change it"));
  Fixture quantized(g, LowBit(StorageFormat::kInt8, 0));
  KVC_ASSERT_OK(quantized.AppendAll(0, 40));
  p.sequence_id = quantized.id;
  p.spec = LowBit(StorageFormat::kInt4G32, 8);
  EXPECT_THAT(quantized.store->Compress(p),
              StatusIs(Code::kFailedPrecondition, "are stored in int8"));
  // Nor one converted back to the raw format: its values went through int8 once.
  p.spec = LowBit(StorageFormat::kF32, 0);
  KVC_ASSERT_OK(quantized.store->Compress(p).status());
  p.spec = LowBit(StorageFormat::kInt4G32, 8);
  EXPECT_THAT(quantized.store->Compress(p),
              StatusIs(Code::kFailedPrecondition, "lossy format before"));
}

TEST(ResidualTest, CompressRefusesAResidualTheAutomaticPolicyWouldEvict) {
  CompressionSpec h2o;
  h2o.eviction = Eviction::kH2o;
  h2o.heavy = 8;
  h2o.recent = 10;
  Fixture f(Geometry{}, h2o);
  KVC_ASSERT_OK(f.AppendAll(0, 40));
  CompressParams p;
  p.sequence_id = f.id;
  p.spec = LowBit(StorageFormat::kInt4G32, 19);  // the policy keeps only the newest 10
  EXPECT_THAT(f.store->Compress(p), StatusIs(Code::kInvalidArgument, "use at most 10"));
  p.spec = LowBit(StorageFormat::kInt4G32, 10);
  KVC_EXPECT_OK(f.store->Compress(p).status());
}

TEST(ResidualTest, StreamingLlmWithAResidualRunsInConstantMemoryAndReturnsEveryBlock) {
  Geometry g;
  g.layers = 1;
  CompressionSpec spec = Streaming(4, 60);
  spec.storage = StorageFormat::kInt4G64;
  spec.storage_set = true;
  spec.residual_tokens = 16;
  Fixture f(g, spec);
  // Eviction runs once a lane is a block over its limit, so memory oscillates within a
  // bound; it must not grow with the stream.
  int64_t at = 0, early = 0, late = 0;
  std::vector<int64_t> sizes;
  for (int i = 0; i < 80; ++i) {
    sizes.push_back(13);
    KVC_ASSERT_OK(f.AppendAll(at, 13));
    at += 13;
    KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, f.store->stats().GetPoolStats("c"));
    if (i >= 10) (i < 45 ? early : late) = std::max(i < 45 ? early : late, stats.used_bytes);
  }
  EXPECT_LE(late, early);
  const auto stored = ByPosition(f, 0, 0);
  EXPECT_LE(stored.size(), static_cast<size_t>(4 + 60 + g.block));
  for (int32_t p = 0; p < 4; ++p) EXPECT_TRUE(stored.count(p)) << p;
  for (int64_t p = at - 60; p < at; ++p) {
    ASSERT_TRUE(stored.count(static_cast<int32_t>(p))) << p;
    const bool raw = stored.at(static_cast<int32_t>(p)).k == Original(f, sizes, 0, 0, p).k;
    EXPECT_EQ(raw, p >= at - 16) << "position " << p;
  }
  KVC_ASSERT_OK(f.store->Release(f.id));
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, f.store->stats().GetPoolStats("c"));
  EXPECT_EQ(stats.used_bytes, 0);
}

TEST(ResidualTest, H2oRanksTokensWhoseScoresWereEarnedInTheResidual) {
  Geometry g;
  g.layers = 1;
  CompressionSpec spec;
  spec.eviction = Eviction::kH2o;
  spec.heavy = 3;
  spec.recent = 8;
  spec.storage = StorageFormat::kInt8;
  spec.storage_set = true;
  spec.residual_tokens = 8;
  Fixture f(g, spec);
  constexpr int kTokens = 100;
  std::vector<float> keys = Gaussian(kTokens * g.heads * g.dim, 3, 0.05f);
  std::vector<float> dir(g.dim, 0.0f);
  dir[5] = 1.0f;
  const std::set<int32_t> heavy = {7, 64, 95};  // 95 is in the residual while Attend runs
  for (int32_t t : heavy)
    for (int h = 0; h < g.heads; ++h)
      for (int e = 0; e < g.dim; ++e) keys[(t * g.heads + h) * g.dim + e] = dir[e];
  KVC_ASSERT_OK(f.AppendAll(0, kTokens, &keys));
  const std::vector<float> q = QueriesAlong(dir, 1, g.qheads, 30.0f);
  KVC_ASSERT_OK(f.AttendSteps(q, kTokens - 1, 3));
  KVC_ASSERT_OK(f.AppendAll(kTokens, 40));  // ages 92..99 out, then evicts to 3 + 8
  std::set<int32_t> expected = heavy;
  for (int t = kTokens + 32; t < kTokens + 40; ++t) expected.insert(t);
  for (const auto& [lh, positions] : f.Positions()) EXPECT_EQ(positions, expected);
}

TEST(ResidualTest, AResidualThatEvictionWouldCutIsRefused) {
  Geometry g;
  CompressionSpec spec = Streaming(4, 10);
  spec.residual_tokens = 11;
  auto store = KvStore::Create(Options(g));
  KVC_ASSERT_OK(store.status());
  CreateSequenceParams c;
  c.policy = spec;
  EXPECT_THAT((*store)->CreateSequence(c),
              StatusIs(Code::kInvalidArgument, "residual_tokens (11) is larger"));
  Fixture f(g, LowBit(StorageFormat::kInt8, 20));
  KVC_ASSERT_OK(f.AppendAll(0, 50));
  CompressParams p;
  p.sequence_id = f.id;
  p.spec = Streaming(4, 10);
  EXPECT_THAT(f.store->Compress(p), StatusIs(Code::kInvalidArgument, "newest 20 tokens raw"));
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, f.store->GetSequence(f.id));
  EXPECT_EQ(s.stored_token_heads, 50 * g.heads * g.layers);
}

}  // namespace
}  // namespace kvc::cachesvc
