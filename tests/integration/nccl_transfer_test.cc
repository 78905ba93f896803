// NCCL transfers (OpenTransfer kind NCCL; issue #13 item 4) against a real in-process server
// with a cuda:0 pool, with libkvc_nccl_loopback.so standing in for libnccl (NCCL refuses two
// ranks on one GPU): on cudasim in CI, on a real GPU from the GPU bundle. This test is the reader
// (rank 1): it joins with the unique id, asks for a lease, receives the frame header and the pieces
// the contract says with ncclRecv into device memory, and finds exactly the blocks a TCP channel
// would send. Refusals: a host pool, a server without NCCL, an unknown kind, a send before anyone
// joined; a refused lease sends a header with its code and the channel stays usable; a reader that
// stops receiving breaks the channel (DEADLINE_EXCEEDED, then UNAVAILABLE) and pins nothing.
#include "kvc/client/admin_client.h"
#include "tests/integration/nccl_fixture.h"

namespace kvc {
namespace {

using namespace nccl_testing;  // NOLINT(google-build-using-namespace): the suites' fixture

TEST_F(NcclTransferTest, TheReaderReceivesWhatATcpChannelCarries) {
  grpc::ClientContext ctx;
  pb::ServerInfo info;
  ASSERT_TRUE(admin_->GetServerInfo(&ctx, pb::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.nccl_transfers().rfind("NCCL 2.14.0 (", 0), 0u) << info.nccl_transfers();

  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*t_.client, 100));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string q, Filled(*t_.client, 90, Int4WithResidual()));
  const std::string transfer = OpenAndJoin();
  EXPECT_EQ(transfer.rfind("n-", 0), 0u);
  uint64_t nonce = 40;
  for (const std::string& id : {raw, q, raw}) {
    SCOPED_TRACE(id);
    KVC_ASSERT_OK_AND_ASSIGN(const client::Lease lease, t_.client->LeaseSequence(id));
    std::future<grpc::Status> sending = SendLease(transfer, lease.lease_id, ++nonce);
    const transfer::FrameHeader h = ReceiveHeader();
    EXPECT_EQ(h.nonce, nonce);
    EXPECT_EQ(h.code, 0u);
    EXPECT_EQ(h.payload_bytes, static_cast<uint64_t>(lease.leased_bytes));
    std::string payload;
    for (const size_t piece : Pieces(lease)) {
      void* d = Device(piece);
      ASSERT_EQ(Recv(d, piece), nccl::kSuccess);
      std::string host(piece, '\0');
      ToHost(host.data(), d, piece);
      payload += host;
    }
    const grpc::Status sent = sending.get();
    EXPECT_TRUE(sent.ok()) << sent.error_message();
    HostCollect tcp;
    KVC_ASSERT_OK(SendLeasedBlocks(t_.server->store()->leases(), cachesvc::TenantScope(),
                                   lease.lease_id, &tcp)
                      .status());
    EXPECT_EQ(payload.size(), tcp.bytes.size());
    EXPECT_TRUE(payload == tcp.bytes) << "the NCCL payload differs from the TCP one";
    KVC_ASSERT_OK(t_.client->ReleaseLease(lease.lease_id).status());
  }
  const std::string metrics = t_.server->metrics()->Serialize();
  EXPECT_NE(metrics.find("kvc_transfer_events_total{event=\"sent\"} 3\n"), std::string::npos)
      << metrics;
}

TEST_F(NcclTransferTest, ARefusedLeaseSendsItsCodeAndTheTransferStaysUsable) {
  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*t_.client, 40));
  const std::string transfer = OpenAndJoin();
  std::future<grpc::Status> refused = SendLease(transfer, "l-nothing", 5);
  const transfer::FrameHeader h = ReceiveHeader();
  EXPECT_EQ(h.nonce, 5u);
  EXPECT_EQ(h.code, static_cast<uint32_t>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(h.payload_bytes, 0u);
  EXPECT_EQ(refused.get().error_code(), grpc::StatusCode::NOT_FOUND);
  // A lease of another pool than the transfer's: refused the same way.
  client::CreateSequenceOptions in_other;
  in_other.pool = "other";
  KVC_ASSERT_OK_AND_ASSIGN(const std::string elsewhere, Filled(*t_.client, 20, in_other));
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease foreign, t_.client->LeaseSequence(elsewhere));
  std::future<grpc::Status> wrong_pool = SendLease(transfer, foreign.lease_id, 4);
  EXPECT_EQ(ReceiveHeader().code, static_cast<uint32_t>(grpc::StatusCode::FAILED_PRECONDITION));
  const grpc::Status wrong = wrong_pool.get();
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(wrong.error_message().find("this transfer carries pool 'small'"), std::string::npos)
      << wrong.error_message();
  KVC_ASSERT_OK(t_.client->ReleaseLease(foreign.lease_id).status());
  // Still in step: the next lease arrives whole.
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease lease, t_.client->LeaseSequence(raw));
  std::future<grpc::Status> sending = SendLease(transfer, lease.lease_id, 6);
  EXPECT_EQ(ReceiveHeader().nonce, 6u);
  for (const size_t piece : Pieces(lease)) ASSERT_EQ(Recv(Device(piece), piece), nccl::kSuccess);
  EXPECT_TRUE(sending.get().ok());
  KVC_ASSERT_OK(t_.client->ReleaseLease(lease.lease_id).status());
}

TEST_F(NcclTransferTest, RefusalsSayWhy) {
  pb::OpenTransferResponse opened;
  grpc::Status s = Open(pb::TRANSFER_KIND_NCCL, "host", &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("in host memory"), std::string::npos) << s.error_message();
  s = Open(pb::TRANSFER_KIND_NCCL, "nope", &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  s = Open(static_cast<pb::TransferKind>(7), "", &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // TCP transfers are not offered by this server (no transfer_listen).
  s = Open(pb::TRANSFER_KIND_TCP, "", &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  // Nobody joined: a send waits for the join only as long as the call may.
  ASSERT_TRUE(Open(pb::TRANSFER_KIND_NCCL, "small", &opened).ok());
  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*t_.client, 20));
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease lease, t_.client->LeaseSequence(raw));
  const grpc::Status alone = SendLease(opened.transfer_id(), lease.lease_id, 1, 1).get();
  EXPECT_NE(alone.error_code(), grpc::StatusCode::OK);
  KVC_ASSERT_OK(t_.client->ReleaseLease(lease.lease_id).status());
  // A server without transfer_nccl_library.
  testing::TestServer plain = testing::StartTestServer(Options(/*nccl=*/false));
  auto stub = pb::KvCacheService::NewStub(
      grpc::CreateChannel(plain.server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  pb::OpenTransferRequest r;
  r.set_kind(pb::TRANSFER_KIND_NCCL);
  s = stub->OpenTransfer(&ctx, r, &opened);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("transfer_nccl_library is unset"), std::string::npos);
}

TEST_F(NcclTransferTest, AReaderThatStopsReceivingBreaksTheTransferAndPinsNothing) {
  // ~3 MiB of blocks: more than the loopback's socket buffers, so the send waits for a
  // receive (as NCCL's would) that never comes.
  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*t_.client, 3000));
  const std::string transfer = OpenAndJoin();
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease lease, t_.client->LeaseSequence(raw));
  std::future<grpc::Status> stalled = SendLease(transfer, lease.lease_id, 9, /*deadline_s=*/2);
  EXPECT_EQ(ReceiveHeader().nonce, 9u);  // and then nothing more is received
  EXPECT_EQ(stalled.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  KVC_ASSERT_OK(t_.client->ReleaseLease(lease.lease_id).status());
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease again, t_.client->LeaseSequence(raw));
  const grpc::Status after = SendLease(transfer, again.lease_id, 10).get();
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAVAILABLE) << after.error_message();
  KVC_ASSERT_OK(t_.client->ReleaseLease(again.lease_id).status());
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats,
                           kvc::client::AdminClient::Over(*t_.client).GetPoolStats("small"));
  EXPECT_EQ(stats.leases.active, 0);
}

// The client library's reader (kvc::client::NcclLink) against the same server: FetchInto
// into device buffers equals FetchInto over gRPC into host memory, byte for byte.
TEST_F(NcclTransferTest, TheClientReaderFetchesWhatGrpcFetches) {
  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*t_.client, 100));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string q, Filled(*t_.client, 90, Int4WithResidual()));
  client::NcclLink::Options ro;
  ro.pool = "small";
  ro.library = LoopbackPath();
  KVC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::NcclLink> reader,
                           client::NcclLink::Open(t_.client.get(), ro));
  EXPECT_NE(reader->Describe().find("NCCL 2.14.0"), std::string::npos) << reader->Describe();
  const int64_t cap = 128;
  for (const std::string& id : {raw, q}) {
    for (const client::DType dtype : {client::DType::kF16, client::DType::kF32}) {
      SCOPED_TRACE(::testing::Message() << id << " dtype " << static_cast<int>(dtype));
      client::FetchIntoOptions fo;
      fo.dtype = dtype;
      fo.num_kv_heads = testing::kHeads;
      fo.head_dim = testing::kDim;
      fo.positions = true;
      const size_t bytes = static_cast<size_t>(testing::kHeads * cap * testing::kDim) *
                           (dtype == client::DType::kF32 ? 4 : 2);
      std::vector<client::LayerBuffers> on_device, on_host;
      std::vector<std::string> host(2 * testing::kLayers, std::string(bytes, '\0'));
      for (int l = 0; l < testing::kLayers; ++l) {
        on_device.push_back({l, Device(bytes), Device(bytes), cap});
        on_host.push_back({l, host[2 * l].data(), host[2 * l + 1].data(), cap});
        const std::string zeros(bytes, '\0');
        ToDevice(on_device.back().keys, zeros.data(), bytes);
        ToDevice(on_device.back().values, zeros.data(), bytes);
      }
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchIntoResult mine,
                               reader->FetchInto(id, on_device, fo));
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchIntoResult theirs,
                               t_.client->FetchInto(id, on_host, fo));
      EXPECT_EQ(mine.lane_tokens, theirs.lane_tokens);
      EXPECT_EQ(mine.positions, theirs.positions);
      EXPECT_EQ(mine.visible_tokens, theirs.visible_tokens);
      for (int l = 0; l < testing::kLayers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          std::string got(bytes, '\0');
          ToHost(got.data(), kv == 0 ? on_device[l].keys : on_device[l].values, bytes);
          EXPECT_TRUE(got == host[2 * l + kv]) << "layer " << l << (kv == 0 ? " keys" : " values");
        }
      }
    }
  }
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats,
                           kvc::client::AdminClient::Over(*t_.client).GetPoolStats("small"));
  EXPECT_EQ(stats.leases.active, 0) << "every lease ended";
  // A sequence of another pool is refused, and the transfer stays usable.
  client::CreateSequenceOptions in_other;
  in_other.pool = "other";
  KVC_ASSERT_OK_AND_ASSIGN(const std::string elsewhere, Filled(*t_.client, 20, in_other));
  client::FetchIntoOptions fo;
  fo.dtype = client::DType::kF16;
  fo.num_kv_heads = testing::kHeads;
  fo.head_dim = testing::kDim;
  std::vector<client::LayerBuffers> buffers;
  buffers.reserve(testing::kLayers);
  for (int l = 0; l < testing::kLayers; ++l) {
    buffers.push_back({l, Device(size_t{1} << 16), Device(size_t{1} << 16), cap});
  }
  EXPECT_THAT(reader->FetchInto(elsewhere, buffers, fo).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, "carries pool"));
  KVC_ASSERT_OK(reader->FetchInto(raw, buffers, fo).status());
}

// A send's piece buffer (the pool's device memory each piece is copied into before its
// ncclSend) is charged to the same budgets as Appends' receive buffers, for as long as the
// send lasts. Below one piece, FetchInto over NCCL is refused naming the budget, before any
// byte is sent: the transfer stays in step (the next refusal is the lease's own) and the
// refused charge is not kept (the second refusal finds 0 bytes held).
TEST_F(NcclTransferTest, ASendsPieceBufferIsChargedToTheBudgets) {
  cachesvc::ServerOptions o = Options(/*nccl=*/true);
  o.transfer_nccl_receive_bytes_per_tenant = 1024;
  testing::TestServer t = testing::StartTestServer(o);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Filled(*t.client, 100));
  client::NcclLink::Options ro;
  ro.pool = "small";
  ro.library = LoopbackPath();
  KVC_ASSERT_OK_AND_ASSIGN(std::unique_ptr<client::NcclLink> reader,
                           client::NcclLink::Open(t.client.get(), ro));
  client::FetchIntoOptions fo;
  fo.dtype = client::DType::kF16;
  fo.num_kv_heads = testing::kHeads;
  fo.head_dim = testing::kDim;
  std::vector<client::LayerBuffers> buffers;
  buffers.reserve(testing::kLayers);
  for (int l = 0; l < testing::kLayers; ++l) {
    buffers.push_back({l, Device(size_t{1} << 16), Device(size_t{1} << 16), 128});
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    const absl::Status refused = reader->FetchInto(id, buffers, fo).status();
    EXPECT_THAT(refused, testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                           "a send over NCCL needs a piece buffer of "));
    EXPECT_THAT(refused, testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                           " holds 0 bytes of NCCL buffers, its budget "
                                           "(transfer_nccl_receive_bytes_per_tenant) is 1024"));
  }
  client::CreateSequenceOptions in_other;
  in_other.pool = "other";
  KVC_ASSERT_OK_AND_ASSIGN(const std::string elsewhere, Filled(*t.client, 20, in_other));
  EXPECT_THAT(reader->FetchInto(elsewhere, buffers, fo).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition, "carries pool"));
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats,
                           kvc::client::AdminClient::Over(*t.client).GetPoolStats("small"));
  EXPECT_EQ(stats.leases.active, 0) << "every lease ended";
}

// NCCL channels in the cross-tenant sweep (issue 38): a channel and a lease are their
// tenant's. Tenant b, over its own joined channel, asking for a's lease gets the answer of a
// lease nobody made (announced in the frame: the channel stays in step, and no byte of a's
// is sent); b's calls on a's channel (SendLease, an Append over it, CloseTransfer) get the
// answer of a channel nobody opened; without a credential, or with one the server does not
// know (a revoked token, once the tokens file drops it), every call is UNAUTHENTICATED.
// a's lease and channel are untouched afterwards.
TEST_F(NcclTransferTest, ChannelsAndLeasesAreTheirTenantsOnly) {
  const TenantTokens tokens;
  cachesvc::ServerOptions o = Options(/*nccl=*/true);
  o.auth.tokens_file = tokens.file;
  client::ClientOptions as_a;
  as_a.bearer_token = "token-of-a";
  testing::TestServer t = testing::StartTestServer(o, as_a);
  kv_ = pb::KvCacheService::NewStub(
      grpc::CreateChannel(t.server->address(), grpc::InsecureChannelCredentials()));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string seq, Filled(*t.client, 40));
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease a_lease, t.client->LeaseSequence(seq));
  token_ = "token-of-a";
  pb::OpenTransferResponse a_opened;
  ASSERT_TRUE(Open(pb::TRANSFER_KIND_NCCL, "small", &a_opened).ok());
  const std::string a_channel = a_opened.transfer_id();
  const auto same_answer = [](const grpc::Status& got, const grpc::Status& missing,
                              const std::string& id, const std::string& missing_id) {
    EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND) << got.error_message();
    EXPECT_EQ(got.error_code(), missing.error_code());
    EXPECT_EQ(absl::StrReplaceAll(got.error_message(), {{id, "ID"}}),
              absl::StrReplaceAll(missing.error_message(), {{missing_id, "ID"}}));
  };

  // b's own channel, a's lease: refused in the frame, as a missing lease is.
  token_ = "token-of-b";
  const std::string b_channel = OpenAndJoin();
  std::future<grpc::Status> theirs = SendLease(b_channel, a_lease.lease_id, 5);
  transfer::FrameHeader h = ReceiveHeader();
  EXPECT_EQ(h.code, static_cast<uint32_t>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(h.payload_bytes, 0u) << "nothing of a's lease is sent";
  const grpc::Status on_theirs = theirs.get();
  std::future<grpc::Status> nobodys = SendLease(b_channel, "l-nobody", 6);
  EXPECT_EQ(ReceiveHeader().code, static_cast<uint32_t>(grpc::StatusCode::NOT_FOUND));
  same_answer(on_theirs, nobodys.get(), a_lease.lease_id, "l-nobody");

  // a's channel, as b: as if it did not exist.
  same_answer(SendLease(a_channel, a_lease.lease_id, 7).get(),
              SendLease("t-nobody", a_lease.lease_id, 7).get(), a_channel, "t-nobody");
  const auto append_over = [&](const std::string& channel) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    pb::AppendRequest r;
    r.set_sequence_id("b-own");
    r.set_num_tokens(1);
    r.mutable_nccl()->set_transfer_id(channel);
    r.mutable_nccl()->set_nonce(1);
    r.mutable_nccl()->set_bytes(testing::kHeads * testing::kDim * 2);
    pb::AppendResponse appended;
    return kv_->Append(&ctx, r, &appended);
  };
  same_answer(append_over(a_channel), append_over("t-nobody"), a_channel, "t-nobody");
  const auto close = [&](const std::string& channel) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    pb::CloseTransferRequest r;
    r.set_transfer_id(channel);
    pb::CloseTransferResponse closed;
    return kv_->CloseTransfer(&ctx, r, &closed);
  };
  same_answer(close(a_channel), close("t-nobody"), a_channel, "t-nobody");

  // No credential, an unknown (revoked) one: UNAUTHENTICATED before anything is looked up.
  for (const char* token : {"", "token-of-nobody"}) {
    token_ = token;
    pb::OpenTransferResponse opened;
    EXPECT_EQ(Open(pb::TRANSFER_KIND_NCCL, "small", &opened).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(SendLease(a_channel, a_lease.lease_id, 8).get().error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(append_over(a_channel).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(close(a_channel).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }

  // a's lease and channel are as they were.
  token_ = "token-of-a";
  EXPECT_TRUE(close(a_channel).ok());
  KVC_EXPECT_OK(t.client->ReleaseLease(a_lease.lease_id).status()) << "a's lease was live";
}

}  // namespace
}  // namespace kvc
