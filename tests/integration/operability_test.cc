// What operators rely on: Prometheus metrics that reflect real traffic, gRPC health
// checking and reflection, drain and evict, and a graceful shutdown that loses no
// acknowledged append.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <regex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "tests/testing/http_get.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using ::kvc::testing::MetricSample;

using ::kvc::testing::MakeKv;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

constexpr int kLayers = 4, kHeads = 2, kDim = 32;

cachesvc::ServerOptions WithMetrics() {
  auto options = ::kvc::testing::SmallServerOptions();
  options.metrics_listen = "127.0.0.1:0";
  return options;
}

client::AppendChunk Chunk(const std::string& id, int layer, int64_t start, int n,
                          const std::string& keys, const std::string& values) {
  client::AppendChunk c;
  c.sequence_id = id;
  c.layer = layer;
  c.start_position = start;
  c.num_tokens = n;
  c.dtype = client::DType::kF16;
  c.keys = keys.data();
  c.values = values.data();
  c.bytes = keys.size();
  return c;
}

TEST(OperabilityTest, MetricsReflectTraffic) {
  auto t = ::kvc::testing::StartTestServer(WithMetrics());
  ASSERT_FALSE(t.server->metrics_address().empty());
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo seq, t.client->CreateSequence({}));
  const std::string k = MakeKv(1, 0, 0, 20, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false);
  for (int l = 0; l < kLayers; ++l)
    KVC_ASSERT_OK(t.client->Append(Chunk(seq.sequence_id, l, 0, 20, k, k)));
  EXPECT_THAT(t.client->Append(Chunk(seq.sequence_id, 0, 5, 20, k, k)),
              StatusIs(Code::kFailedPrecondition));
  KVC_ASSERT_OK(t.client->Fetch(seq.sequence_id, {}));

  const std::string response = ::kvc::testing::HttpGet(t.server->metrics_address(), "/metrics");
  ASSERT_NE(response.find("200 OK"), std::string::npos) << response.substr(0, 200);
  const std::string body = response.substr(response.find("\r\n\r\n") + 3);
  EXPECT_EQ(
      MetricSample(body,
                   R"(kvc_rpc_requests_total{code="OK",method="Append",service="KvCacheService"})"),
      4);
  EXPECT_EQ(
      MetricSample(
          body,
          R"(kvc_rpc_requests_total{code="FAILED_PRECONDITION",method="Append",service="KvCacheService"})"),
      1);
  EXPECT_EQ(
      MetricSample(body,
                   R"(kvc_rpc_duration_seconds_count{method="Append",service="KvCacheService"})"),
      5);
  const double payload = 2.0 * kLayers * k.size();
  EXPECT_EQ(MetricSample(body, R"(kvc_rpc_received_bytes_total{method="Append"})"), payload);
  EXPECT_EQ(MetricSample(body, R"(kvc_rpc_sent_bytes_total{method="Fetch"})"), payload);
  const int64_t block = static_cast<int64_t>(
      kernels::MakeBlockLayout(kernels::StorageFormat::kF16, kDim, 16).block_bytes);
  EXPECT_EQ(MetricSample(body, R"(kvc_pool_used_bytes{format="f16",pool="small"})"),
            2.0 * kLayers * kHeads * block);
  EXPECT_EQ(MetricSample(body, R"(kvc_pool_blocks{pool="small",state="used"})"),
            2.0 * kLayers * kHeads);
  // The pool's device (cuda:0 when this suite runs on a device pool).
  EXPECT_EQ(MetricSample(body, absl::StrCat(R"(kvc_pool_info{device=")", testing::TestPoolDevice(),
                                            R"(",pool="small"})")),
            1);
  // kvcachectl pools reads the same from ListPools.
  KVC_ASSERT_OK_AND_ASSIGN(std::vector<client::PoolInfo> pools,
                           client::AdminClient::Over(*t.client).ListPools());
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].device, testing::TestPoolDevice());
  EXPECT_EQ(pools[0].used_bytes, 2 * kLayers * kHeads * block);
  EXPECT_EQ(MetricSample(body, R"(kvc_sequences{pool="small"})"), 1);
  EXPECT_EQ(MetricSample(body, R"(kvc_visible_tokens{pool="small"})"), 20);
  EXPECT_EQ(MetricSample(body, R"(kvc_stored_token_heads{pool="small"})"), 20.0 * kLayers * kHeads);
  EXPECT_NEAR(MetricSample(body, R"(kvc_compression_ratio{pool="small"})"),
              payload / (2.0 * kLayers * kHeads * block), 1e-9);
  EXPECT_EQ(MetricSample(body, R"(kvc_draining)"), 0);
  EXPECT_EQ(MetricSample(body, R"(kvc_build_info{version="0.1.0"})"), 1);
}

// kvc_process_resident_bytes follows the pages kvcached touches: a host pool's blocks live in a
// memfd (shmem), so appending N MiB raises the shmem kind by about N MiB. Releasing the
// sequence keeps the freed blocks' pages up to the pool's keep_free_bytes (all of them when it
// is the capacity) and returns the rest to the OS, which kvc_pool_released_bytes_total counts.
TEST(OperabilityTest, ResidentMemoryFollowsAppendsAndReleasesPastKeepFreeBytes) {
  constexpr int64_t kKeep = 4 << 20;
  for (const bool keep_all : {true, false}) {
    SCOPED_TRACE(keep_all ? "keep every page" : "keep 4 MiB");
    cachesvc::ServerOptions options = WithMetrics();
    cachesvc::PoolOptions& pool = options.store.pools[0];
    pool.device = "cpu";
    pool.keep_free_bytes = keep_all ? pool.capacity_bytes : kKeep;
    auto t = ::kvc::testing::StartTestServer(options);
    const auto sample = [&](const std::string& series) {
      const std::string response = ::kvc::testing::HttpGet(t.server->metrics_address(), "/metrics");
      return MetricSample(response.substr(response.find("\r\n\r\n") + 3), series);
    };
    const auto shmem = [&] { return sample(R"(kvc_process_resident_bytes{kind="shmem"})"); };
    const std::string released = R"(kvc_pool_released_bytes_total{pool=")" + pool.name + "\"}";
    const std::string free_resident = R"(kvc_pool_free_resident_bytes{pool=")" + pool.name + "\"}";
    const double before = shmem();
    KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo seq, t.client->CreateSequence({}));
    constexpr int kChunk = 1024, kChunks = 8;
    const std::string k =
        MakeKv(2, 0, 0, kChunk, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false);
    for (int c = 0; c < kChunks; ++c) {
      for (int l = 0; l < kLayers; ++l) {
        KVC_ASSERT_OK(
            t.client->Append(Chunk(seq.sequence_id, l, int64_t{c} * kChunk, kChunk, k, k)));
      }
    }
    const double appended = 2.0 * kChunks * kLayers * static_cast<double>(k.size());  // 16 MiB
    const double after = shmem();
    EXPECT_GE(after - before, 0.95 * appended) << before << " -> " << after;
    KVC_ASSERT_OK(t.client->Release(seq.sequence_id).status());
    if (keep_all) {
      EXPECT_GE(shmem(), after - (1 << 20));
      EXPECT_GE(sample(free_resident), appended);
      EXPECT_EQ(sample(released), 0);
      continue;
    }
    // The trimmer works in the background, a segment or a batch at a time: wait until it is
    // done (seconds at most), down to half of keep_free_bytes.
    for (int i = 0;
         i < 500 && (sample(released) < appended - kKeep || sample(free_resident) > kKeep / 2);
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GE(sample(released), appended - kKeep);
    EXPECT_LE(sample(free_resident), kKeep / 2);
    EXPECT_LE(shmem(), after - (appended - kKeep)) << before << " -> " << after;
  }
}

TEST(OperabilityTest, HealthFollowsDrainAndDrainRefusesNewSequences) {
  auto t = ::kvc::testing::StartTestServer(WithMetrics());
  auto channel = grpc::CreateChannel(t.server->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto admin = kvcache::v1::AdminService::NewStub(channel);
  auto check = [&] {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status s = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.status();
  };
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::SERVING);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo seq, t.client->CreateSequence({}));

  kvcache::v1::DrainRequest drain;
  kvcache::v1::DrainResponse drained;
  grpc::ClientContext ctx;
  ASSERT_TRUE(admin->Drain(&ctx, drain, &drained).ok());
  EXPECT_TRUE(drained.draining());
  EXPECT_EQ(drained.sequences(), 1);
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_THAT(t.client->CreateSequence({}), StatusIs(Code::kUnavailable, "draining"));
  const std::string k = MakeKv(1, 0, 0, 4, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false);
  KVC_EXPECT_OK(t.client->Append(Chunk(seq.sequence_id, 0, 0, 4, k, k)));  // existing work goes on

  drain.set_resume(true);
  grpc::ClientContext ctx2;
  ASSERT_TRUE(admin->Drain(&ctx2, drain, &drained).ok());
  EXPECT_FALSE(drained.draining());
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::SERVING);
  KVC_EXPECT_OK(t.client->CreateSequence({}));
}

TEST(OperabilityTest, ReflectionListsTheServices) {
  auto t = ::kvc::testing::StartTestServer(WithMetrics());
  auto channel = grpc::CreateChannel(t.server->address(), grpc::InsecureChannelCredentials());
  // A raw bidi call: the generated reflection types live inside libgrpc++_reflection, so the
  // request is encoded by hand: ServerReflectionRequest{list_services: ""} = field 7, len 0.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &ctx));
  const char request_bytes[] = {0x3a, 0x00};
  grpc::Slice slice(request_bytes, sizeof request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  grpc::ByteBuffer reply;
  ASSERT_TRUE(stream->Read(&reply));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_TRUE(stream->Finish().ok());
  for (const char* service :
       {"kvcache.v1.KvCacheService", "kvcache.v1.AdminService", "grpc.health.v1.Health"}) {
    EXPECT_NE(bytes.find(service), std::string::npos) << service;
  }
}

TEST(OperabilityTest, EvictFreesAndCountsEvictedTokens) {
  auto t = ::kvc::testing::StartTestServer(WithMetrics());
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo seq, t.client->CreateSequence({}));
  const std::string k = MakeKv(1, 0, 0, 10, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false);
  for (int l = 0; l < kLayers; ++l)
    KVC_ASSERT_OK(t.client->Append(Chunk(seq.sequence_id, l, 0, 10, k, k)));
  auto admin = kvcache::v1::AdminService::NewStub(
      grpc::CreateChannel(t.server->address(), grpc::InsecureChannelCredentials()));
  kvcache::v1::EvictSequenceRequest request;
  request.set_sequence_id(seq.sequence_id);
  kvcache::v1::EvictSequenceResponse response;
  grpc::ClientContext ctx;
  ASSERT_TRUE(admin->EvictSequence(&ctx, request, &response).ok());
  EXPECT_EQ(response.freed_blocks(), kLayers * kHeads);
  grpc::ClientContext ctx2;
  EXPECT_EQ(admin->EvictSequence(&ctx2, request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  KVC_ASSERT_OK_AND_ASSIGN(auto stats, t.server->store()->stats().GetPoolStats(""));
  ASSERT_FALSE(stats.evicted_token_heads.empty());
  EXPECT_EQ(stats.evicted_token_heads[0].first, "operator");
  EXPECT_EQ(stats.evicted_token_heads[0].second, 10 * kLayers * kHeads);
  const std::string body = ::kvc::testing::HttpGet(t.server->metrics_address(), "/metrics");
  EXPECT_NE(body.find(R"(kvc_evicted_tokens_total{policy="operator",pool="small"} 80)"),
            std::string::npos);
}

TEST(OperabilityTest, ShutdownDuringTrafficLosesNoAcknowledgedAppend) {
  auto t = ::kvc::testing::StartTestServer(WithMetrics());
  constexpr int kWriters = 4, kTokens = 8;
  std::vector<std::string> ids(kWriters);
  for (auto& id : ids) {
    auto s = t.client->CreateSequence({});
    ASSERT_TRUE(s.ok());
    id = s->sequence_id;
  }
  std::vector<std::vector<int64_t>> acked(kWriters, std::vector<int64_t>(kLayers, 0));
  std::atomic<int> total_acked{0};
  std::vector<std::thread> writers;
  writers.reserve(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int64_t pos = 0;; pos += kTokens) {
        for (int l = 0; l < kLayers; ++l) {
          const std::string k =
              MakeKv(w, l, pos, kTokens, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false);
          if (!t.client->Append(Chunk(ids[static_cast<size_t>(w)], l, pos, kTokens, k, k)).ok())
            return;
          acked[static_cast<size_t>(w)][static_cast<size_t>(l)] = pos + kTokens;
          ++total_acked;
        }
      }
    });
  }
  while (total_acked.load() < 200) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  t.server->Shutdown(absl::Seconds(5));
  t.server->Wait();
  for (auto& w : writers) w.join();
  // Every acknowledged append is in the store; at most the one in flight per writer may
  // have landed without its acknowledgement reaching the client.
  for (int w = 0; w < kWriters; ++w) {
    KVC_ASSERT_OK_AND_ASSIGN(auto s, t.server->store()->GetSequence(ids[static_cast<size_t>(w)]));
    int unacked = 0;
    for (int l = 0; l < kLayers; ++l) {
      const int64_t a = acked[static_cast<size_t>(w)][static_cast<size_t>(l)];
      EXPECT_GE(s.layer_tokens[static_cast<size_t>(l)], a) << "writer " << w << " layer " << l;
      unacked += static_cast<int>((s.layer_tokens[static_cast<size_t>(l)] - a) / kTokens);
    }
    EXPECT_LE(unacked, 1) << "writer " << w;
  }
}

}  // namespace
}  // namespace kvc
