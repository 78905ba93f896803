// Appends over an NCCL transfer (NcclLink::Append; nccl_fixture.h): what gRPC appends,
// refusals that leave the link usable, a transfer the server closed, bytes that never come,
// receive buffers charged to a per-tenant and a server budget; and, on two real GPUs (the GPU
// bundle), appends and fetches between them.
#include "client/src/transfer_rpcs.h"
#include "tests/integration/nccl_fixture.h"

namespace kvc {
namespace {

using namespace nccl_testing;  // NOLINT(google-build-using-namespace): the suites' fixture

// One layer's keys and values of tokens [start, start + n), in host memory and on the device.
struct Chunk {
  std::string keys, values;
  void* device_keys = nullptr;
  void* device_values = nullptr;
};

class NcclAppendTest : public NcclTransferTest {
 protected:
  void SetUp() override {
    NcclTransferTest::SetUp();
    client::NcclLink::Options o;
    o.pool = "small";
    o.library = LoopbackPath();
    absl::StatusOr<std::unique_ptr<client::NcclLink>> link =
        client::NcclLink::Open(t_.client.get(), o);
    ASSERT_TRUE(link.ok()) << link.status();
    link_ = *std::move(link);
  }
  Chunk Make(int layer, int64_t start, int n) {
    Chunk c;
    c.keys = testing::MakeKv(5, layer, start, n, testing::kHeads, testing::kDim,
                             kernels::DType::kF16, /*is_value=*/false);
    c.values = testing::MakeKv(5, layer, start, n, testing::kHeads, testing::kDim,
                               kernels::DType::kF16, /*is_value=*/true);
    c.device_keys = Device(c.keys.size());
    c.device_values = Device(c.values.size());
    ToDevice(c.device_keys, c.keys.data(), c.keys.size());
    ToDevice(c.device_values, c.values.data(), c.values.size());
    return c;
  }
  static client::AppendChunk Request(const std::string& id, int layer, int64_t start, int n,
                                     const void* keys, const void* values, size_t bytes) {
    client::AppendChunk a;
    a.sequence_id = id;
    a.layer = layer;
    a.start_position = start;
    a.num_tokens = n;
    a.dtype = client::DType::kF16;
    a.keys = keys;
    a.values = values;
    a.bytes = bytes;
    return a;
  }
  // An Append whose bytes this test sends itself (or not): the raw protocol.
  std::future<grpc::Status> AppendOver(const std::string& transfer, const std::string& id,
                                       uint64_t nonce, int n, int deadline_s = 60) {
    return std::async(std::launch::async, [=] {
      grpc::ClientContext ctx;
      Authorize(&ctx);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
      pb::AppendRequest r;
      r.set_sequence_id(id);
      r.set_num_tokens(n);
      r.set_dtype(pb::DTYPE_F16);
      r.mutable_nccl()->set_transfer_id(transfer);
      r.mutable_nccl()->set_nonce(nonce);
      r.mutable_nccl()->set_bytes(int64_t{n} * testing::kHeads * testing::kDim * 2);
      pb::AppendResponse appended;
      return kv_->Append(&ctx, r, &appended);
    });
  }
  nccl::Result SendHeader(uint64_t nonce, uint64_t payload_bytes) {
    char host[transfer::kHeaderBytes];
    transfer::EncodeHeader({nonce, payload_bytes, 0}, host);
    void* d = Device(sizeof(host));
    ToDevice(d, host, sizeof(host));
    const nccl::Result r = api_.send(d, sizeof(host), nccl::kUint8, 0, comm_, nullptr);
    return r == nccl::kInProgress ? Settle() : r;
  }

  std::unique_ptr<client::NcclLink> link_;
};

// NcclLink::Append from device buffers stores what Append over gRPC stores from the same
// bytes: every Fetch of the two sequences is equal, raw f16 and INT4 with a raw residual.
TEST_F(NcclAppendTest, TheLinkAppendsWhatGrpcAppends) {
  for (const client::CreateSequenceOptions& spec :
       {client::CreateSequenceOptions{}, Int4WithResidual()}) {
    KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo over_nccl, t_.client->CreateSequence(spec));
    KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo over_grpc, t_.client->CreateSequence(spec));
    for (int l = 0; l < testing::kLayers; ++l) {
      for (const auto& [start, n] : {std::pair<int64_t, int>{0, 60}, {60, 40}, {100, 1}}) {
        const Chunk c = Make(l, start, n);
        KVC_ASSERT_OK_AND_ASSIGN(
            const client::AppendResult mine,
            link_->Append(Request(over_nccl.sequence_id, l, start, n, c.device_keys,
                                  c.device_values, c.keys.size())));
        KVC_ASSERT_OK_AND_ASSIGN(
            const client::AppendResult theirs,
            t_.client->Append(Request(over_grpc.sequence_id, l, start, n, c.keys.data(),
                                      c.values.data(), c.keys.size())));
        EXPECT_EQ(mine.layer_tokens, start + n);
        EXPECT_EQ(mine.layer_tokens, theirs.layer_tokens);
        EXPECT_EQ(mine.visible_tokens, theirs.visible_tokens);
      }
    }
    for (const client::FetchOptions& fetch : testing::FetchCases()) {
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult a,
                               t_.client->Fetch(over_nccl.sequence_id, fetch));
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult b,
                               t_.client->Fetch(over_grpc.sequence_id, fetch));
      ASSERT_FALSE(a.heads.empty());
      testing::ExpectSame(a, b);
    }
  }
}

// What the server refuses after receiving the bytes leaves the link in step: the next append
// works. What the link refuses itself sends nothing.
TEST_F(NcclAppendTest, RefusedAppendsLeaveTheLinkUsable) {
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo seq, t_.client->CreateSequence({}));
  const Chunk c = Make(0, 0, 10);
  const size_t bytes = c.keys.size();
  EXPECT_THAT(
      link_->Append(Request(seq.sequence_id, 0, 0, 10, nullptr, c.device_values, bytes)).status(),
      testing::StatusIs(absl::StatusCode::kInvalidArgument, "device keys and values"));
  EXPECT_THAT(
      link_->Append(Request(seq.sequence_id, 0, 5, 10, c.device_keys, c.device_values, bytes))
          .status(),
      testing::StatusIs(absl::StatusCode::kFailedPrecondition, "out of order"));
  EXPECT_THAT(
      link_->Append(Request(seq.sequence_id, 0, 0, 8, c.device_keys, c.device_values, bytes))
          .status(),
      testing::StatusIs(absl::StatusCode::kInvalidArgument, "expected num_tokens 8"));
  EXPECT_THAT(link_
                  ->Append(Request(seq.sequence_id, testing::kLayers, 0, 10, c.device_keys,
                                   c.device_values, bytes))
                  .status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "out of range"));
  client::CreateSequenceOptions on_host;
  on_host.pool = "host";
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo host_seq, t_.client->CreateSequence(on_host));
  EXPECT_THAT(
      link_->Append(Request(host_seq.sequence_id, 0, 0, 10, c.device_keys, c.device_values, bytes))
          .status(),
      testing::StatusIs(absl::StatusCode::kInvalidArgument, "on the host"));
  EXPECT_THAT(
      link_->Append(Request("no-such-sequence", 0, 0, 10, c.device_keys, c.device_values, bytes))
          .status(),
      testing::StatusIs(absl::StatusCode::kNotFound));
  KVC_ASSERT_OK_AND_ASSIGN(
      const client::AppendResult ok,
      link_->Append(Request(seq.sequence_id, 0, 0, 10, c.device_keys, c.device_values, bytes)));
  EXPECT_EQ(ok.layer_tokens, 10);
  client::FetchOptions unfinished;
  unfinished.include_unfinished = true;
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult got,
                           t_.client->Fetch(seq.sequence_id, unfinished));
  ASSERT_EQ(got.heads.size(), static_cast<size_t>(testing::kHeads));
  EXPECT_EQ(got.heads[0].positions.size(), 10u);
}

// A transfer the server no longer has: the Append is refused before any byte is taken, the
// link gives its sends up (at once, or 2 s after the refusal) and is broken afterwards.
TEST_F(NcclAppendTest, AnAppendOnATransferTheServerClosedFailsAndBreaksTheLink) {
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo seq, t_.client->CreateSequence({}));
  const std::string described = link_->Describe();
  const size_t at = described.find("transfer ");
  ASSERT_NE(at, std::string::npos) << described;
  KVC_ASSERT_OK(client::internal::CloseTransfer(*t_.client, described.substr(at + 9)));
  const Chunk c = Make(0, 0, 10);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_THAT(link_
                  ->Append(Request(seq.sequence_id, 0, 0, 10, c.device_keys, c.device_values,
                                   c.keys.size()))
                  .status(),
              testing::StatusIs(absl::StatusCode::kNotFound, "does not exist"));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  EXPECT_THAT(link_
                  ->Append(Request(seq.sequence_id, 0, 0, 10, c.device_keys, c.device_values,
                                   c.keys.size()))
                  .status(),
              testing::StatusIs(absl::StatusCode::kUnavailable, "broke earlier"));
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo info,
                           t_.client->GetSequence(seq.sequence_id));
  EXPECT_EQ(info.layer_tokens, std::vector<int64_t>(testing::kLayers, 0));
}

// AppendStream's messages may be applied out of order: NCCL bytes go with Append only.
TEST_F(NcclAppendTest, AppendStreamRefusesNccl) {
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo seq, t_.client->CreateSequence({}));
  grpc::ClientContext ctx;
  pb::AppendStreamResponse response;
  std::unique_ptr<grpc::ClientWriter<pb::AppendRequest>> w = kv_->AppendStream(&ctx, &response);
  pb::AppendRequest r;
  r.set_sequence_id(seq.sequence_id);
  r.set_num_tokens(1);
  r.mutable_nccl()->set_transfer_id("n-1");
  r.mutable_nccl()->set_bytes(testing::kHeads * testing::kDim * 2);
  w->Write(r);
  w->WritesDone();
  const grpc::Status s = w->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("with Append"), std::string::npos) << s.error_message();
}

// Bytes that never come: the Append fails (the call's deadline), nothing is appended, and the
// transfer is broken for good (its byte stream is out of step).
TEST_F(NcclAppendTest, AnAppendWhoseBytesNeverComeBreaksTheTransfer) {
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo seq, t_.client->CreateSequence({}));
  const std::string transfer = OpenAndJoin();
  const grpc::Status late = AppendOver(transfer, seq.sequence_id, 3, 10, /*deadline_s=*/2).get();
  EXPECT_EQ(late.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << late.error_message();
  // Its bytes after all: the transfer is closed, they are never taken for the next call's.
  const grpc::Status after = AppendOver(transfer, seq.sequence_id, 4, 10).get();
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAVAILABLE) << after.error_message();
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo info,
                           t_.client->GetSequence(seq.sequence_id));
  EXPECT_EQ(info.layer_tokens, std::vector<int64_t>(testing::kLayers, 0));
}

// Two Appends racing on one transfer: the header that arrives is not this call's, so it is
// refused (ABORTED) and nothing is appended from bytes of another call.
TEST_F(NcclAppendTest, AHeaderOfAnotherCallIsRefused) {
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo seq, t_.client->CreateSequence({}));
  const std::string transfer = OpenAndJoin();
  std::future<grpc::Status> appending = AppendOver(transfer, seq.sequence_id, 5, 10);
  EXPECT_EQ(SendHeader(/*nonce=*/6, 2 * 10 * testing::kHeads * testing::kDim * 2), nccl::kSuccess);
  const grpc::Status s = appending.get();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  EXPECT_NE(s.error_message().find("another call's"), std::string::npos) << s.error_message();
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo info,
                           t_.client->GetSequence(seq.sequence_id));
  EXPECT_EQ(info.layer_tokens, std::vector<int64_t>(testing::kLayers, 0));
}

// The buffers Appends are received into are charged to budgets (ServerConfig
// transfer_nccl_receive_bytes_per_tenant and transfer_nccl_receive_bytes): tenant a may hold
// two transfers' buffers and the server three, so a's third transfer and then b's second are
// refused, naming the budget, with nothing appended; closing a transfer gives its buffer back.
TEST_F(NcclAppendTest, ReceiveBuffersAreChargedToTheTenantsAndTheServersBudgets) {
  constexpr int kTokens = 10;
  constexpr int64_t kBuffer = 2 * kTokens * testing::kHeads * testing::kDim * 2;  // keys, values
  const TenantTokens tokens;
  cachesvc::ServerOptions o = Options(/*nccl=*/true);
  o.auth.tokens_file = tokens.file;
  o.transfer_nccl_receive_bytes_per_tenant = 2 * kBuffer;
  o.transfer_nccl_receive_bytes = 3 * kBuffer;
  client::ClientOptions as_a;
  as_a.bearer_token = "token-of-a";
  testing::TestServer t = testing::StartTestServer(o, as_a);
  client::ClientOptions as_b = as_a;
  as_b.target = t.server->address();
  as_b.bearer_token = "token-of-b";
  KVC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::KvCacheClient> b,
                           client::KvCacheClient::Connect(as_b));
  auto link = [&](client::KvCacheClient* c) {
    client::NcclLink::Options lo;
    lo.pool = "small";
    lo.library = LoopbackPath();
    absl::StatusOr<std::unique_ptr<client::NcclLink>> opened = client::NcclLink::Open(c, lo);
    EXPECT_TRUE(opened.ok()) << opened.status();
    return opened.ok() ? *std::move(opened) : nullptr;
  };
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo seq_a, t.client->CreateSequence({}));
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo seq_b, b->CreateSequence({}));
  auto append = [&](client::NcclLink& l, const std::string& id, int layer) {
    const Chunk c = Make(layer, 0, kTokens);
    return l.Append(Request(id, layer, 0, kTokens, c.device_keys, c.device_values, c.keys.size()))
        .status();
  };
  std::unique_ptr<client::NcclLink> a1 = link(t.client.get()), a2 = link(t.client.get()),
                                    a3 = link(t.client.get());
  ASSERT_TRUE(a1 != nullptr && a2 != nullptr && a3 != nullptr);
  KVC_ASSERT_OK(append(*a1, seq_a.sequence_id, 0));
  KVC_ASSERT_OK(append(*a2, seq_a.sequence_id, 1));
  EXPECT_THAT(append(*a3, seq_a.sequence_id, 2),
              testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                "tenant 'a' holds 5120 bytes of NCCL buffers, its budget "
                                "(transfer_nccl_receive_bytes_per_tenant) is 5120"));
  // b has a budget of its own, but the server's is full after b's first buffer.
  std::unique_ptr<client::NcclLink> b1 = link(b.get()), b2 = link(b.get());
  ASSERT_TRUE(b1 != nullptr && b2 != nullptr);
  KVC_ASSERT_OK(append(*b1, seq_b.sequence_id, 0));
  EXPECT_THAT(append(*b2, seq_b.sequence_id, 1),
              testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                "the server holds 7680 bytes of NCCL buffers, its budget "
                                "(transfer_nccl_receive_bytes) is 7680"));
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo info_a,
                           t.client->GetSequence(seq_a.sequence_id));
  EXPECT_EQ(info_a.layer_tokens, (std::vector<int64_t>{kTokens, kTokens, 0, 0}));
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo info_b, b->GetSequence(seq_b.sequence_id));
  EXPECT_EQ(info_b.layer_tokens, (std::vector<int64_t>{kTokens, 0, 0, 0}));
  // Closing a1's transfer gives its buffer back to a and to the server.
  a1.reset();
  std::unique_ptr<client::NcclLink> b3 = link(b.get());
  ASSERT_TRUE(b3 != nullptr);
  KVC_EXPECT_OK(append(*b3, seq_b.sequence_id, 1));
}

#ifndef KVC_NCCL_TEST_ON_SIMULATOR
// Real NCCL between two GPUs (the GPU bundle's build): kvcached's pool on cuda:0, the link on
// cuda:1, NCCL from KVC_REAL_NCCL (default libnccl.so.2). NCCL refuses two ranks on one GPU,
// so with fewer than two GPUs (or no NCCL) this skips, saying so.
TEST(RealNcclTest, TheLinkAppendsAndFetchesBetweenTwoGpus) {
  const char* env = std::getenv("KVC_REAL_NCCL");
  const std::string library = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
  if (absl::StatusOr<const nccl::Api*> api = nccl::Load(library); !api.ok()) {
    GTEST_SKIP() << "no NCCL to test: " << api.status();
  }
  std::unique_ptr<kernels::KernelBackend> second;
  kernels::BackendOptions cuda1;
  cuda1.device = 1;
  if (const kernels::KernelStatus ks =
          kernels::CreateBackend(kernels::BackendKind::kCuda, cuda1, &second);
      !ks.ok()) {
    GTEST_SKIP() << "NCCL needs two GPUs (it refuses two ranks on one GPU) and cuda:1 is not "
                    "available here: "
                 << ks.detail;
  }
  cachesvc::ServerOptions options = Options(/*nccl=*/false);
  options.transfer_nccl_library = library;
  testing::TestServer t = testing::StartTestServer(options);
  client::NcclLink::Options lo;
  lo.pool = "small";
  lo.library = library;
  lo.device = 1;
  KVC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::NcclLink> link,
                           client::NcclLink::Open(t.client.get(), lo));
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo over_nccl, t.client->CreateSequence({}));
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo over_grpc, t.client->CreateSequence({}));
  std::vector<void*> device;
  const auto on_cuda1 = [&](const std::string& host) {
    void* p = nullptr;
    EXPECT_TRUE(second->Allocate(host.size(), &p).ok());
    EXPECT_TRUE(second->CopyToDevice(p, host.data(), host.size(), {}).ok());
    EXPECT_TRUE(second->Synchronize({}).ok());
    device.push_back(p);
    return p;
  };
  const int n = 100;
  for (int l = 0; l < testing::kLayers; ++l) {
    const std::string k = testing::MakeKv(5, l, 0, n, testing::kHeads, testing::kDim,
                                          kernels::DType::kF16, /*is_value=*/false);
    const std::string v = testing::MakeKv(5, l, 0, n, testing::kHeads, testing::kDim,
                                          kernels::DType::kF16, /*is_value=*/true);
    client::AppendChunk a;
    a.layer = l;
    a.num_tokens = n;
    a.dtype = client::DType::kF16;
    a.bytes = k.size();
    a.sequence_id = over_grpc.sequence_id;
    a.keys = k.data();
    a.values = v.data();
    KVC_ASSERT_OK(t.client->Append(a).status());
    a.sequence_id = over_nccl.sequence_id;
    a.keys = on_cuda1(k);
    a.values = on_cuda1(v);
    KVC_ASSERT_OK(link->Append(a).status());
  }
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult a,
                           t.client->Fetch(over_nccl.sequence_id, client::FetchOptions()));
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult b,
                           t.client->Fetch(over_grpc.sequence_id, client::FetchOptions()));
  testing::ExpectSame(a, b);
  // FetchInto cuda:1 buffers over NCCL equals FetchInto host buffers over gRPC.
  client::FetchIntoOptions fo;
  fo.dtype = client::DType::kF16;
  fo.num_kv_heads = testing::kHeads;
  fo.head_dim = testing::kDim;
  const int64_t cap = 128;
  const size_t bytes = static_cast<size_t>(testing::kHeads * cap * testing::kDim) * 2;
  const std::string zeros(bytes, '\0');
  std::vector<client::LayerBuffers> mine, theirs;
  std::vector<std::string> host(2 * testing::kLayers, zeros);
  for (int l = 0; l < testing::kLayers; ++l) {
    mine.push_back({l, on_cuda1(zeros), on_cuda1(zeros), cap});
    theirs.push_back({l, host[2 * l].data(), host[2 * l + 1].data(), cap});
  }
  KVC_ASSERT_OK(link->FetchInto(over_nccl.sequence_id, mine, fo).status());
  KVC_ASSERT_OK(t.client->FetchInto(over_grpc.sequence_id, theirs, fo).status());
  for (int l = 0; l < testing::kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      std::string got(bytes, '\0');
      ASSERT_TRUE(
          second->CopyToHost(got.data(), kv == 0 ? mine[l].keys : mine[l].values, bytes, {}).ok());
      ASSERT_TRUE(second->Synchronize({}).ok());
      EXPECT_TRUE(got == host[2 * l + kv]) << "layer " << l << (kv == 0 ? " keys" : " values");
    }
  }
  link.reset();
  for (void* p : device) second->Free(p);
}
#endif  // KVC_NCCL_TEST_ON_SIMULATOR

}  // namespace
}  // namespace kvc
