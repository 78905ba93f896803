// NCCL transfers (OpenTransfer kind NCCL; issue #13 item 4) against a real in-process server
// with a cuda:0 pool, with libkvc_nccl_loopback.so standing in for libnccl (NCCL refuses two
// ranks on one GPU): on cudasim in CI, on a real GPU from the GPU bundle. This test is the reader
// (rank 1): it joins with the unique id, asks for a lease, receives the frame header and the pieces
// the contract says with ncclRecv into device memory, and finds exactly the blocks a TCP channel
// would send. Refusals: a host pool, a server without NCCL, an unknown kind, a send before anyone
// joined; a refused lease sends a header with its code and the channel stays usable; a reader that
// stops receiving breaks the channel (DEADLINE_EXCEEDED, then UNAVAILABLE) and pins nothing.
// Appends' receive buffers are charged to a per-tenant and a server budget.
#include <grpcpp/grpcpp.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_replace.h"
#include "cachesvc/core/kv_store.h"
#include "cachesvc/transport/lease_sender.h"
#include "common/token_hash.h"
#include "gtest/gtest.h"
#include "kvc/client/nccl_link.h"
#include "kvc/kernels/backend.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/integration/read_paths.h"
#include "tests/testing/host_collect.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"
#include "transfer/nccl_api.h"
#include "transfer/wire.h"

namespace kvc {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::testing::Filled;
using ::kvc::testing::HostCollect;
using ::kvc::testing::Int4WithResidual;

// The loopback library: the build's, or KVC_NCCL_LOOPBACK's (a bundle on a GPU machine).
std::string LoopbackPath() {
  const char* env = std::getenv("KVC_NCCL_LOOPBACK");
  return env != nullptr && *env != '\0' ? env : KVC_NCCL_LOOPBACK;
}

const nccl::Api& Loopback() {
  absl::StatusOr<const nccl::Api*> api = nccl::Load(LoopbackPath());
  EXPECT_TRUE(api.ok()) << api.status();
  return **api;
}

cachesvc::ServerOptions Options(bool nccl) {
  cachesvc::ServerOptions o = testing::SmallServerOptions();
  o.store.pools[0].device = "cuda:0";  // cudasim's
  cachesvc::PoolOptions host = o.store.pools[0];
  host.name = "host";
  host.device = "cpu";
  o.store.pools.push_back(host);
  cachesvc::PoolOptions other = o.store.pools[0];
  other.name = "other";  // a second device pool
  o.store.pools.push_back(other);
  if (nccl) o.transfer_nccl_library = LoopbackPath();
  return o;
}

// The pieces the contract announces for a lease: per format, runs of max(1, 4 MiB / block).
std::vector<size_t> Pieces(const client::Lease& lease) {
  std::array<size_t, 9> blocks{};
  for (const client::LeaseLane& lane : lease.lanes) {
    for (const client::LeaseSegment& seg : lane.segments) {
      blocks[static_cast<size_t>(seg.format)] += seg.blocks.size();
    }
  }
  std::vector<size_t> pieces;
  for (size_t f = 1; f < blocks.size(); ++f) {
    if (blocks[f] == 0) continue;
    const auto bb =
        static_cast<size_t>(lease.arena(static_cast<client::StorageFormat>(f))->block_bytes);
    const size_t run = std::max<size_t>(1, (size_t{4} << 20) / bb);
    for (size_t at = 0; at < blocks[f]; at += run)
      pieces.push_back(std::min(run, blocks[f] - at) * bb);
  }
  return pieces;
}

// A tokens file of tenants a and b (bearer tokens "token-of-a", "token-of-b") in a fresh
// directory, removed with this object.
struct TenantTokens {
  TenantTokens() {
    char made[] = "/tmp/kvc-nccl-tokens-XXXXXX";
    EXPECT_NE(mkdtemp(made), nullptr);
    dir = made;
    file = dir + "/tokens";
    std::ofstream out(file);
    for (const char* tenant : {"a", "b"}) {
      const std::string salt = *RandomBytes(16);
      out << tenant << " tenant " << ToHex(salt) << " "
          << TokenHashHex(salt, std::string("token-of-") + tenant) << "\n";
    }
  }
  TenantTokens(const TenantTokens&) = delete;
  TenantTokens& operator=(const TenantTokens&) = delete;
  ~TenantTokens() { std::filesystem::remove_all(dir); }
  std::string dir, file;
};

class NcclTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kernels::BackendOptions device0;
    ASSERT_TRUE(kernels::CreateBackend(kernels::BackendKind::kCuda, device0, &gpu_).ok());
    t_ = testing::StartTestServer(Options(/*nccl=*/true));
    auto channel = grpc::CreateChannel(t_.server->address(), grpc::InsecureChannelCredentials());
    kv_ = pb::KvCacheService::NewStub(channel);
    admin_ = pb::AdminService::NewStub(channel);
  }
  void TearDown() override {
    if (comm_ != nullptr) (void)api_.comm_abort(comm_);
    for (void* d : device_) gpu_->Free(d);
  }
  grpc::Status Open(pb::TransferKind kind, const std::string& pool,
                    pb::OpenTransferResponse* opened) {
    grpc::ClientContext ctx;
    Authorize(&ctx);
    pb::OpenTransferRequest r;
    r.set_kind(kind);
    r.set_pool(pool);
    return kv_->OpenTransfer(&ctx, r, opened);
  }
  // The calls below carry token_ as their bearer token (none while it is empty).
  void Authorize(grpc::ClientContext* ctx) const {
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  }
  // Opens an NCCL transfer of the device pool and joins it as rank 1.
  std::string OpenAndJoin() {
    pb::OpenTransferResponse opened;
    const grpc::Status s = Open(pb::TRANSFER_KIND_NCCL, "small", &opened);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(opened.nccl_unique_id().size(), nccl::kUniqueIdBytes);
    nccl::UniqueId id{};
    std::memcpy(id.internal, opened.nccl_unique_id().data(), nccl::kUniqueIdBytes);
    nccl::Config config;
    EXPECT_EQ(api_.comm_init_rank_config(&comm_, 2, id, 1, &config), nccl::kInProgress);
    EXPECT_EQ(Settle(), nccl::kSuccess);
    return opened.transfer_id();
  }
  nccl::Result Settle() {
    nccl::Result state = nccl::kInProgress;
    for (int i = 0; i < 10000 && state == nccl::kInProgress; ++i) {
      if (api_.comm_get_async_error(comm_, &state) != nccl::kSuccess) return -1;
      if (state == nccl::kInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return state;
  }
  nccl::Result Recv(void* device, size_t bytes) {
    const nccl::Result r = api_.recv(device, bytes, nccl::kUint8, 0, comm_, nullptr);
    return r == nccl::kInProgress ? Settle() : r;
  }
  void* Device(size_t bytes) {
    void* p = nullptr;
    EXPECT_TRUE(gpu_->Allocate(bytes, &p).ok());
    device_.push_back(p);
    return p;
  }
  // SendLease on another thread (the reader receives meanwhile).
  std::future<grpc::Status> SendLease(const std::string& transfer, const std::string& lease,
                                      uint64_t nonce, int deadline_s = 60) {
    return std::async(std::launch::async, [=] {
      grpc::ClientContext ctx;
      Authorize(&ctx);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
      pb::SendLeaseRequest r;
      r.set_transfer_id(transfer);
      r.set_lease_id(lease);
      r.set_nonce(nonce);
      pb::SendLeaseResponse sent;
      return kv_->SendLease(&ctx, r, &sent);
    });
  }
  // Device memory through the kernels' CUDA backend (the simulator here, a GPU in a bundle).
  void ToDevice(void* device, const void* host, size_t bytes) {
    EXPECT_TRUE(gpu_->CopyToDevice(device, host, bytes, {}).ok());
    EXPECT_TRUE(gpu_->Synchronize({}).ok());
  }
  void ToHost(void* host, const void* device, size_t bytes) {
    EXPECT_TRUE(gpu_->CopyToHost(host, device, bytes, {}).ok());
    EXPECT_TRUE(gpu_->Synchronize({}).ok());
  }
  transfer::FrameHeader ReceiveHeader() {
    void* d = Device(transfer::kHeaderBytes);
    EXPECT_EQ(Recv(d, transfer::kHeaderBytes), nccl::kSuccess);
    char host[transfer::kHeaderBytes] = {};
    ToHost(host, d, sizeof(host));
    transfer::FrameHeader h;
    EXPECT_TRUE(transfer::DecodeHeader(host, &h)) << "not a frame header";
    return h;
  }

  std::unique_ptr<kernels::KernelBackend> gpu_;
  testing::TestServer t_;
  std::unique_ptr<pb::KvCacheService::Stub> kv_;
  std::unique_ptr<pb::AdminService::Stub> admin_;
  const nccl::Api& api_ = Loopback();
  nccl::Comm comm_ = nullptr;
  std::vector<void*> device_;
  std::string token_;
};

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
    KVC_ASSERT_OK(
        SendLeasedBlocks(t_.server->store()->leases(), "", lease.lease_id, &tcp).status());
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
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats, t_.client->GetPoolStats("small"));
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
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats, t_.client->GetPoolStats("small"));
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
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats, t.client->GetPoolStats("small"));
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
  KVC_ASSERT_OK(t_.client->CloseTransfer(described.substr(at + 9)));
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
