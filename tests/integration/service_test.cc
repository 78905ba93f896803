// Every RPC and every error, through the real client library and a real gRPC server on
// 127.0.0.1:0 in this process.
#include <grpcpp/grpcpp.h>

#include <thread>

#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using client::AppendChunk;
using client::DType;
using ::kvc::testing::MakeHeadKv;
using ::kvc::testing::MakeKv;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

constexpr int kLayers = 4, kHeads = 2, kDim = 32;

struct Payload {
  std::string keys, values;
};

Payload MakePayload(int layer, int64_t start, int n, uint32_t seed = 7) {
  return {MakeKv(seed, layer, start, n, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false),
          MakeKv(seed, layer, start, n, kHeads, kDim, kernels::DType::kF16, /*is_value=*/true)};
}

AppendChunk Chunk(const std::string& id, int layer, int64_t start, int n, const Payload& p) {
  AppendChunk c;
  c.sequence_id = id;
  c.layer = layer;
  c.start_position = start;
  c.num_tokens = n;
  c.dtype = DType::kF16;
  c.keys = p.keys.data();
  c.values = p.values.data();
  c.bytes = p.keys.size();
  return c;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions());
  }

  std::string NewSequence() {
    auto s = t_.client->CreateSequence({});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->sequence_id : "";
  }

  void AppendAll(const std::string& id, int64_t start, int n) {
    for (int l = 0; l < kLayers; ++l) {
      const Payload p = MakePayload(l, start, n);
      KVC_ASSERT_OK(t_.client->Append(Chunk(id, l, start, n, p)));
    }
  }

  ::kvc::testing::TestServer t_;
};

TEST_F(ServiceTest, CreateAppendFetchGetRelease) {
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info,
                           t_.client->CreateSequence({"small", "team-a", "req-1", {}, {}}));
  EXPECT_EQ(info.sequence_id, "req-1");
  EXPECT_EQ(info.pool, "small");
  EXPECT_EQ(info.tenant, "team-a");
  AppendAll("req-1", 0, 21);
  KVC_ASSERT_OK_AND_ASSIGN(client::FetchResult kv, t_.client->Fetch("req-1", {}));
  EXPECT_EQ(kv.visible_tokens, 21);
  ASSERT_EQ(kv.heads.size(), static_cast<size_t>(kLayers * kHeads));
  for (const auto& h : kv.heads) {
    EXPECT_EQ(h.keys, MakeHeadKv(7, h.layer, h.kv_head, 0, 21, kDim, kernels::DType::kF16, false));
    EXPECT_EQ(h.values, MakeHeadKv(7, h.layer, h.kv_head, 0, 21, kDim, kernels::DType::kF16, true));
    ASSERT_EQ(h.positions.size(), 21u);
    EXPECT_EQ(h.positions[20], 20);
  }
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo got, t_.client->GetSequence("req-1"));
  EXPECT_EQ(got.visible_tokens, 21);
  EXPECT_EQ(got.layer_tokens, (std::vector<int64_t>{21, 21, 21, 21}));
  EXPECT_EQ(got.stored_token_heads, 21 * kLayers * kHeads);
  const int64_t block_bytes = static_cast<int64_t>(
      kernels::MakeBlockLayout(kernels::StorageFormat::kF16, kDim, 16).block_bytes);
  EXPECT_EQ(got.bytes, 2 * kLayers * kHeads * block_bytes);  // 21 tokens = 2 blocks per head
  KVC_ASSERT_OK_AND_ASSIGN(client::ReleaseResult released, t_.client->Release("req-1"));
  EXPECT_EQ(released.freed_blocks, 2 * kLayers * kHeads);  // 21 tokens = 2 blocks per head
  EXPECT_THAT(t_.client->GetSequence("req-1"), StatusIs(Code::kNotFound, "req-1"));
}

TEST_F(ServiceTest, FetchSelectedLayersInAnotherDtypeAndStoredFormat) {
  const std::string id = NewSequence();
  AppendAll(id, 0, 5);
  client::FetchOptions options;
  options.layers = {2};
  options.dtype = DType::kF32;
  KVC_ASSERT_OK_AND_ASSIGN(client::FetchResult kv, t_.client->Fetch(id, options));
  ASSERT_EQ(kv.heads.size(), 2u);
  EXPECT_EQ(kv.dtype, DType::kF32);
  EXPECT_EQ(kv.heads[1].keys, MakeHeadKv(7, 2, 1, 0, 5, kDim, kernels::DType::kF32, false));
  options.dtype = DType::kPoolDefault;
  options.stored_format = true;
  KVC_ASSERT_OK_AND_ASSIGN(kv, t_.client->Fetch(id, options));
  EXPECT_EQ(kv.storage, client::StorageFormat::kF16);
  EXPECT_EQ(kv.record_bytes, 2 * kDim);
  EXPECT_EQ(kv.heads[0].keys, MakeHeadKv(7, 2, 0, 0, 5, kDim, kernels::DType::kF16, false));
}

TEST_F(ServiceTest, FetchChunksStayBelowTheMessageLimit) {
  const std::string id = NewSequence();
  // 9000 tokens x 2 heads x 32 dims x 2 bytes = 1.1 MiB per layer's keys.
  for (int l = 0; l < kLayers; ++l) {
    const Payload p = MakePayload(l, 0, 9000);
    KVC_ASSERT_OK(t_.client->Append(Chunk(id, l, 0, 9000, p)));
  }
  int chunks = 0;
  client::FetchOptions options;
  options.max_chunk_bytes = 256 << 10;
  KVC_ASSERT_OK(t_.client->FetchChunks(
      id, options,
      [&](client::FetchedChunk& c) {
        ++chunks;
        EXPECT_LE(c.keys.size() + c.values.size(), 256u << 10);
        EXPECT_EQ(c.keys, MakeHeadKv(7, c.layer, c.kv_head, c.first_index, c.num_tokens, kDim,
                                     kernels::DType::kF16, false));
        return absl::OkStatus();
      },
      {}));
  EXPECT_EQ(chunks, kLayers * kHeads * 5);  // 9000 tokens / 2048 per chunk
}

TEST_F(ServiceTest, AppendStreamAppliesEveryMessage) {
  const std::string id = NewSequence();
  auto stream = t_.client->StartAppendStream();
  std::vector<Payload> payloads;
  for (int step = 0; step < 3; ++step) {
    for (int l = 0; l < kLayers; ++l) {
      payloads.push_back(MakePayload(l, step * 100, 100));
      KVC_ASSERT_OK(stream->Write(Chunk(id, l, step * 100, 100, payloads.back())));
    }
  }
  KVC_ASSERT_OK_AND_ASSIGN(client::AppendStreamResult r, stream->Finish());
  EXPECT_EQ(r.messages, 3 * kLayers);
  EXPECT_EQ(r.tokens, 300 * kLayers);
  EXPECT_EQ(r.visible_tokens, 300);
}

TEST_F(ServiceTest, AppendStreamReportsHowFarItGot) {
  const std::string id = NewSequence();
  auto stream = t_.client->StartAppendStream();
  const Payload p0 = MakePayload(0, 0, 10);
  const Payload p1 = MakePayload(0, 50, 10);
  KVC_ASSERT_OK(stream->Write(Chunk(id, 0, 0, 10, p0)));
  (void)stream->Write(Chunk(id, 0, 50, 10, p1));  // out of order
  EXPECT_THAT(stream->Finish(),
              StatusIs(Code::kFailedPrecondition, "1 earlier messages were applied"));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, t_.client->GetSequence(id));
  EXPECT_EQ(info.layer_tokens[0], 10);
}

TEST_F(ServiceTest, EveryBadRequestGetsItsOwnStatus) {
  const std::string id = NewSequence();
  const Payload p = MakePayload(0, 0, 4);
  AppendChunk c = Chunk(id, 0, 0, 4, p);

  c.layer = 9;
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kInvalidArgument, "layer 9 is out of range"));
  c = Chunk(id, 0, 0, 4, p);
  c.num_tokens = 0;
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kInvalidArgument, "num_tokens is 0"));
  c.num_tokens = 1 << 30;
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kInvalidArgument, "num_tokens is 1073741824"));
  c = Chunk(id, 0, -5, 4, p);
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kInvalidArgument, "start_position is -5"));
  c = Chunk(id, 0, 0, 4, p);
  c.bytes = 100;
  EXPECT_THAT(t_.client->Append(c),
              StatusIs(Code::kInvalidArgument, "keys has 100 bytes; expected"));
  c = Chunk(id, 0, 0, 4, p);
  c.dtype = DType::kF32;  // bytes are f16-sized
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kInvalidArgument, "4 bytes (f32)"));
  c = Chunk(id, 0, 3, 4, p);
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kFailedPrecondition, "must start at 0"));
  c = Chunk("no-such-seq", 0, 0, 4, p);
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kNotFound, "'no-such-seq' not found"));
  c = Chunk("", 0, 0, 4, p);
  EXPECT_THAT(t_.client->Append(c), StatusIs(Code::kInvalidArgument, "sequence_id is empty"));

  client::FetchOptions bad_layers;
  bad_layers.layers = {0, 4};
  EXPECT_THAT(t_.client->Fetch(id, bad_layers),
              StatusIs(Code::kInvalidArgument, "layers contains 4"));
  EXPECT_THAT(t_.client->Fetch("gone", {}), StatusIs(Code::kNotFound));
  EXPECT_THAT(t_.client->Release("gone"), StatusIs(Code::kNotFound));
  EXPECT_THAT(t_.client->CreateSequence({"nopool", "", "", {}, {}}),
              StatusIs(Code::kNotFound, "pool 'nopool' not found"));
  EXPECT_THAT(t_.client->CreateSequence({"", std::string(200, 't'), "", {}, {}}),
              StatusIs(Code::kInvalidArgument, "tenant"));
  EXPECT_THAT(t_.client->CreateSequence({"", "", id, {}, {}}), StatusIs(Code::kAlreadyExists));
  EXPECT_THAT(kvc::client::AdminClient::Over(*t_.client).GetPoolStats("nopool"),
              StatusIs(Code::kNotFound));

  // Nothing above changed the sequence.
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, t_.client->GetSequence(id));
  EXPECT_EQ(info.layer_tokens, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(info.bytes, 0);
}

TEST_F(ServiceTest, RawEnumValuesOutsideTheContractAreRejected) {
  // Bypass the client library to send numbers the typed API cannot express.
  auto channel = grpc::CreateChannel(t_.server->address(), grpc::InsecureChannelCredentials());
  auto stub = kvcache::v1::KvCacheService::NewStub(channel);
  const std::string id = NewSequence();
  kvcache::v1::AppendRequest request;
  request.set_sequence_id(id);
  request.set_num_tokens(1);
  request.set_dtype(static_cast<kvcache::v1::DType>(42));
  kvcache::v1::AppendResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->Append(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("dtype is 42"), std::string::npos);

  kvcache::v1::CreateSequenceRequest create;
  create.mutable_policy()->set_storage(static_cast<kvcache::v1::StorageFormat>(99));
  kvcache::v1::SequenceInfo info;
  grpc::ClientContext context2;
  const grpc::Status bad_format = stub->CreateSequence(&context2, create, &info);
  EXPECT_EQ(bad_format.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad_format.error_message().find("storage is 99"), std::string::npos)
      << bad_format.error_message();
}

TEST(ServiceLimitsTest, PoolFullIsResourceExhaustedAndChangesNothing) {
  // 8 blocks: one 16-token append of 4 layers x 2 heads fills the pool exactly.
  const int64_t block = static_cast<int64_t>(
      kernels::MakeBlockLayout(kernels::StorageFormat::kF16, kDim, 16).block_bytes);
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions(8 * block));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo seq, t.client->CreateSequence({}));
  for (int l = 0; l < kLayers; ++l) {
    const Payload p = MakePayload(l, 0, 16);
    KVC_ASSERT_OK(t.client->Append(Chunk(seq.sequence_id, l, 0, 16, p)));
  }
  const Payload p = MakePayload(0, 16, 1);
  EXPECT_THAT(t.client->Append(Chunk(seq.sequence_id, 0, 16, 1, p)),
              StatusIs(Code::kResourceExhausted, "pool 'small' is full"));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, t.client->GetSequence(seq.sequence_id));
  EXPECT_EQ(info.layer_tokens[0], 16);
  KVC_ASSERT_OK(t.client->Release(seq.sequence_id));
  KVC_ASSERT_OK_AND_ASSIGN(client::PoolStats stats,
                           kvc::client::AdminClient::Over(*t.client).GetPoolStats("small"));
  EXPECT_EQ(stats.used_blocks, 0);
}

TEST(ServiceLimitsTest, MessageTooLargeIsResourceExhausted) {
  auto options = ::kvc::testing::SmallServerOptions();
  options.max_message_bytes = 256 << 10;
  auto t = ::kvc::testing::StartTestServer(options);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo seq, t.client->CreateSequence({}));
  const Payload p = MakePayload(0, 0, 4096);  // 2 x 512 KiB
  EXPECT_THAT(t.client->Append(Chunk(seq.sequence_id, 0, 0, 4096, p)),
              StatusIs(Code::kResourceExhausted, "larger than max"));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo info, t.client->GetSequence(seq.sequence_id));
  EXPECT_EQ(info.layer_tokens[0], 0);
}

TEST_F(ServiceTest, AdminCallsDescribePoolsAndSequences) {
  const std::string a = NewSequence();
  AppendAll(a, 0, 40);
  KVC_ASSERT_OK_AND_ASSIGN(auto pools, kvc::client::AdminClient::Over(*t_.client).ListPools());
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].name, "small");
  EXPECT_EQ(pools[0].geometry.num_layers, kLayers);
  EXPECT_EQ(pools[0].geometry.num_query_heads, 4);
  EXPECT_EQ(pools[0].sequences, 1);
  EXPECT_EQ(pools[0].total_blocks - pools[0].free_blocks, 3 * kLayers * kHeads);
  KVC_ASSERT_OK_AND_ASSIGN(client::PoolStats stats,
                           kvc::client::AdminClient::Over(*t_.client).GetPoolStats(""));
  EXPECT_EQ(stats.sequences, 1);
  EXPECT_EQ(stats.visible_tokens, 40);
  EXPECT_EQ(stats.used_blocks, 3 * kLayers * kHeads);
  EXPECT_EQ(stats.appended_bytes_total, 2 * 40 * kLayers * kHeads * kDim * 2);
  EXPECT_EQ(stats.used_bytes + stats.free_bytes, stats.capacity_bytes);
  KVC_ASSERT_OK(t_.client->CreateSequence({"", "tenant-b", "b1", {}, {}}));
  client::ListSequencesOptions filter;
  filter.tenant = "tenant-b";
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceList list,
                           kvc::client::AdminClient::Over(*t_.client).ListSequences(filter));
  ASSERT_EQ(list.sequences.size(), 1u);
  EXPECT_EQ(list.sequences[0].sequence_id, "b1");
  KVC_ASSERT_OK_AND_ASSIGN(list, kvc::client::AdminClient::Over(*t_.client).ListSequences({}));
  EXPECT_EQ(list.total, 2);
}

TEST_F(ServiceTest, ManyClientsAtOnce) {
  constexpr int kThreads = 6;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  std::vector<absl::Status> results(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto seq = t_.client->CreateSequence({});
      if (!seq.ok()) {
        results[static_cast<size_t>(i)] = seq.status();
        return;
      }
      for (int l = 0; l < kLayers; ++l) {
        const Payload p = MakePayload(l, 0, 50, /*seed=*/1000 + i);
        auto r = t_.client->Append(Chunk(seq->sequence_id, l, 0, 50, p));
        if (!r.ok()) results[static_cast<size_t>(i)] = r.status();
      }
      auto kv = t_.client->Fetch(seq->sequence_id, {});
      if (!kv.ok()) {
        results[static_cast<size_t>(i)] = kv.status();
        return;
      }
      for (const auto& h : kv->heads) {
        if (h.keys != MakeHeadKv(1000 + i, h.layer, h.kv_head, 0, 50, kDim, kernels::DType::kF16,
                                 /*is_value=*/false)) {
          results[static_cast<size_t>(i)] = absl::InternalError("another client's data");
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) KVC_EXPECT_OK(r);
}

}  // namespace
}  // namespace kvc
