// The fixture of the NCCL transfer suites (nccl_transfer_test.cc: reads, nccl_append_test.cc:
// appends): an in-process server with a cuda:0 pool, NCCL offered, libkvc_nccl_loopback.so
// standing in for libnccl (NCCL refuses two ranks on one GPU), and this process as the peer.
#pragma once

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
#include "cachesvc/core/store/kv_store.h"
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

namespace kvc::nccl_testing {

namespace pb = ::kvcache::v1;
using ::kvc::testing::Filled;
using ::kvc::testing::HostCollect;
using ::kvc::testing::Int4WithResidual;

// The loopback library: the build's, or KVC_NCCL_LOOPBACK's (a bundle on a GPU machine).
inline std::string LoopbackPath() {
  const char* env = std::getenv("KVC_NCCL_LOOPBACK");
  return env != nullptr && *env != '\0' ? env : KVC_NCCL_LOOPBACK;
}

inline const nccl::Api& Loopback() {
  absl::StatusOr<const nccl::Api*> api = nccl::Load(LoopbackPath());
  EXPECT_TRUE(api.ok()) << api.status();
  return **api;
}

inline cachesvc::ServerOptions Options(bool nccl) {
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
inline std::vector<size_t> Pieces(const client::Lease& lease) {
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

}  // namespace kvc::nccl_testing
