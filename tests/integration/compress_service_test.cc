// Compress and Attend through the real client and gRPC server: automatic policies at
// CreateSequence, SnapKV + INT4 at the end of prefill, dense and stored Fetch after
// compression, the Attend stream, and the errors a caller gets.
#include <grpcpp/grpcpp.h>

#include <random>

#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using client::CompressionSpec;
using client::DType;
using client::StorageFormat;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

// 4 layers x 2 kv heads x 4 query heads x head_dim 32, f16 pool; we send f32.
constexpr int kLayers = 4, kHeads = 2, kQHeads = 4, kDim = 32;

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class CompressServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions());
  }

  std::string Create(CompressionSpec policy = {}) {
    client::CreateSequenceOptions o;
    o.policy = policy;
    auto s = t_.client->CreateSequence(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->sequence_id : "";
  }

  absl::Status Prefill(const std::string& id, int64_t start, int n) {
    for (int l = 0; l < kLayers; ++l) {
      const auto k =
          Gaussian(static_cast<size_t>(n) * kHeads * kDim, 10 * l + static_cast<uint32_t>(start));
      client::AppendChunk c;
      c.sequence_id = id;
      c.layer = l;
      c.start_position = start;
      c.num_tokens = n;
      c.dtype = DType::kF32;
      c.keys = k.data();
      c.values = k.data();
      c.bytes = k.size() * sizeof(float);
      auto r = t_.client->Append(c);
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  }

  ::kvc::testing::TestServer t_;
};

TEST_F(CompressServiceTest, AutomaticStreamingLlmBoundsWhatIsStored) {
  const std::string id = Create(CompressionSpec::StreamingLlm(4, 60));
  for (int step = 0; step < 10; ++step) KVC_ASSERT_OK(Prefill(id, step * 50, 50));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, t_.client->GetSequence(id));
  EXPECT_EQ(info.visible_tokens, 500);
  ASSERT_EQ(info.stored_tokens.size(), static_cast<size_t>(kLayers * kHeads));
  for (int64_t n : info.stored_tokens) EXPECT_LE(n, 4 + 60 + 16);
  EXPECT_GT(info.compression_ratio, 5.0);
  KVC_ASSERT_OK_AND_ASSIGN(client::FetchResult kv, t_.client->Fetch(id, {}));
  for (const auto& h : kv.heads) {
    std::set<int32_t> positions(h.positions.begin(), h.positions.end());
    for (int p = 0; p < 4; ++p) EXPECT_TRUE(positions.count(p));
    for (int p = 440; p < 500; ++p) EXPECT_TRUE(positions.count(p));
  }
}

TEST_F(CompressServiceTest, SnapKvWithInt4AtTheEndOfPrefill) {
  const std::string id = Create();
  KVC_ASSERT_OK(Prefill(id, 0, 400));
  constexpr int kWindow = 16;
  std::vector<std::vector<float>> q(kLayers);
  std::vector<client::LayerQueries> queries;
  for (int l = 0; l < kLayers; ++l) {
    q[l] = Gaussian(kWindow * kQHeads * kDim, 500 + l);
    client::LayerQueries lq;
    lq.layer = l;
    lq.dtype = DType::kF32;
    lq.queries = q[l].data();
    lq.bytes = q[l].size() * sizeof(float);
    for (int t = 0; t < kWindow; ++t) lq.positions.push_back(400 - kWindow + t);
    queries.push_back(lq);
  }
  KVC_ASSERT_OK_AND_ASSIGN(
      client::CompressResult r,
      t_.client->Compress(
          id, CompressionSpec::SnapKv(kWindow, 64).WithStorage(StorageFormat::kInt4G32), queries));
  ASSERT_EQ(r.layers.size(), static_cast<size_t>(kLayers));
  EXPECT_EQ(r.layers[0].token_heads_before, 400 * kHeads);
  EXPECT_EQ(r.layers[0].token_heads_after, 64 * kHeads);
  EXPECT_EQ(r.storage, StorageFormat::kInt4G32);
  EXPECT_EQ(r.sequence.storage, StorageFormat::kInt4G32);
  EXPECT_GT(static_cast<double>(r.bytes_before) / static_cast<double>(r.bytes_after), 15.0);
  // The pool got the bytes back at once.
  KVC_ASSERT_OK_AND_ASSIGN(client::PoolStats stats,
                           kvc::client::AdminClient::Over(*t_.client).GetPoolStats(""));
  EXPECT_EQ(stats.used_bytes, r.bytes_after);
  ASSERT_EQ(stats.bytes_by_format.size(), 1u);
  EXPECT_EQ(stats.bytes_by_format[0].format, StorageFormat::kInt4G32);
  KVC_ASSERT_OK_AND_ASSIGN(auto pools, kvc::client::AdminClient::Over(*t_.client).ListPools());
  EXPECT_EQ(pools[0].used_bytes, r.bytes_after);  // exact, also for blocks of another format

  client::FetchOptions stored;
  stored.stored_format = true;
  KVC_ASSERT_OK_AND_ASSIGN(client::FetchResult kv, t_.client->Fetch(id, stored));
  EXPECT_EQ(kv.storage, StorageFormat::kInt4G32);
  EXPECT_EQ(kv.record_bytes, kDim / 2 + (kDim / 32) * 4);
  ASSERT_EQ(kv.heads.size(), static_cast<size_t>(kLayers * kHeads));
  EXPECT_EQ(kv.heads[0].positions.size(), 64u);
  client::FetchOptions dense;
  dense.dtype = DType::kF32;
  KVC_ASSERT_OK_AND_ASSIGN(kv, t_.client->Fetch(id, dense));
  EXPECT_EQ(kv.heads[0].keys.size(), 64u * kDim * sizeof(float));
  // The observation window is always kept.
  std::set<int32_t> positions(kv.heads[0].positions.begin(), kv.heads[0].positions.end());
  for (int t = 400 - kWindow; t < 400; ++t) EXPECT_TRUE(positions.count(t));
}

// SnapKV + INT4 keeping the newest 16 tokens raw, as an engine would ask at the end of
// prefill; then decode appends age tokens out of the residual.
TEST_F(CompressServiceTest, SnapKvWithInt4KeepsARawResidual) {
  const std::string id = Create();
  KVC_ASSERT_OK(Prefill(id, 0, 200));
  constexpr int kWindow = 16, kResidual = 16;
  std::vector<std::vector<float>> q(kLayers);
  std::vector<client::LayerQueries> queries;
  for (int l = 0; l < kLayers; ++l) {
    q[l] = Gaussian(kWindow * kQHeads * kDim, 700 + l);
    client::LayerQueries lq;
    lq.layer = l;
    lq.dtype = DType::kF32;
    lq.queries = q[l].data();
    lq.bytes = q[l].size() * sizeof(float);
    for (int t = 0; t < kWindow; ++t) lq.positions.push_back(200 - kWindow + t);
    queries.push_back(lq);
  }
  CompressionSpec spec = CompressionSpec::SnapKv(kWindow, 48).WithStorage(StorageFormat::kInt4G32);
  spec.residual_tokens = kResidual;
  KVC_ASSERT_OK_AND_ASSIGN(client::CompressResult r, t_.client->Compress(id, spec, queries));
  EXPECT_EQ(r.layers[0].token_heads_after, 48 * kHeads);
  KVC_ASSERT_OK(Prefill(id, 200, 5));  // decode steps: 5 tokens age out of the residual
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, t_.client->GetSequence(id));
  ASSERT_EQ(info.bytes_by_format.size(), 2u);
  EXPECT_EQ(info.bytes_by_format[0].format, StorageFormat::kInt4G32);
  EXPECT_EQ(info.bytes_by_format[1].format, StorageFormat::kF16);
  for (int64_t n : info.stored_tokens) EXPECT_EQ(n, 48 + 5);

  client::FetchOptions stored;
  stored.stored_format = true;
  KVC_ASSERT_OK_AND_ASSIGN(client::FetchResult kv, t_.client->Fetch(id, stored));
  ASSERT_EQ(kv.heads.size(), static_cast<size_t>(2 * kLayers * kHeads));  // two parts a lane
  for (size_t i = 0; i < kv.heads.size(); i += 2) {
    const client::FetchedHead& low = kv.heads[i];
    const client::FetchedHead& raw = kv.heads[i + 1];
    EXPECT_EQ(low.storage, StorageFormat::kInt4G32);
    EXPECT_EQ(raw.storage, StorageFormat::kF16);
    EXPECT_EQ(raw.first_index, static_cast<int64_t>(low.positions.size()));
    EXPECT_EQ(raw.keys.size(), raw.positions.size() * static_cast<size_t>(raw.record_bytes));
    EXPECT_EQ(raw.positions.size(), static_cast<size_t>(kResidual));
    for (int32_t p : raw.positions) EXPECT_GE(p, 205 - kResidual);
  }
  // Dense: the residual comes back as appended (f32 -> f16 pool, exactly f16-rounded).
  client::FetchOptions dense;
  dense.dtype = DType::kF32;
  dense.layers = {2};
  KVC_ASSERT_OK_AND_ASSIGN(kv, t_.client->Fetch(id, dense));
  const std::vector<float> appended = Gaussian(5 * kHeads * kDim, 10 * 2 + 200);
  const client::FetchedHead& h = kv.heads[1];
  const float* keys = reinterpret_cast<const float*>(h.keys.data());
  for (size_t t = 0; t < h.positions.size(); ++t) {
    if (h.positions[t] < 200) continue;
    for (int e = 0; e < kDim; ++e) {
      const float want =
          appended[(static_cast<size_t>(h.positions[t] - 200) * kHeads + 1) * kDim + e];
      EXPECT_NEAR(keys[t * kDim + e], want, 2e-3f * (1.0f + std::fabs(want)));
    }
  }
}

TEST_F(CompressServiceTest, AttendSessionMatchesUnaryAttend) {
  const std::string id = Create(CompressionSpec::H2o(32, 16).WithStorage(StorageFormat::kInt8));
  KVC_ASSERT_OK(Prefill(id, 0, 100));
  const auto q = Gaussian(kQHeads * kDim, 3);
  client::AttendRequest a;
  a.sequence_id = id;
  a.layer = 2;
  a.dtype = DType::kF32;
  a.queries = q.data();
  a.bytes = q.size() * sizeof(float);
  a.positions = {99};
  a.return_weights = true;
  KVC_ASSERT_OK_AND_ASSIGN(client::AttendResult unary, t_.client->Attend(a));
  EXPECT_EQ(unary.output.size(), static_cast<size_t>(kQHeads * kDim * 4));
  ASSERT_EQ(unary.weights.size(), static_cast<size_t>(kQHeads * unary.max_stored));
  double sum = 0;
  for (int t = 0; t < unary.max_stored; ++t) sum += unary.weights[static_cast<size_t>(t)];
  EXPECT_NEAR(sum, 1.0, 1e-4);  // one query head's softmax
  auto session = t_.client->StartAttendSession();
  for (int i = 0; i < 3; ++i) {
    KVC_ASSERT_OK_AND_ASSIGN(client::AttendResult streamed, session->Attend(a));
    EXPECT_EQ(streamed.output, unary.output);
  }
  a.positions = {5};  // in the past: not decode attention
  EXPECT_THAT(session->Attend(a), StatusIs(Code::kFailedPrecondition, "is before the last token"));
}

TEST_F(CompressServiceTest, BadSpecsAndRequestsGetSpecificErrors) {
  const std::string id = Create();
  KVC_ASSERT_OK(Prefill(id, 0, 40));
  EXPECT_THAT(t_.client->Compress(id, CompressionSpec::SnapKv(8, 8)),
              StatusIs(Code::kInvalidArgument, "larger than window"));
  EXPECT_THAT(t_.client->Compress(id, CompressionSpec::SnapKv(8, 20)),
              StatusIs(Code::kInvalidArgument, "snapkv needs queries"));
  EXPECT_THAT(t_.client->Compress(id, CompressionSpec::H2o(8, 8)),
              StatusIs(Code::kFailedPrecondition, "h2o needs accumulated attention scores"));
  CompressionSpec residual = CompressionSpec::StreamingLlm(4, 10);
  residual.residual_tokens = 50;
  EXPECT_THAT(t_.client->Compress(id, residual),
              StatusIs(Code::kInvalidArgument, "residual_tokens"));
  client::CreateSequenceOptions snap_auto;
  snap_auto.policy = CompressionSpec::SnapKv(8, 20);
  EXPECT_THAT(t_.client->CreateSequence(snap_auto),
              StatusIs(Code::kInvalidArgument, "cannot be an automatic policy"));
  EXPECT_THAT(t_.client->Compress("missing", CompressionSpec::StreamingLlm(4, 10)),
              StatusIs(Code::kNotFound));
  client::AttendRequest a;
  a.sequence_id = id;
  a.layer = 0;
  a.dtype = DType::kF32;
  const auto q = Gaussian(3, 1);
  a.queries = q.data();
  a.bytes = q.size() * sizeof(float);
  a.positions = {39};
  EXPECT_THAT(t_.client->Attend(a), StatusIs(Code::kInvalidArgument, "queries has 12 bytes"));

  // An unknown storage format number, sent raw.
  auto stub = kvcache::v1::KvCacheService::NewStub(
      grpc::CreateChannel(t_.server->address(), grpc::InsecureChannelCredentials()));
  kvcache::v1::CompressRequest request;
  request.set_sequence_id(id);
  request.mutable_spec()->set_storage(static_cast<kvcache::v1::StorageFormat>(77));
  kvcache::v1::CompressResponse response;
  grpc::ClientContext ctx;
  const grpc::Status st = stub->Compress(&ctx, request, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("storage is 77"), std::string::npos) << st.error_message();

  // None of it changed the sequence.
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, t_.client->GetSequence(id));
  for (int64_t n : info.stored_tokens) EXPECT_EQ(n, 40);
  EXPECT_EQ(info.storage, StorageFormat::kF16);
}

}  // namespace
}  // namespace kvc

namespace kvc {
namespace {

TEST_F(CompressServiceTest, FetchCanIncludeTokensOtherLayersDoNotHaveYet) {
  const std::string id = Create();
  KVC_ASSERT_OK(Prefill(id, 0, 10));
  // Layer 0 runs ahead by 5 tokens, as in a layer-by-layer prefill.
  const auto k = Gaussian(5 * kHeads * kDim, 1);
  client::AppendChunk c;
  c.sequence_id = id;
  c.layer = 0;
  c.start_position = 10;
  c.num_tokens = 5;
  c.dtype = DType::kF32;
  c.keys = k.data();
  c.values = k.data();
  c.bytes = k.size() * sizeof(float);
  KVC_ASSERT_OK(t_.client->Append(c));
  client::FetchOptions o;
  o.layers = {0};
  KVC_ASSERT_OK_AND_ASSIGN(client::FetchResult visible, t_.client->Fetch(id, o));
  EXPECT_EQ(visible.heads[0].positions.size(), 10u);
  o.include_unfinished = true;
  KVC_ASSERT_OK_AND_ASSIGN(client::FetchResult all, t_.client->Fetch(id, o));
  EXPECT_EQ(all.heads[0].positions.size(), 15u);
  EXPECT_EQ(all.heads[0].positions.back(), 14);
}

}  // namespace
}  // namespace kvc
