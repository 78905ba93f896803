// Hostile input through real gRPC, as an independent client written from the .proto files
// would send it (raw stubs, gRPC's default channel limits): 1 MB strings in every string
// field of every RPC, enum numbers outside the contract, start positions at the int64
// limits, every size and count a request chooses past its bound, and an Attend whose weights
// cannot fit in a response. Each gets the code the contract promises with a short message,
// changes nothing and, for Attend, runs no kernel.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "cachesvc/core/plan/eviction_rule.h"
#include "cachesvc/core/pool/pool_options.h"
#include "cachesvc/server/server.h"
#include "cachesvc/server/server_config.h"
#include "common/token_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvc/kernels/backend.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/test_server.h"

namespace kvc::cachesvc {
namespace {

namespace pb = ::kvcache::v1;
using ::testing::HasSubstr;
using GrpcCode = grpc::StatusCode;

constexpr int kLayers = 4, kHeads = 2, kQHeads = 4, kDim = 32;
// Far above any id the contract allows and far above gRPC's 16 KiB metadata hard limit: a
// message that quoted it whole would reach the client as RESOURCE_EXHAUSTED instead.
const std::string& Huge() {
  static const std::string* s = new std::string(size_t{1} << 20, 'x');
  return *s;
}
// What a person can read; the quoted prefix is 64 bytes.
constexpr size_t kShortMessage = 300;

constexpr char kTenantToken[] = "token-of-tenant-a-0123456789abcdef";
constexpr char kAdminToken[] = "token-of-the-admin-0123456789abcd";

std::string TokenLine(const std::string& tenant, const std::string& role,
                      const std::string& token) {
  const std::string salt = *RandomBytes(16);
  return absl::StrCat(tenant, " ", role, " ", ToHex(salt), " ", TokenHashHex(salt, token), "\n");
}

// Counts DecodeAttention calls of the real CPU backend it wraps.
class CountingBackend final : public testing::ForwardingBackend {
 public:
  CountingBackend(std::unique_ptr<kernels::KernelBackend> inner,
                  std::atomic<int64_t>* attention_calls)
      : ForwardingBackend(std::move(inner)), attention_calls_(attention_calls) {}

  const char* name() const override { return "counting"; }
  kernels::KernelStatus DecodeAttention(const kernels::DecodeAttentionArgs& a,
                                        kernels::StreamHandle h) override {
    attention_calls_->fetch_add(1);
    return ForwardingBackend::DecodeAttention(a, h);
  }

 private:
  std::atomic<int64_t>* attention_calls_;
};

// An in-process kvcached (optionally with bearer-token authentication) and raw stubs.
class HostileInputTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ServerOptions options = testing::SmallServerOptions();
    options.transfer_listen = "127.0.0.1:0";  // so the transfer RPCs reach their ids
    Start(options, GetParam());
  }
  void TearDown() override {
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void Start(ServerOptions options, bool with_auth) {
    auth_ = with_auth;
    if (with_auth && dir_.empty()) {
      char tmpl[] = "/tmp/kvc-hostile-XXXXXX";
      dir_ = mkdtemp(tmpl);
      std::ofstream(dir_ + "/tokens")
          << TokenLine("a", "tenant", kTenantToken) << TokenLine("ops", "admin", kAdminToken);
      options.auth.tokens_file = dir_ + "/tokens";
    }
    options.store.hooks.wrap_backend = [this](std::unique_ptr<kernels::KernelBackend> inner) {
      return std::make_unique<CountingBackend>(std::move(inner), &attention_calls_);
    };
    auto server = KvCacheServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    // Default channel arguments on purpose: what a client written from the .proto gets.
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    kv_ = pb::KvCacheService::NewStub(channel);
    admin_ = pb::AdminService::NewStub(channel);
  }

  std::unique_ptr<grpc::ClientContext> Ctx(bool admin = false) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (auth_) {
      ctx->AddMetadata("authorization",
                       absl::StrCat("Bearer ", admin ? kAdminToken : kTenantToken));
    }
    return ctx;
  }

  std::string NewSequence() {
    pb::CreateSequenceRequest r;
    pb::SequenceInfo info;
    const grpc::Status s = kv_->CreateSequence(Ctx().get(), r, &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info.sequence_id();
  }

  static pb::AppendRequest AppendReq(const std::string& id, int layer, int64_t start, int n) {
    pb::AppendRequest r;
    r.set_sequence_id(id);
    r.set_layer(layer);
    r.set_start_position(start);
    r.set_num_tokens(n);
    const int64_t at = std::max<int64_t>(0, std::min<int64_t>(start, 1 << 20));
    r.set_keys(testing::MakeKv(3, layer, at, std::max(n, 0), kHeads, kDim, kernels::DType::kF16,
                               /*is_value=*/false));
    r.set_values(testing::MakeKv(3, layer, at, std::max(n, 0), kHeads, kDim, kernels::DType::kF16,
                                 /*is_value=*/true));
    return r;
  }

  grpc::Status Append(const pb::AppendRequest& r) {
    pb::AppendResponse response;
    return kv_->Append(Ctx().get(), r, &response);
  }
  grpc::Status AppendStream(const pb::AppendRequest& r) {
    auto ctx = Ctx();
    pb::AppendStreamResponse response;
    auto writer = kv_->AppendStream(ctx.get(), &response);
    writer->Write(r);
    writer->WritesDone();
    return writer->Finish();
  }
  grpc::Status Fetch(const pb::FetchRequest& r, bool admin = false) {
    auto ctx = Ctx(admin);
    auto reader = kv_->Fetch(ctx.get(), r);
    pb::FetchChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }
  grpc::Status Attend(const pb::AttendRequest& r, pb::AttendResponse* response = nullptr) {
    pb::AttendResponse ignored;
    return kv_->Attend(Ctx().get(), r, response != nullptr ? response : &ignored);
  }
  grpc::Status AttendStream(const pb::AttendRequest& r) {
    auto ctx = Ctx();
    auto stream = kv_->AttendStream(ctx.get());
    stream->Write(r);
    stream->WritesDone();
    pb::AttendResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }
  grpc::Status Compress(const pb::CompressRequest& r) {
    pb::CompressResponse response;
    return kv_->Compress(Ctx().get(), r, &response);
  }
  grpc::Status Create(const pb::CreateSequenceRequest& r) {
    pb::SequenceInfo info;
    return kv_->CreateSequence(Ctx().get(), r, &info);
  }

  // Layer tokens and bytes of `id`: nothing a refused call did may show here.
  void ExpectEmpty(const std::string& id) {
    pb::GetSequenceRequest r;
    r.set_sequence_id(id);
    pb::SequenceInfo info;
    const grpc::Status s = kv_->GetSequence(Ctx().get(), r, &info);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_THAT(info.layer_tokens(), ::testing::Each(0));
    EXPECT_EQ(info.bytes(), 0);
  }

  bool auth_ = false;
  std::string dir_;
  std::atomic<int64_t> attention_calls_{0};
  std::unique_ptr<KvCacheServer> server_;
  std::unique_ptr<pb::KvCacheService::Stub> kv_;
  std::unique_ptr<pb::AdminService::Stub> admin_;
};

// The code the contract promises, and a message a person can read that names the length.
void ExpectShort(const grpc::Status& s, GrpcCode code, const std::string& what) {
  EXPECT_EQ(s.error_code(), code) << what << ": " << s.error_message().substr(0, 400);
  EXPECT_LT(s.error_message().size(), kShortMessage) << what;
}

TEST_P(HostileInputTest, AMegabyteStringInAnyFieldGetsTheContractsCodeAndAShortMessage) {
  const std::string id = NewSequence();
  const std::string& huge = Huge();
  const GrpcCode tenant_code =
      auth_ ? GrpcCode::PERMISSION_DENIED : GrpcCode::INVALID_ARGUMENT;  // > 128 bytes

  pb::CreateSequenceRequest create;
  create.set_pool(huge);
  ExpectShort(Create(create), GrpcCode::NOT_FOUND, "CreateSequence.pool");
  create.Clear();
  create.set_tenant(huge);
  ExpectShort(Create(create), tenant_code, "CreateSequence.tenant");
  create.Clear();
  create.set_client_sequence_id(huge);
  ExpectShort(Create(create), GrpcCode::INVALID_ARGUMENT, "CreateSequence.client_sequence_id");
  {
    const grpc::Status s = Create(create);
    EXPECT_THAT(s.error_message(), HasSubstr("(1048576 bytes)"));
  }

  ExpectShort(Append(AppendReq(huge, 0, 0, 4)), GrpcCode::NOT_FOUND, "Append.sequence_id");
  ExpectShort(AppendStream(AppendReq(huge, 0, 0, 4)), GrpcCode::NOT_FOUND,
              "AppendStream.sequence_id");

  pb::FetchRequest fetch;
  fetch.set_sequence_id(huge);
  ExpectShort(Fetch(fetch), GrpcCode::NOT_FOUND, "Fetch.sequence_id");
  fetch.set_sequence_id(id);
  fetch.set_tenant(huge);
  if (auth_) {
    ExpectShort(Fetch(fetch), GrpcCode::PERMISSION_DENIED, "Fetch.tenant");
    // An admin may name any tenant: that tenant has no such sequence.
    ExpectShort(Fetch(fetch, /*admin=*/true), GrpcCode::NOT_FOUND, "Fetch.tenant (admin)");
  } else {
    EXPECT_TRUE(Fetch(fetch).ok()) << "without authentication the tenant field is not a scope";
  }

  pb::GetSequenceRequest get;
  get.set_sequence_id(huge);
  pb::SequenceInfo info;
  ExpectShort(kv_->GetSequence(Ctx().get(), get, &info), GrpcCode::NOT_FOUND,
              "GetSequence.sequence_id");
  if (auth_) {
    get.set_sequence_id(id);
    get.set_tenant(huge);
    ExpectShort(kv_->GetSequence(Ctx().get(), get, &info), GrpcCode::PERMISSION_DENIED,
                "GetSequence.tenant");
  }

  pb::ReleaseRequest release;
  release.set_sequence_id(huge);
  pb::ReleaseResponse released;
  ExpectShort(kv_->Release(Ctx().get(), release, &released), GrpcCode::NOT_FOUND,
              "Release.sequence_id");

  pb::CompressRequest compress;
  compress.set_sequence_id(huge);
  compress.mutable_spec()->mutable_streaming_llm()->set_sinks(4);
  compress.mutable_spec()->mutable_streaming_llm()->set_window(16);
  ExpectShort(Compress(compress), GrpcCode::NOT_FOUND, "Compress.sequence_id");

  pb::AttendRequest attend;
  attend.set_sequence_id(huge);
  attend.add_positions(0);
  attend.set_queries(std::string(kQHeads * kDim * 2, '\0'));
  ExpectShort(Attend(attend), GrpcCode::NOT_FOUND, "Attend.sequence_id");
  ExpectShort(AttendStream(attend), GrpcCode::NOT_FOUND, "AttendStream.sequence_id");

  // The prefix cache: a huge model id or salt is the caller's mistake, a huge pool or
  // sequence id names nothing; nothing is created or cached.
  create.Clear();
  create.mutable_prefix()->set_model(huge);
  create.mutable_prefix()->add_token_ids(1);
  ExpectShort(Create(create), GrpcCode::INVALID_ARGUMENT, "CreateSequence.prefix.model");
  create.mutable_prefix()->set_model("m");
  create.mutable_prefix()->set_salt(huge);
  ExpectShort(Create(create), GrpcCode::INVALID_ARGUMENT, "CreateSequence.prefix.salt");
  pb::PublishPrefixRequest publish;
  publish.set_sequence_id(huge);
  publish.mutable_prefix()->set_model("m");
  pb::PublishPrefixResponse published;
  ExpectShort(kv_->PublishPrefix(Ctx().get(), publish, &published), GrpcCode::NOT_FOUND,
              "PublishPrefix.sequence_id");
  publish.set_sequence_id(id);
  publish.mutable_prefix()->set_model(huge);
  ExpectShort(kv_->PublishPrefix(Ctx().get(), publish, &published), GrpcCode::INVALID_ARGUMENT,
              "PublishPrefix.prefix.model");
  pb::ForkSequenceRequest fork;
  fork.set_sequence_id(huge);
  pb::SequenceInfo forked;
  ExpectShort(kv_->ForkSequence(Ctx().get(), fork, &forked), GrpcCode::NOT_FOUND,
              "ForkSequence.sequence_id");
  fork.set_sequence_id(id);
  fork.set_client_sequence_id(huge);
  ExpectShort(kv_->ForkSequence(Ctx().get(), fork, &forked), GrpcCode::INVALID_ARGUMENT,
              "ForkSequence.client_sequence_id");
  pb::LeaseRequest lease;
  lease.set_sequence_id(huge);
  pb::Lease leased;
  ExpectShort(kv_->LeaseSequence(Ctx().get(), lease, &leased), GrpcCode::NOT_FOUND,
              "LeaseSequence.sequence_id");
  lease.set_sequence_id(id);
  lease.set_ttl_ms(-1);
  ExpectShort(kv_->LeaseSequence(Ctx().get(), lease, &leased), GrpcCode::INVALID_ARGUMENT,
              "LeaseSequence.ttl_ms");
  lease.set_ttl_ms(0);
  lease.add_layers(1 << 30);
  ExpectShort(kv_->LeaseSequence(Ctx().get(), lease, &leased), GrpcCode::INVALID_ARGUMENT,
              "LeaseSequence.layers");
  pb::RenewLeaseRequest renew;
  renew.set_lease_id(huge);
  pb::RenewLeaseResponse renewed;
  ExpectShort(kv_->RenewLease(Ctx().get(), renew, &renewed), GrpcCode::NOT_FOUND,
              "RenewLease.lease_id");
  pb::ReleaseLeaseRequest release_lease;
  release_lease.set_lease_id(huge);
  pb::ReleaseLeaseResponse lease_released;
  ExpectShort(kv_->ReleaseLease(Ctx().get(), release_lease, &lease_released), GrpcCode::NOT_FOUND,
              "ReleaseLease.lease_id");
  pb::SendLeaseRequest send;
  send.set_transfer_id(huge);
  send.set_lease_id(huge);
  pb::SendLeaseResponse sent;
  ExpectShort(kv_->SendLease(Ctx().get(), send, &sent), GrpcCode::NOT_FOUND,
              "SendLease.transfer_id");
  pb::CloseTransferRequest close_transfer;
  close_transfer.set_transfer_id(huge);
  pb::CloseTransferResponse transfer_closed;
  ExpectShort(kv_->CloseTransfer(Ctx().get(), close_transfer, &transfer_closed),
              GrpcCode::NOT_FOUND, "CloseTransfer.transfer_id");
  pb::LookupPrefixRequest lookup;
  lookup.set_pool(huge);
  lookup.mutable_prefix()->set_model("m");
  pb::LookupPrefixResponse looked;
  ExpectShort(kv_->LookupPrefix(Ctx().get(), lookup, &looked), GrpcCode::NOT_FOUND,
              "LookupPrefix.pool");

  pb::GetPoolStatsRequest stats;
  stats.set_pool(huge);
  pb::PoolStats pool_stats;
  ExpectShort(admin_->GetPoolStats(Ctx().get(), stats, &pool_stats), GrpcCode::NOT_FOUND,
              "GetPoolStats.pool");

  pb::ListSequencesRequest list;
  list.set_pool(huge);
  pb::ListSequencesResponse listed;
  ExpectShort(admin_->ListSequences(Ctx().get(), list, &listed), GrpcCode::NOT_FOUND,
              "ListSequences.pool");
  list.Clear();
  list.set_tenant(huge);
  if (auth_) {
    ExpectShort(admin_->ListSequences(Ctx().get(), list, &listed), GrpcCode::PERMISSION_DENIED,
                "ListSequences.tenant");
  } else {
    const grpc::Status s = admin_->ListSequences(Ctx().get(), list, &listed);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(listed.total(), 0) << "a tenant filter nobody matches lists nothing";
  }

  pb::EvictSequenceRequest evict;
  evict.set_sequence_id(huge);
  evict.set_tenant(huge);
  pb::EvictSequenceResponse evicted;
  ExpectShort(admin_->EvictSequence(Ctx(/*admin=*/true).get(), evict, &evicted),
              GrpcCode::NOT_FOUND, "EvictSequence.sequence_id/tenant (admin)");
  if (auth_) {
    ExpectShort(admin_->EvictSequence(Ctx().get(), evict, &evicted), GrpcCode::PERMISSION_DENIED,
                "EvictSequence (tenant)");
  }

  pb::ListLeasesRequest list_leases;
  list_leases.set_pool(huge);
  pb::ListLeasesResponse leases;
  ExpectShort(admin_->ListLeases(Ctx().get(), list_leases, &leases), GrpcCode::NOT_FOUND,
              "ListLeases.pool");
  list_leases.Clear();
  list_leases.set_tenant(huge);
  if (auth_) {
    ExpectShort(admin_->ListLeases(Ctx().get(), list_leases, &leases), GrpcCode::PERMISSION_DENIED,
                "ListLeases.tenant");
  } else {
    const grpc::Status s = admin_->ListLeases(Ctx().get(), list_leases, &leases);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(leases.leases_size(), 0) << "a tenant filter nobody matches lists nothing";
  }
  pb::EndLeaseRequest end_lease;
  end_lease.set_lease_id(huge);
  end_lease.set_tenant(huge);
  pb::EndLeaseResponse lease_ended;
  ExpectShort(admin_->EndLease(Ctx(/*admin=*/true).get(), end_lease, &lease_ended),
              GrpcCode::NOT_FOUND, "EndLease.lease_id/tenant (admin)");
  if (auth_) {
    ExpectShort(admin_->EndLease(Ctx().get(), end_lease, &lease_ended), GrpcCode::PERMISSION_DENIED,
                "EndLease (tenant)");
  }

  ExpectEmpty(id);
}

TEST_P(HostileInputTest, EveryEnumOutsideTheContractIsInvalidArgument) {
  const std::string id = NewSequence();
  const auto kBadDType = static_cast<pb::DType>(42);
  const auto kBadFormat = static_cast<pb::StorageFormat>(99);

  pb::AppendRequest append = AppendReq(id, 0, 0, 4);
  append.set_dtype(kBadDType);
  ExpectShort(Append(append), GrpcCode::INVALID_ARGUMENT, "Append.dtype");
  ExpectShort(AppendStream(append), GrpcCode::INVALID_ARGUMENT, "AppendStream.dtype");

  pb::FetchRequest fetch;
  fetch.set_sequence_id(id);
  fetch.set_format(static_cast<pb::FetchFormat>(7));
  ExpectShort(Fetch(fetch), GrpcCode::INVALID_ARGUMENT, "Fetch.format");
  fetch.set_format(pb::FETCH_FORMAT_DENSE);
  fetch.set_dtype(kBadDType);
  ExpectShort(Fetch(fetch), GrpcCode::INVALID_ARGUMENT, "Fetch.dtype");

  pb::AttendRequest attend;
  attend.set_sequence_id(id);
  attend.set_dtype(kBadDType);
  attend.add_positions(0);
  attend.set_queries(std::string(kQHeads * kDim * 2, '\0'));
  ExpectShort(Attend(attend), GrpcCode::INVALID_ARGUMENT, "Attend.dtype");
  ExpectShort(AttendStream(attend), GrpcCode::INVALID_ARGUMENT, "AttendStream.dtype");

  // Each spec bad in exactly one enum; both where a spec is taken.
  std::vector<std::pair<std::string, pb::CompressionSpec>> specs;
  pb::CompressionSpec spec;
  spec.set_storage(kBadFormat);
  specs.emplace_back("storage", spec);
  spec.Clear();
  spec.mutable_snapkv()->set_window(4);
  spec.mutable_snapkv()->set_budget(8);
  spec.mutable_snapkv()->set_pooling(static_cast<pb::SnapKvSpec::Pooling>(9));
  specs.emplace_back("snapkv.pooling", spec);
  spec.mutable_snapkv()->set_pooling(pb::SnapKvSpec::POOLING_MAX);
  spec.mutable_snapkv()->set_allocation(static_cast<pb::SnapKvSpec::Allocation>(5));
  specs.emplace_back("snapkv.allocation", spec);
  spec.Clear();
  spec.mutable_expected_attention()->set_window(4);
  spec.mutable_expected_attention()->set_budget(16);
  spec.mutable_expected_attention()->set_allocation(static_cast<pb::SnapKvSpec::Allocation>(3));
  specs.emplace_back("expected_attention.allocation", spec);
  for (const auto& [field, bad] : specs) {
    pb::CreateSequenceRequest create;
    *create.mutable_policy() = bad;
    const grpc::Status created = Create(create);
    ExpectShort(created, GrpcCode::INVALID_ARGUMENT, "CreateSequence.policy." + field);
    EXPECT_THAT(created.error_message(), HasSubstr(field)) << created.error_message();
    pb::CompressRequest compress;
    compress.set_sequence_id(id);
    *compress.mutable_spec() = bad;
    const grpc::Status compressed = Compress(compress);
    ExpectShort(compressed, GrpcCode::INVALID_ARGUMENT, "Compress.spec." + field);
    EXPECT_THAT(compressed.error_message(), HasSubstr(field)) << compressed.error_message();
  }
  pb::LookupPrefixRequest lookup;
  lookup.mutable_prefix()->set_model("m");
  lookup.set_storage(kBadFormat);
  pb::LookupPrefixResponse looked;
  ExpectShort(kv_->LookupPrefix(Ctx().get(), lookup, &looked), GrpcCode::INVALID_ARGUMENT,
              "LookupPrefix.storage");
  pb::OpenTransferRequest open;
  open.set_kind(static_cast<pb::TransferKind>(7));
  pb::OpenTransferResponse opened;
  ExpectShort(kv_->OpenTransfer(Ctx().get(), open, &opened), GrpcCode::INVALID_ARGUMENT,
              "OpenTransfer.kind");
  // Keys and values over an NCCL transfer, asked of a server that offers none.
  pb::AppendRequest over_nccl;
  over_nccl.set_sequence_id(id);
  over_nccl.set_num_tokens(1);
  over_nccl.mutable_nccl()->set_transfer_id(std::string(5000, 'n'));
  over_nccl.mutable_nccl()->set_bytes(int64_t{1} << 40);
  pb::AppendResponse appended;
  ExpectShort(kv_->Append(Ctx().get(), over_nccl, &appended), GrpcCode::FAILED_PRECONDITION,
              "Append.nccl");
  pb::CompressRequest compress;
  compress.set_sequence_id(id);
  compress.mutable_spec()->mutable_h2o()->set_heavy(4);
  compress.mutable_spec()->mutable_h2o()->set_recent(4);
  pb::LayerQueries* q = compress.add_queries();
  q->set_dtype(kBadDType);
  ExpectShort(Compress(compress), GrpcCode::INVALID_ARGUMENT, "Compress.queries.dtype");

  // No sequence was created by the refused CreateSequence calls.
  pb::ListSequencesRequest list;
  pb::ListSequencesResponse listed;
  ASSERT_TRUE(admin_->ListSequences(Ctx().get(), list, &listed).ok());
  EXPECT_EQ(listed.total(), 1);
  ExpectEmpty(id);
}

TEST_P(HostileInputTest, StartPositionsAndTokenCountsAtTheIntegerLimitsAreRefused) {
  const std::string id = NewSequence();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  struct Case {
    int64_t start;
    int32_t n;
    GrpcCode code;
  };
  const Case cases[] = {
      {kMax, 4, GrpcCode::OUT_OF_RANGE},      // start + n overflows int64
      {kMax - 3, 4, GrpcCode::OUT_OF_RANGE},  // start + n == INT64_MAX + 1
      {kMax - 4, 4, GrpcCode::OUT_OF_RANGE},  // fits int64, not a position
      {int64_t{INT32_MAX}, 1, GrpcCode::OUT_OF_RANGE},
      {int64_t{INT32_MAX} - 3, 4, GrpcCode::OUT_OF_RANGE},
      {int64_t{1} << 40, 4, GrpcCode::OUT_OF_RANGE},
      {-1, 4, GrpcCode::INVALID_ARGUMENT},
      {kMin, 4, GrpcCode::INVALID_ARGUMENT},
      {kMin + 1, 4, GrpcCode::INVALID_ARGUMENT},
      {0, 0, GrpcCode::INVALID_ARGUMENT},
      {0, -1, GrpcCode::INVALID_ARGUMENT},
      {0, std::numeric_limits<int32_t>::min(), GrpcCode::INVALID_ARGUMENT},
      {0, std::numeric_limits<int32_t>::max(), GrpcCode::INVALID_ARGUMENT},
      {kMax, std::numeric_limits<int32_t>::max(), GrpcCode::INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    // Payloads sized for a small n: the range checks come before the size check.
    pb::AppendRequest r = AppendReq(id, 0, 0, 4);
    r.set_start_position(c.start);
    r.set_num_tokens(c.n);
    const std::string what = absl::StrCat("start_position ", c.start, " num_tokens ", c.n);
    ExpectShort(Append(r), c.code, "Append " + what);
    ExpectShort(AppendStream(r), c.code, "AppendStream " + what);
  }
  // One below the limit is in range but out of order: the order check, not the range check.
  pb::AppendRequest r = AppendReq(id, 0, 0, 4);
  r.set_start_position(int64_t{INT32_MAX} - 4);
  ExpectShort(Append(r), GrpcCode::FAILED_PRECONDITION, "start_position 2^31-5");
  ExpectEmpty(id);
}

// A request past a size or count limit: INVALID_ARGUMENT with a short message that names the
// field and the limit.
void ExpectLimit(const grpc::Status& s, const std::string& what, const std::string& field,
                 const std::string& limit) {
  ExpectShort(s, GrpcCode::INVALID_ARGUMENT, what);
  EXPECT_THAT(s.error_message(), HasSubstr(field)) << what;
  EXPECT_THAT(s.error_message(), HasSubstr(limit)) << what;
}

// Every size or count a request chooses that drives the server's work has a bound: past it,
// the request is refused before any work, and the refusal names the field and the bound.
// Each case is a request that is valid but for that one field (it would run without the
// check), so each fails when its check is removed.
TEST_P(HostileInputTest, SizesAndCountsPastTheirLimitsAreRefusedBeforeAnyWork) {
  const std::string id = NewSequence();
  constexpr int kTokens = 64;
  for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(Append(AppendReq(id, l, 0, kTokens)).ok());
  // SnapKV with the observation window's queries of every layer.
  pb::CompressRequest snap;
  snap.set_sequence_id(id);
  pb::SnapKvSpec* snapkv = snap.mutable_spec()->mutable_snapkv();
  snapkv->set_window(4);
  snapkv->set_budget(16);
  snapkv->set_pooling_kernel(7);
  for (int l = 0; l < kLayers; ++l) {
    pb::LayerQueries* q = snap.add_queries();
    q->set_layer(l);
    for (int i = 0; i < 4; ++i) q->add_positions(kTokens - 4 + i);
    q->set_queries(std::string(4 * kQHeads * kDim * 2, '\0'));
  }
  const std::string tokens = absl::StrCat(kMaxPolicyTokens);
  constexpr int kOver = kMaxPolicyTokens + 1;
  constexpr int kInt32Max = std::numeric_limits<int32_t>::max();

  struct SpecCase {
    std::string field, limit;
    pb::CompressionSpec spec;
  };
  std::vector<SpecCase> specs;
  auto add = [&](const std::string& field, const std::string& limit, auto&& set) {
    SpecCase c{field, limit, {}};
    set(&c.spec);
    specs.push_back(std::move(c));
  };
  add("streaming_llm.sinks", tokens, [&](pb::CompressionSpec* s) {
    s->mutable_streaming_llm()->set_sinks(kOver);
    s->mutable_streaming_llm()->set_window(16);
  });
  add("streaming_llm.window", tokens, [&](pb::CompressionSpec* s) {
    s->mutable_streaming_llm()->set_sinks(4);
    s->mutable_streaming_llm()->set_window(kInt32Max);
  });
  add("h2o.heavy", tokens, [&](pb::CompressionSpec* s) {
    s->mutable_h2o()->set_heavy(kOver);
    s->mutable_h2o()->set_recent(4);
  });
  add("h2o.heavy", tokens, [&](pb::CompressionSpec* s) {  // heavy + recent overflowed int32
    s->mutable_h2o()->set_heavy(kInt32Max);
    s->mutable_h2o()->set_recent(kInt32Max);
  });
  add("h2o.recent", tokens, [&](pb::CompressionSpec* s) {
    s->mutable_h2o()->set_heavy(4);
    s->mutable_h2o()->set_recent(kOver);
  });
  add("snapkv.budget", tokens, [&](pb::CompressionSpec* s) {
    *s = snap.spec();
    s->mutable_snapkv()->set_budget(kOver);
  });
  add("snapkv.window", absl::StrCat(kMaxScoringQueries), [&](pb::CompressionSpec* s) {
    *s = snap.spec();
    s->mutable_snapkv()->set_window(kMaxScoringQueries + 1);
    s->mutable_snapkv()->set_budget(2 * kMaxScoringQueries);
  });
  for (const int kernel : {kMaxPoolingKernel + 2, kInt32Max}) {
    add("snapkv.pooling_kernel", absl::StrCat(kMaxPoolingKernel), [&](pb::CompressionSpec* s) {
      *s = snap.spec();
      s->mutable_snapkv()->set_pooling_kernel(kernel);
    });
  }
  add("expected_attention.budget", tokens, [&](pb::CompressionSpec* s) {
    s->mutable_expected_attention()->set_window(4);
    s->mutable_expected_attention()->set_budget(kOver);
  });
  add("expected_attention.window", tokens, [&](pb::CompressionSpec* s) {
    s->mutable_expected_attention()->set_window(kOver);
    s->mutable_expected_attention()->set_budget(16);
  });
  add("expected_attention.sinks", tokens, [&](pb::CompressionSpec* s) {
    s->mutable_expected_attention()->set_sinks(kOver);
    s->mutable_expected_attention()->set_budget(16);
  });
  add("expected_attention.future_positions", absl::StrCat(kMaxFuturePositions),
      [&](pb::CompressionSpec* s) {
        s->mutable_expected_attention()->set_window(4);
        s->mutable_expected_attention()->set_budget(16);
        s->mutable_expected_attention()->set_future_positions(kMaxFuturePositions + 1);
      });
  add("residual_tokens", tokens, [&](pb::CompressionSpec* s) { s->set_residual_tokens(kOver); });
  for (const SpecCase& c : specs) {
    pb::CreateSequenceRequest create;
    *create.mutable_policy() = c.spec;
    ExpectLimit(Create(create), "CreateSequence.policy." + c.field, c.field, c.limit);
    pb::CompressRequest compress = snap;
    *compress.mutable_spec() = c.spec;
    if (!c.spec.has_snapkv()) compress.clear_queries();
    ExpectLimit(Compress(compress), "Compress.spec." + c.field, c.field, c.limit);
  }

  // H2O's prompt queries: one more than the bound on every layer, each the right size.
  pb::CompressRequest h2o;
  h2o.set_sequence_id(id);
  h2o.mutable_spec()->mutable_h2o()->set_heavy(8);
  h2o.mutable_spec()->mutable_h2o()->set_recent(8);
  for (int l = 0; l < kLayers; ++l) {
    pb::LayerQueries* q = h2o.add_queries();
    q->set_layer(l);
    for (int i = 0; i <= kMaxScoringQueries; ++i) q->add_positions(kTokens - 1);
    q->set_queries(std::string(size_t{kMaxScoringQueries + 1} * kQHeads * kDim * 2, '\0'));
  }
  ExpectLimit(Compress(h2o), "Compress.queries (h2o)", "queries for layer 0",
              absl::StrCat("at most ", kMaxScoringQueries));
  // More entries than a pool has layers: refused before they are copied.
  pb::CompressRequest many = snap;
  for (int i = kLayers; i <= kMaxLayers; ++i) *many.add_queries() = snap.queries(0);
  ExpectLimit(Compress(many), "Compress.queries (entries)", "queries has 1025 entries",
              absl::StrCat("at most ", kMaxLayers));
  pb::CompressRequest stats;
  stats.set_sequence_id(id);
  stats.mutable_spec()->mutable_expected_attention()->set_window(4);
  stats.mutable_spec()->mutable_expected_attention()->set_budget(16);
  for (int i = 0; i <= kMaxLayers; ++i) stats.add_query_stats()->set_layer(i % kLayers);
  ExpectLimit(Compress(stats), "Compress.query_stats (entries)", "query_stats has 1025 entries",
              absl::StrCat("at most ", kMaxLayers));

  pb::FetchRequest fetch;
  fetch.set_sequence_id(id);
  for (int i = 0; i <= kMaxLayers; ++i) fetch.add_layers(i % kLayers);
  ExpectLimit(Fetch(fetch), "Fetch.layers (entries)", "layers has 1025 entries",
              absl::StrCat("at most ", kMaxLayers));
  fetch.clear_layers();
  fetch.add_layers(1);
  fetch.add_layers(1);  // the layer would be read and sent twice
  ExpectLimit(Fetch(fetch), "Fetch.layers (twice)", "layers: 1", "named twice");

  // Nothing changed and nothing was created.
  pb::GetSequenceRequest get;
  get.set_sequence_id(id);
  pb::SequenceInfo info;
  ASSERT_TRUE(kv_->GetSequence(Ctx().get(), get, &info).ok());
  EXPECT_EQ(info.stored_token_heads(), kTokens * kHeads * kLayers);
  pb::ListSequencesRequest list;
  pb::ListSequencesResponse listed;
  ASSERT_TRUE(admin_->ListSequences(Ctx().get(), list, &listed).ok());
  EXPECT_EQ(listed.total(), 1);
  // At the bound, the request is served.
  snap.mutable_spec()->mutable_snapkv()->set_pooling_kernel(kMaxPoolingKernel);
  const grpc::Status at_bound = Compress(snap);
  EXPECT_TRUE(at_bound.ok()) << at_bound.error_message();
}

// Attend with return_weights over a long sequence: the weights cannot fit in one response.
TEST_P(HostileInputTest, AttendWeightsOverTheLimitAreRefusedBeforeAnyAttentionIsComputed) {
  ServerOptions options = testing::SmallServerOptions();
  options.max_message_bytes = 256 << 10;
  server_.reset();
  Start(options, auth_);
  const std::string id = NewSequence();
  constexpr int kTokens = 2048;  // 1 block per 16 tokens: 128 x 8 blocks
  for (int l = 0; l < kLayers; ++l) {
    for (int at = 0; at < kTokens; at += 512) {
      const grpc::Status s = Append(AppendReq(id, l, at, 512));
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }
  pb::AttendRequest attend;
  attend.set_sequence_id(id);
  attend.set_layer(1);
  constexpr int kQueries = 8;
  for (int i = 0; i < kQueries; ++i) attend.add_positions(kTokens + i);
  attend.set_queries(std::string(kQueries * kQHeads * kDim * 2, '\0'));
  attend.set_return_weights(true);  // 8 x 4 x 2048 x 4 bytes = 256 KiB of weights alone

  const int64_t calls_before = attention_calls_.load();
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status refused = Attend(attend);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectShort(refused, GrpcCode::RESOURCE_EXHAUSTED, "Attend with weights");
  EXPECT_THAT(refused.error_message(), HasSubstr("send fewer queries per call"));
  EXPECT_THAT(refused.error_message(), HasSubstr("return_weights false"));
  EXPECT_THAT(refused.error_message(), ::testing::Not(HasSubstr("larger than max")));
  EXPECT_EQ(attention_calls_.load(), calls_before) << "attention was computed, then refused";
  ExpectShort(AttendStream(attend), GrpcCode::RESOURCE_EXHAUSTED, "AttendStream with weights");
  EXPECT_EQ(attention_calls_.load(), calls_before);
  std::printf("refused Attend answered in %.1f ms\n", seconds * 1e3);

  // What the message asks for works: one query with weights, or all without.
  attend.set_return_weights(false);
  pb::AttendResponse response;
  grpc::Status s = Attend(attend, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.output().size(), attend.queries().size());
  EXPECT_GT(attention_calls_.load(), calls_before);
  attend.set_return_weights(true);
  attend.clear_positions();
  attend.add_positions(kTokens);
  attend.set_queries(std::string(kQHeads * kDim * 2, '\0'));
  s = Attend(attend, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.weights_size(), kQHeads * kTokens);
  EXPECT_EQ(response.weight_positions_size(), kHeads * kTokens);
}

INSTANTIATE_TEST_SUITE_P(Auth, HostileInputTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "WithTokens" : "Open";
                         });

// Enums of the server's own configuration: an unknown number is an error at startup, not a
// silent default (a wrong RoPE pairing would re-rotate keys wrongly; a role, widen access).
TEST(ConfigEnumTest, UnknownRopeStyleAndRoleAreRefused) {
  const std::string pool =
      "pools { name: 'p' capacity_bytes: 1048576 geometry { num_layers: 1 num_kv_heads: 1 "
      "head_dim: 64 rope { theta: 10000 rotary_dim: 64 style: %s } } }\n";
  const auto bad_style = ParseServerConfig(absl::StrReplaceAll(pool, {{"%s", "5"}}));
  EXPECT_EQ(bad_style.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_style.status().message()), HasSubstr("geometry.rope.style is 5"));
  EXPECT_TRUE(ParseServerConfig(absl::StrReplaceAll(pool, {{"%s", "ROPE_STYLE_GPTJ"}})).ok());

  const std::string auth = absl::StrReplaceAll(pool, {{"%s", "ROPE_STYLE_NEOX"}}) +
                           "tls { cert_file: '/c.pem' key_file: '/k.pem' client_ca_file: "
                           "'/ca.pem' }\nauth { client_identities { san: 'spiffe://x' "
                           "tenant: 'a' role: %s } }\n";
  const auto bad_role = ParseServerConfig(absl::StrReplaceAll(auth, {{"%s", "7"}}));
  EXPECT_EQ(bad_role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_role.status().message()), HasSubstr("has role 7"));
  EXPECT_TRUE(ParseServerConfig(absl::StrReplaceAll(auth, {{"%s", "ROLE_ADMIN"}})).ok());
}

}  // namespace
}  // namespace kvc::cachesvc
