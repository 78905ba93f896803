// Authentication, authorization and quotas through real gRPC calls to an in-process
// kvcached: tokens from a real tokens file (salted SHA-256), every RPC checked without
// credentials, across tenants, by role, and against per-tenant limits.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "cachesvc/rpc/authenticator.h"
#include "cachesvc/rpc/call_limits.h"
#include "cachesvc/rpc/server.h"
#include "common/token_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/http_get.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/test_server.h"

namespace kvc::cachesvc {
namespace {

namespace pb = ::kvcache::v1;
using ::testing::HasSubstr;

constexpr char kTokenA[] = "token-of-tenant-a-0123456789abcdef";
constexpr char kTokenB[] = "token-of-tenant-b-0123456789abcdef";
constexpr char kTokenAdmin[] = "token-of-the-admin-0123456789abcd";

std::string TokenLine(const std::string& tenant, const std::string& role,
                      const std::string& token) {
  const std::string salt = *RandomBytes(16);
  return absl::StrCat(tenant, " ", role, " ", ToHex(salt), " ", TokenHashHex(salt, token), "\n");
}

// A directory of its own per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvc-auth-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes `text` to `path` atomically (a rename), as an operator's tooling or a Kubernetes
// Secret update would.
void WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(const std::vector<TenantQuota>& quotas) {
    tokens_file_ = dir_.path() + "/tokens";
    WriteAtomically(tokens_file_, "# kvcached tokens\n" + TokenLine("a", "tenant", kTokenA) +
                                      TokenLine("b", "tenant", kTokenB) +
                                      TokenLine("ops", "admin", kTokenAdmin));
    ServerOptions options = testing::SmallServerOptions();
    options.metrics_listen = "127.0.0.1:0";
    options.auth.tokens_file = tokens_file_;
    options.auth.reload_interval_seconds = 1;
    options.transfer_listen = "127.0.0.1:0";  // the transfer RPCs are in the sweeps too
    options.store.quotas = quotas;
    server_.reset();
    auto server = KvCacheServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    kv_ = pb::KvCacheService::NewStub(channel_);
    admin_ = pb::AdminService::NewStub(channel_);
  }

  // A context carrying `token` (none when empty).
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  grpc::Status Create(const std::string& token, const std::string& id,
                      const std::string& tenant = "") {
    pb::CreateSequenceRequest r;
    r.set_client_sequence_id(id);
    r.set_tenant(tenant);
    pb::SequenceInfo info;
    return kv_->CreateSequence(Ctx(token).get(), r, &info);
  }

  pb::AppendRequest AppendReq(const std::string& id, int layer, int64_t start, int n,
                              uint32_t seed) {
    pb::AppendRequest r;
    r.set_sequence_id(id);
    r.set_layer(layer);
    r.set_start_position(start);
    r.set_num_tokens(n);
    r.set_keys(testing::MakeKv(seed, layer, start, n, 2, 32, kernels::DType::kF16,
                               /*is_value=*/false));
    r.set_values(testing::MakeKv(seed, layer, start, n, 2, 32, kernels::DType::kF16,
                                 /*is_value=*/true));
    return r;
  }

  grpc::Status Append(const std::string& token, const std::string& id, int layer, int64_t start,
                      int n, uint32_t seed = 1) {
    pb::AppendResponse response;
    return kv_->Append(Ctx(token).get(), AppendReq(id, layer, start, n, seed), &response);
  }

  // Appends `n` tokens to every layer.
  grpc::Status AppendAll(const std::string& token, const std::string& id, int64_t start, int n,
                         uint32_t seed = 1) {
    for (int layer = 0; layer < 4; ++layer) {
      grpc::Status s = Append(token, id, layer, start, n, seed);
      if (!s.ok()) return s;
    }
    return grpc::Status::OK;
  }

  // Every chunk of a Fetch, concatenated (keys then values), or the error.
  grpc::Status Fetch(const std::string& token, const std::string& id, std::string* out,
                     const std::string& tenant = "") {
    pb::FetchRequest r;
    r.set_sequence_id(id);
    r.set_tenant(tenant);
    auto ctx = Ctx(token);
    auto reader = kv_->Fetch(ctx.get(), r);
    pb::FetchChunk chunk;
    out->clear();
    while (reader->Read(&chunk)) absl::StrAppend(out, chunk.keys(), chunk.values());
    return reader->Finish();
  }

  static pb::PrefixSpec SweepPrefix() {
    pb::PrefixSpec prefix;
    prefix.set_model("sweep-model");
    for (int i = 0; i < 16; ++i) prefix.add_token_ids(100 + i);
    return prefix;
  }
  // The lease and transfer the sweep names for sequence `id`: the ones a test recorded (a's,
  // to try as b), else ids nobody was given.
  std::string LeaseOf(const std::string& id) const {
    auto it = leases_.find(id);
    return it == leases_.end() ? "l-" + std::string(32, '0') : it->second;
  }
  std::string TransferOf(const std::string& id) const {
    auto it = transfers_.find(id);
    return it == transfers_.end() ? "t-" + std::string(32, '0') : it->second;
  }

  // One call of every RPC on sequence `id` (or none) with `token`; name -> status.
  std::vector<std::pair<std::string, grpc::Status>> EveryRpc(const std::string& token,
                                                             const std::string& id) {
    std::vector<std::pair<std::string, grpc::Status>> out;
    {
      pb::CreateSequenceRequest r;
      r.set_client_sequence_id("fresh-" + id);
      pb::SequenceInfo info;
      out.emplace_back("CreateSequence", kv_->CreateSequence(Ctx(token).get(), r, &info));
    }
    out.emplace_back("Append", Append(token, id, 0, 16, 16));
    {
      auto ctx = Ctx(token);
      pb::AppendStreamResponse response;
      auto writer = kv_->AppendStream(ctx.get(), &response);
      writer->Write(AppendReq(id, 1, 16, 16, 1));
      writer->WritesDone();
      out.emplace_back("AppendStream", writer->Finish());
    }
    {
      std::string data;
      out.emplace_back("Fetch", Fetch(token, id, &data));
    }
    {
      pb::GetSequenceRequest r;
      r.set_sequence_id(id);
      pb::SequenceInfo info;
      out.emplace_back("GetSequence", kv_->GetSequence(Ctx(token).get(), r, &info));
    }
    {
      pb::AttendRequest r;
      r.set_sequence_id(id);
      r.set_layer(0);
      r.set_queries(std::string(4 * 32 * 2, '\0'));
      r.add_positions(1000);
      pb::AttendResponse response;
      out.emplace_back("Attend", kv_->Attend(Ctx(token).get(), r, &response));
      auto ctx = Ctx(token);
      auto stream = kv_->AttendStream(ctx.get());
      stream->Write(r);
      stream->WritesDone();
      while (stream->Read(&response)) {
      }
      out.emplace_back("AttendStream", stream->Finish());
    }
    {
      pb::CompressRequest r;
      r.set_sequence_id(id);
      r.mutable_spec()->set_storage(pb::STORAGE_FORMAT_INT8);
      pb::CompressResponse response;
      out.emplace_back("Compress", kv_->Compress(Ctx(token).get(), r, &response));
    }
    {
      pb::ForkSequenceRequest fork;
      fork.set_sequence_id(id);
      pb::SequenceInfo forked;
      out.emplace_back("ForkSequence", kv_->ForkSequence(Ctx(token).get(), fork, &forked));
      pb::PublishPrefixRequest publish;
      publish.set_sequence_id(id);
      *publish.mutable_prefix() = SweepPrefix();
      pb::PublishPrefixResponse published;
      out.emplace_back("PublishPrefix", kv_->PublishPrefix(Ctx(token).get(), publish, &published));
      pb::LookupPrefixRequest lookup;
      *lookup.mutable_prefix() = SweepPrefix();
      pb::LookupPrefixResponse found;
      out.emplace_back("LookupPrefix", kv_->LookupPrefix(Ctx(token).get(), lookup, &found));
      pb::LeaseRequest lease;
      lease.set_sequence_id(id);
      pb::Lease leased;
      out.emplace_back("LeaseSequence", kv_->LeaseSequence(Ctx(token).get(), lease, &leased));
      const std::string lease_id = LeaseOf(id);
      pb::RenewLeaseRequest renew;
      renew.set_lease_id(lease_id);
      pb::RenewLeaseResponse renewed;
      out.emplace_back("RenewLease", kv_->RenewLease(Ctx(token).get(), renew, &renewed));
      pb::OpenTransferRequest open;
      pb::OpenTransferResponse opened;
      out.emplace_back("OpenTransfer", kv_->OpenTransfer(Ctx(token).get(), open, &opened));
      pb::SendLeaseRequest send;
      send.set_transfer_id(TransferOf(id));
      send.set_lease_id(lease_id);
      pb::SendLeaseResponse sent;
      out.emplace_back("SendLease", kv_->SendLease(Ctx(token).get(), send, &sent));
      pb::CloseTransferRequest close;
      close.set_transfer_id(TransferOf(id));
      pb::CloseTransferResponse closed;
      out.emplace_back("CloseTransfer", kv_->CloseTransfer(Ctx(token).get(), close, &closed));
      pb::ReleaseLeaseRequest end;
      end.set_lease_id(lease_id);
      pb::ReleaseLeaseResponse ended;
      out.emplace_back("ReleaseLease", kv_->ReleaseLease(Ctx(token).get(), end, &ended));
    }
    {
      pb::ReleaseRequest r;
      r.set_sequence_id(id);
      pb::ReleaseResponse response;
      out.emplace_back("Release", kv_->Release(Ctx(token).get(), r, &response));
    }
    {
      pb::ListPoolsResponse response;
      out.emplace_back("ListPools", admin_->ListPools(Ctx(token).get(), {}, &response));
      pb::PoolStats stats;
      out.emplace_back("GetPoolStats", admin_->GetPoolStats(Ctx(token).get(), {}, &stats));
      pb::ListSequencesResponse list;
      out.emplace_back("ListSequences", admin_->ListSequences(Ctx(token).get(), {}, &list));
      pb::EvictSequenceRequest evict;
      evict.set_sequence_id(id);
      pb::EvictSequenceResponse evicted;
      out.emplace_back("EvictSequence", admin_->EvictSequence(Ctx(token).get(), evict, &evicted));
      pb::DrainRequest drain;
      drain.set_resume(true);
      pb::DrainResponse drained;
      out.emplace_back("Drain", admin_->Drain(Ctx(token).get(), drain, &drained));
      pb::ListTenantsResponse tenants;
      out.emplace_back("ListTenants", admin_->ListTenants(Ctx(token).get(), {}, &tenants));
      pb::ServerInfo info;
      out.emplace_back("GetServerInfo", admin_->GetServerInfo(Ctx(token).get(), {}, &info));
      pb::ListLeasesResponse leases;
      out.emplace_back("ListLeases", admin_->ListLeases(Ctx(token).get(), {}, &leases));
      pb::EndLeaseRequest end;
      end.set_lease_id(id);
      pb::EndLeaseResponse ended;
      out.emplace_back("EndLease", admin_->EndLease(Ctx(token).get(), end, &ended));
    }
    return out;
  }

  TempDir dir_;
  std::string tokens_file_;
  std::map<std::string, std::string> leases_, transfers_;  // sequence id -> what LeaseOf says
  std::unique_ptr<KvCacheServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KvCacheService::Stub> kv_;
  std::unique_ptr<pb::AdminService::Stub> admin_;
};

TEST_F(AuthTest, EveryRpcWithoutValidCredentialsIsUnauthenticatedAndChangesNothing) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  ASSERT_TRUE(AppendAll(kTokenA, "doc", 0, 16).ok());
  std::string before;
  ASSERT_TRUE(Fetch(kTokenA, "doc", &before).ok());
  // A token that worked and was revoked is refused like one that never did.
  constexpr char kTokenC[] = "token-of-tenant-c-0123456789abcdef";
  const std::string base = TokenLine("a", "tenant", kTokenA) + TokenLine("b", "tenant", kTokenB) +
                           TokenLine("ops", "admin", kTokenAdmin);
  WriteAtomically(tokens_file_, base + TokenLine("c", "tenant", kTokenC));
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  ASSERT_TRUE(Create(kTokenC, "c-doc").ok());
  WriteAtomically(tokens_file_, base);
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  for (const std::string token :
       {"", "not-a-token", "token-of-tenant-a-0123456789abcdeX", kTokenC}) {
    const auto results = EveryRpc(token, "doc");
    EXPECT_EQ(results.size(), 27u) << "every RPC of both services";
    for (const auto& [rpc, status] : results) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << rpc << " with token '" << token << "': " << status.error_message();
      EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr(kTokenA)));
    }
  }
  {  // A malformed header is refused as such.
    auto ctx = Ctx("");
    ctx->AddMetadata("authorization", std::string("Basic ") + kTokenA);
    pb::SequenceInfo info;
    pb::GetSequenceRequest r;
    r.set_sequence_id("doc");
    const grpc::Status s = kv_->GetSequence(ctx.get(), r, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), HasSubstr("Bearer"));
  }
  std::string after;
  ASSERT_TRUE(Fetch(kTokenA, "doc", &after).ok());
  EXPECT_EQ(before, after);
  EXPECT_THAT(testing::HttpGet(server_->metrics_address(), "/metrics"),
              HasSubstr("kvc_auth_failures_total "));
}

TEST_F(AuthTest, AnotherTenantsSequenceIsIndistinguishableFromAMissingOne) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  ASSERT_TRUE(AppendAll(kTokenA, "doc", 0, 32).ok());
  std::string a_data;
  ASSERT_TRUE(Fetch(kTokenA, "doc", &a_data).ok());

  // Tenant b on a's "doc" and on an id nobody created: the same codes and messages.
  // a's lease and transfer on it, a's published prefix: b names them too.
  {
    pb::LeaseRequest r;
    r.set_sequence_id("doc");
    pb::Lease lease;
    ASSERT_TRUE(kv_->LeaseSequence(Ctx(kTokenA).get(), r, &lease).ok());
    leases_["doc"] = lease.lease_id();
    pb::OpenTransferResponse opened;
    ASSERT_TRUE(kv_->OpenTransfer(Ctx(kTokenA).get(), {}, &opened).ok());
    transfers_["doc"] = opened.transfer_id();
    pb::PublishPrefixRequest publish;
    publish.set_sequence_id("doc");
    *publish.mutable_prefix() = SweepPrefix();
    pb::PublishPrefixResponse published;
    ASSERT_TRUE(kv_->PublishPrefix(Ctx(kTokenA).get(), publish, &published).ok());
    ASSERT_EQ(published.published_tokens(), 16);
  }
  const auto on_a = EveryRpc(kTokenB, "doc");
  const auto on_missing = EveryRpc(kTokenB, "nope");
  ASSERT_EQ(on_a.size(), on_missing.size());
  ASSERT_EQ(on_a.size(), 27u);
  const auto normalized = [&](const std::string& message, const std::string& id) {
    return absl::StrReplaceAll(message, {{absl::StrCat("'", id, "'"), "'ID'"},
                                         {LeaseOf(id), "LEASE"},
                                         {TransferOf(id), "TRANSFER"}});
  };
  for (size_t i = 0; i < on_a.size(); ++i) {
    const auto& [rpc, status] = on_a[i];
    if (rpc == "CreateSequence" || rpc == "ListPools" || rpc == "GetPoolStats" ||
        rpc == "ListSequences" || rpc == "ListTenants" || rpc == "GetServerInfo" ||
        rpc == "ListLeases" || rpc == "LookupPrefix" || rpc == "OpenTransfer") {
      continue;  // not about the sequence
    }
    if (rpc == "EvictSequence" || rpc == "Drain" || rpc == "EndLease") {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << rpc;
      continue;
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
        << rpc << ": " << status.error_message();
    EXPECT_EQ(status.error_code(), on_missing[i].second.error_code()) << rpc;
    EXPECT_EQ(normalized(status.error_message(), "doc"),
              normalized(on_missing[i].second.error_message(), "nope"))
        << rpc;
  }
  // None of it touched a's: its lease renews, its transfer closes, and b's lookup of a's
  // published tokens finds none of them (the prefix cache is per tenant).
  pb::RenewLeaseRequest renew;
  renew.set_lease_id(LeaseOf("doc"));
  pb::RenewLeaseResponse renewed;
  EXPECT_TRUE(kv_->RenewLease(Ctx(kTokenA).get(), renew, &renewed).ok());
  pb::LookupPrefixRequest lookup;
  *lookup.mutable_prefix() = SweepPrefix();
  pb::LookupPrefixResponse found;
  ASSERT_TRUE(kv_->LookupPrefix(Ctx(kTokenB).get(), lookup, &found).ok());
  EXPECT_EQ(found.cached_tokens(), 0);
  ASSERT_TRUE(kv_->LookupPrefix(Ctx(kTokenA).get(), lookup, &found).ok());
  EXPECT_EQ(found.cached_tokens(), 16);
  pb::CloseTransferRequest close;
  close.set_transfer_id(TransferOf("doc"));
  pb::CloseTransferResponse closed;
  EXPECT_TRUE(kv_->CloseTransfer(Ctx(kTokenA).get(), close, &closed).ok());
  // b may use the same id for its own sequence: ids are per tenant, so a taken id reveals
  // nothing, and the two sequences stay apart.
  ASSERT_TRUE(Create(kTokenB, "doc").ok());
  ASSERT_TRUE(AppendAll(kTokenB, "doc", 0, 16, /*seed=*/7).ok());
  std::string b_data, a_again;
  ASSERT_TRUE(Fetch(kTokenB, "doc", &b_data).ok());
  ASSERT_TRUE(Fetch(kTokenA, "doc", &a_again).ok());
  EXPECT_EQ(a_again, a_data);
  EXPECT_NE(b_data, a_data);
  EXPECT_EQ(b_data.size() * 2, a_data.size());
}

TEST_F(AuthTest, TenantFieldsCannotClaimAnotherTenant) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  const grpc::Status create = Create(kTokenB, "x", /*tenant=*/"a");
  EXPECT_EQ(create.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Create(kTokenB, "y", /*tenant=*/"b").ok());
  std::string data;
  EXPECT_EQ(Fetch(kTokenB, "doc", &data, /*tenant=*/"a").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  pb::ListSequencesRequest list;
  list.set_tenant("a");
  pb::ListSequencesResponse listed;
  EXPECT_EQ(admin_->ListSequences(Ctx(kTokenB).get(), list, &listed).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(AuthTest, AdminReadsAndEvictsAnyTenantsSequencesAndTenantsSeeOnlyTheirOwn) {
  ASSERT_TRUE(Create(kTokenA, "a1").ok());
  ASSERT_TRUE(Create(kTokenA, "a2").ok());
  ASSERT_TRUE(Create(kTokenB, "b1").ok());
  ASSERT_TRUE(AppendAll(kTokenA, "a1", 0, 16).ok());
  ASSERT_TRUE(AppendAll(kTokenB, "b1", 0, 32).ok());

  auto list = [&](const std::string& token) {
    pb::ListSequencesResponse r;
    EXPECT_TRUE(admin_->ListSequences(Ctx(token).get(), {}, &r).ok());
    std::vector<std::string> ids;
    for (const auto& s : r.sequences()) ids.push_back(s.tenant() + "/" + s.sequence_id());
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  EXPECT_THAT(list(kTokenA), ::testing::ElementsAre("a/a1", "a/a2"));
  EXPECT_THAT(list(kTokenB), ::testing::ElementsAre("b/b1"));
  EXPECT_THAT(list(kTokenAdmin), ::testing::ElementsAre("a/a1", "a/a2", "b/b1"));

  // Statistics: a tenant gets its own use, the admin the pool's.
  pb::PoolStats a_stats, b_stats, all;
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenA).get(), {}, &a_stats).ok());
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenB).get(), {}, &b_stats).ok());
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenAdmin).get(), {}, &all).ok());
  EXPECT_EQ(a_stats.tenant(), "a");
  EXPECT_EQ(a_stats.sequences(), 2);
  EXPECT_EQ(b_stats.sequences(), 1);
  EXPECT_GT(a_stats.used_bytes(), 0);
  EXPECT_EQ(b_stats.used_bytes(), 2 * a_stats.used_bytes());
  EXPECT_EQ(all.tenant(), "");
  EXPECT_EQ(all.sequences(), 3);
  EXPECT_EQ(all.used_bytes(), a_stats.used_bytes() + b_stats.used_bytes());
  EXPECT_EQ(a_stats.stored_token_heads(), 0);  // pool-wide counters are not a tenant's

  // GetServerInfo: any tenant may read who the server is (cluster clients route with it).
  {
    pb::ServerInfo info;
    EXPECT_TRUE(admin_->GetServerInfo(Ctx(kTokenA).get(), {}, &info).ok());
    EXPECT_EQ(info.incarnation().size(), 8u);
  }

  // ListTenants: a tenant sees itself, the admin everyone.
  auto tenants = [&](const std::string& token) {
    pb::ListTenantsResponse r;
    EXPECT_TRUE(admin_->ListTenants(Ctx(token).get(), {}, &r).ok());
    std::vector<std::string> out;
    for (const auto& t : r.tenants()) {
      out.push_back(absl::StrCat(t.tenant(), ":", t.sequences(), ":", t.pool_bytes().at("small")));
    }
    return out;
  };
  EXPECT_THAT(tenants(kTokenA), ::testing::ElementsAre(absl::StrCat("a:2:", a_stats.used_bytes())));
  EXPECT_THAT(tenants(kTokenAdmin),
              ::testing::ElementsAre(absl::StrCat("a:2:", a_stats.used_bytes()),
                                     absl::StrCat("b:1:", b_stats.used_bytes())));

  // The admin reads a's data with the tenant field, and only the admin evicts.
  std::string by_a, by_admin;
  ASSERT_TRUE(Fetch(kTokenA, "a1", &by_a).ok());
  ASSERT_TRUE(Fetch(kTokenAdmin, "a1", &by_admin, "a").ok());
  EXPECT_EQ(by_admin, by_a);
  EXPECT_EQ(Fetch(kTokenAdmin, "a1", &by_admin).error_code(), grpc::StatusCode::NOT_FOUND)
      << "without the tenant field the admin acts in its own id space";
  pb::EvictSequenceRequest evict;
  evict.set_sequence_id("a1");
  evict.set_tenant("a");
  pb::EvictSequenceResponse evicted;
  EXPECT_EQ(admin_->EvictSequence(Ctx(kTokenB).get(), evict, &evicted).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(admin_->EvictSequence(Ctx(kTokenA).get(), evict, &evicted).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(admin_->EvictSequence(Ctx(kTokenAdmin).get(), evict, &evicted).ok());
  EXPECT_GT(evicted.freed_bytes(), 0);
  EXPECT_THAT(list(kTokenA), ::testing::ElementsAre("a/a2"));
  pb::DrainRequest drain;
  pb::DrainResponse drained;
  EXPECT_EQ(admin_->Drain(Ctx(kTokenA).get(), drain, &drained).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(server_->store()->stats().draining());
  ASSERT_TRUE(admin_->Drain(Ctx(kTokenAdmin).get(), drain, &drained).ok());
  EXPECT_TRUE(drained.draining());

  // Per-tenant series carry the authenticated tenants' names.
  const std::string metrics = testing::HttpGet(server_->metrics_address(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("kvc_tenant_sequences{tenant=\"b\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("kvc_tenant_used_bytes{pool=\"small\",tenant=\"b\"} " +
                                 std::to_string(b_stats.used_bytes())));
}

// Leases through gRPC with three credentials: each tenant lists only its own leases, only
// the admin lists everyone's and ends any of them (audited; a tenant gets PERMISSION_DENIED
// for another's lease and for its own: tenants end theirs with ReleaseLease), and the bytes a
// lease alone pins show in the tenant's statistics and the metrics.
TEST_F(AuthTest, AdminListsAndEndsAnyTenantsLeasesAndTenantsSeeOnlyTheirOwn) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  ASSERT_TRUE(AppendAll(kTokenA, "doc", 0, 32).ok());
  ASSERT_TRUE(Create(kTokenB, "doc").ok());
  ASSERT_TRUE(AppendAll(kTokenB, "doc", 0, 16).ok());
  auto lease = [&](const std::string& token) {
    pb::LeaseRequest r;
    r.set_sequence_id("doc");
    pb::Lease l;
    EXPECT_TRUE(kv_->LeaseSequence(Ctx(token).get(), r, &l).ok());
    return l;
  };
  const pb::Lease a = lease(kTokenA);
  const pb::Lease b = lease(kTokenB);
  auto list = [&](const std::string& token, const std::string& tenant, grpc::Status* status) {
    pb::ListLeasesRequest r;
    r.set_tenant(tenant);
    pb::ListLeasesResponse response;
    *status = admin_->ListLeases(Ctx(token).get(), r, &response);
    std::vector<std::string> out;
    for (const pb::LeaseInfo& l : response.leases()) {
      out.push_back(absl::StrCat(l.tenant(), "/", l.sequence_id(), "/", l.lease_id()));
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  const std::string a_row = absl::StrCat("a/doc/", a.lease_id());
  const std::string b_row = absl::StrCat("b/doc/", b.lease_id());
  grpc::Status status;
  EXPECT_THAT(list(kTokenA, "", &status), ::testing::ElementsAre(a_row));
  EXPECT_THAT(list(kTokenB, "", &status), ::testing::ElementsAre(b_row));
  EXPECT_THAT(list(kTokenAdmin, "", &status), ::testing::ElementsAre(a_row, b_row));
  EXPECT_THAT(list(kTokenAdmin, "b", &status), ::testing::ElementsAre(b_row));
  EXPECT_TRUE(list(kTokenB, "a", &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // What the admin sees of a lease.
  pb::ListLeasesRequest only_a;
  only_a.set_tenant("a");
  pb::ListLeasesResponse listed;
  ASSERT_TRUE(admin_->ListLeases(Ctx(kTokenAdmin).get(), only_a, &listed).ok());
  ASSERT_EQ(listed.leases_size(), 1);
  const pb::LeaseInfo& info = listed.leases(0);
  EXPECT_EQ(info.pool(), "small");
  EXPECT_EQ(info.leased_bytes(), a.leased_bytes());
  EXPECT_EQ(info.lease_only_bytes(), 0) << "the sequence still holds every block";
  EXPECT_EQ(info.expires_unix_ms(), a.expires_unix_ms());
  EXPECT_LE(info.granted_unix_ms(), info.expires_unix_ms());
  EXPECT_EQ(info.renewals(), 0);

  // a's sequence goes; its lease keeps the blocks, on a's account.
  pb::ReleaseRequest release;
  release.set_sequence_id("doc");
  pb::ReleaseResponse released;
  ASSERT_TRUE(kv_->Release(Ctx(kTokenA).get(), release, &released).ok());
  listed.Clear();
  ASSERT_TRUE(admin_->ListLeases(Ctx(kTokenAdmin).get(), only_a, &listed).ok());
  EXPECT_EQ(listed.leases(0).lease_only_bytes(), a.leased_bytes());
  pb::PoolStats a_stats;
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenA).get(), {}, &a_stats).ok());
  EXPECT_EQ(a_stats.used_bytes(), a.leased_bytes()) << "the tenant's statistics show it";
  EXPECT_EQ(a_stats.leases().lease_only_bytes(), a.leased_bytes());
  pb::ListTenantsResponse tenants;
  ASSERT_TRUE(admin_->ListTenants(Ctx(kTokenA).get(), {}, &tenants).ok());
  ASSERT_EQ(tenants.tenants_size(), 1);
  EXPECT_EQ(tenants.tenants(0).pool_bytes().at("small"), a.leased_bytes());
  EXPECT_EQ(tenants.tenants(0).lease_only_bytes().at("small"), a.leased_bytes());
  const std::string metrics = testing::HttpGet(server_->metrics_address(), "/metrics");
  EXPECT_THAT(metrics,
              HasSubstr(absl::StrCat("kvc_lease_only_bytes{pool=\"small\"} ", a.leased_bytes())));
  EXPECT_THAT(metrics,
              HasSubstr(absl::StrCat("kvc_tenant_lease_only_bytes{pool=\"small\",tenant=\"a\"} ",
                                     a.leased_bytes())));

  // Ending: the admin only, in the lease's tenant.
  auto end = [&](const std::string& token, const std::string& tenant, const std::string& id) {
    pb::EndLeaseRequest r;
    r.set_tenant(tenant);
    r.set_lease_id(id);
    pb::EndLeaseResponse response;
    return admin_->EndLease(Ctx(token).get(), r, &response);
  };
  EXPECT_EQ(end(kTokenB, "a", a.lease_id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(end(kTokenB, "", a.lease_id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(end(kTokenA, "", a.lease_id()).error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << "a tenant ends its own leases with ReleaseLease";
  EXPECT_EQ(end(kTokenAdmin, "", a.lease_id()).error_code(), grpc::StatusCode::NOT_FOUND)
      << "without the tenant field the admin acts in its own id space";
  EXPECT_EQ(end(kTokenAdmin, "b", a.lease_id()).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(end(kTokenAdmin, "a", a.lease_id()).ok());
  EXPECT_THAT(list(kTokenA, "", &status), ::testing::IsEmpty());
  pb::RenewLeaseRequest renew;
  renew.set_lease_id(a.lease_id());
  pb::RenewLeaseResponse renewed;
  EXPECT_EQ(kv_->RenewLease(Ctx(kTokenA).get(), renew, &renewed).error_code(),
            grpc::StatusCode::NOT_FOUND)
      << "an ended lease is gone for its holder";
  a_stats.Clear();
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenA).get(), {}, &a_stats).ok());
  EXPECT_EQ(a_stats.used_bytes(), 0);
  EXPECT_THAT(list(kTokenAdmin, "", &status), ::testing::ElementsAre(b_row));
}

TEST_F(AuthTest, TokensFileReloadsUnderTrafficWithoutRestart) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  const std::string new_token = "a-newly-issued-token-0123456789ab";
  std::atomic<bool> stop{false};
  std::atomic<int> ok_calls{0}, failed_calls{0};
  std::thread traffic([&] {
    while (!stop.load()) {
      pb::GetSequenceRequest r;
      r.set_sequence_id("doc");
      pb::SequenceInfo info;
      (kv_->GetSequence(Ctx(kTokenA).get(), r, &info).ok() ? ok_calls : failed_calls)++;
    }
  });
  auto works = [&](const std::string& token) {
    pb::GetSequenceRequest r;
    r.set_sequence_id("doc");
    pb::SequenceInfo info;
    return kv_->GetSequence(Ctx(token).get(), r, &info).ok();
  };
  EXPECT_FALSE(works(new_token));
  const int64_t loads = server_->authenticator()->loads();
  // Add a token: picked up by the watcher (1 s interval) without a restart.
  WriteAtomically(tokens_file_, TokenLine("a", "tenant", kTokenA) +
                                    TokenLine("a", "tenant", new_token) +
                                    TokenLine("ops", "admin", kTokenAdmin));
  for (int i = 0; i < 100 && !works(new_token); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(works(new_token));
  EXPECT_GT(server_->authenticator()->loads(), loads);
  // A broken file keeps the tokens in force (and says why in the log).
  WriteAtomically(tokens_file_, "a tenant nothex\n");
  EXPECT_FALSE(server_->ReloadCredentials().ok());
  EXPECT_TRUE(works(new_token));
  stop = true;
  traffic.join();
  // Revoke the old token (the SIGHUP path): refused at once.
  WriteAtomically(tokens_file_, TokenLine("a", "tenant", new_token));
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  EXPECT_FALSE(works(kTokenA));
  EXPECT_TRUE(works(new_token));
  EXPECT_GT(ok_calls.load(), 10);
  EXPECT_EQ(failed_calls.load(), 0) << "calls with a valid token failed during the reloads";
}

// A token revoked while streams it opened are still open: each stream ends with
// UNAUTHENTICATED at its next message (AppendStream, AttendStream) or chunk (Fetch), and
// nothing it sent after the reload is applied. A reload that keeps the token ends nothing.
TEST_F(AuthTest, StreamsOfARevokedTokenEndBeforeTheirNextMessage) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  ASSERT_TRUE(Create(kTokenA, "big").ok());
  // 24K tokens x 1 KiB: far more than gRPC's flow-control windows hold, so the Fetch below is
  // still writing when the token is revoked.
  constexpr int kBigTokens = 24 * 1024;
  for (int at = 0; at < kBigTokens; at += 4096)
    ASSERT_TRUE(AppendAll(kTokenA, "big", at, 4096).ok());
  // What tenant a holds, seen by the admin (a's own token is revoked below).
  auto layer_tokens = [&](int layer) -> int64_t {
    pb::GetSequenceRequest r;
    r.set_sequence_id("doc");
    r.set_tenant("a");
    pb::SequenceInfo info;
    EXPECT_TRUE(kv_->GetSequence(Ctx(kTokenAdmin).get(), r, &info).ok());
    return info.layer_tokens(layer);
  };

  auto append_ctx = Ctx(kTokenA);
  append_ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::AppendStreamResponse appended;
  auto append = kv_->AppendStream(append_ctx.get(), &appended);
  ASSERT_TRUE(append->Write(AppendReq("doc", 0, 0, 16, 1)));
  for (int i = 0; i < 200 && layer_tokens(0) < 16; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(layer_tokens(0), 16);

  pb::AttendRequest attend;
  attend.set_sequence_id("doc");
  attend.set_layer(0);
  attend.set_queries(std::string(4 * 32 * 2, '\0'));
  attend.add_positions(1000);  // after every token appended meanwhile
  auto attend_ctx = Ctx(kTokenA);
  attend_ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto attend_stream = kv_->AttendStream(attend_ctx.get());
  pb::AttendResponse attended;
  ASSERT_TRUE(attend_stream->Write(attend));
  ASSERT_TRUE(attend_stream->Read(&attended));

  pb::FetchRequest fetch;
  fetch.set_sequence_id("big");
  fetch.set_max_chunk_bytes(4096);
  auto fetch_ctx = Ctx(kTokenA);
  fetch_ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto fetch_stream = kv_->Fetch(fetch_ctx.get(), fetch);
  pb::FetchChunk chunk;
  ASSERT_TRUE(fetch_stream->Read(&chunk));

  // A reload that keeps a's token: every stream goes on.
  const std::string tokens_b_admin =
      TokenLine("b", "tenant", kTokenB) + TokenLine("ops", "admin", kTokenAdmin);
  WriteAtomically(tokens_file_, TokenLine("a", "tenant", kTokenA) + tokens_b_admin);
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  ASSERT_TRUE(append->Write(AppendReq("doc", 0, 16, 16, 1)));
  ASSERT_TRUE(attend_stream->Write(attend));
  ASSERT_TRUE(attend_stream->Read(&attended)) << "a stream of a valid token was ended";
  ASSERT_TRUE(fetch_stream->Read(&chunk));
  for (int i = 0; i < 200 && layer_tokens(0) < 32; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(layer_tokens(0), 32);

  // Revoke it (the SIGHUP path); the streams keep sending.
  WriteAtomically(tokens_file_, tokens_b_admin);
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  for (int i = 0; i < 4; ++i) {
    if (!append->Write(AppendReq("doc", i % 2, i < 2 ? 32 : 0, 16, 1))) break;
  }
  append->WritesDone();
  const grpc::Status append_end = append->Finish();
  EXPECT_EQ(append_end.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << append_end.error_message();
  EXPECT_THAT(append_end.error_message(), HasSubstr("the credential was revoked"));
  EXPECT_THAT(append_end.error_message(), HasSubstr("applied 2 messages"));
  EXPECT_EQ(layer_tokens(0), 32) << "a message sent after the revocation was applied";
  EXPECT_EQ(layer_tokens(1), 0) << "a message sent after the revocation was applied";

  attend_stream->Write(attend);
  attend_stream->WritesDone();
  EXPECT_FALSE(attend_stream->Read(&attended)) << "an Attend after the revocation was answered";
  const grpc::Status attend_end = attend_stream->Finish();
  EXPECT_EQ(attend_end.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << attend_end.error_message();

  int64_t fetched = 2;
  while (fetch_stream->Read(&chunk)) ++fetched;
  const grpc::Status fetch_end = fetch_stream->Finish();
  EXPECT_EQ(fetch_end.error_code(), grpc::StatusCode::UNAUTHENTICATED) << fetch_end.error_message();
  // A chunk holds 4 KiB of keys and values: 32 tokens of one (layer, kv head) lane.
  EXPECT_LT(fetched, int64_t{kBigTokens} / 32 * 4 * 2) << "the Fetch was served to its end";
  std::printf("chunks fetched before the revocation ended the Fetch: %lld\n",
              static_cast<long long>(fetched));
}

// A Kubernetes Secret volume: `tokens` -> `..data/tokens`, `..data` -> a timestamped
// directory; an update writes a new directory and renames a new `..data` link over the old
// one, so the file at `tokens` changes without ever being written or renamed itself.
TEST(SecretVolumeTest, TokensFileReloadsWhenTheKubeletSwapsTheDataSymlink) {
  TempDir dir;
  namespace fs = std::filesystem;
  auto publish = [&](const std::string& version, const std::string& text) {
    fs::create_directory(dir.path() + "/" + version);
    std::ofstream(dir.path() + "/" + version + "/tokens") << text;
    fs::create_directory_symlink(version, dir.path() + "/..data_tmp");
    fs::rename(dir.path() + "/..data_tmp", dir.path() + "/..data");
  };
  publish("..v1", TokenLine("a", "tenant", kTokenA));
  fs::create_symlink("..data/tokens", dir.path() + "/tokens");
  ServerOptions options = testing::SmallServerOptions();
  options.auth.tokens_file = dir.path() + "/tokens";
  options.auth.reload_interval_seconds = 1;
  auto server = KvCacheServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto admin = pb::AdminService::NewStub(channel);
  auto works = [&](const std::string& token) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    pb::ListPoolsResponse pools;
    return admin->ListPools(&ctx, {}, &pools).ok();
  };
  ASSERT_TRUE(works(kTokenA));
  ASSERT_FALSE(works(kTokenB));
  publish("..v2", TokenLine("b", "tenant", kTokenB));  // a's token revoked, b's issued
  bool swapped = false;
  for (int i = 0; i < 100 && !swapped; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    swapped = works(kTokenB);
  }
  EXPECT_TRUE(swapped) << "the watcher did not follow the symlink swap";
  EXPECT_FALSE(works(kTokenA));
}

class QuotaTest : public AuthTest {
 protected:
  // 16 tokens on every layer of the small pool = 8 blocks of 2 KiB (f16).
  static constexpr int64_t kChunkBytes = 8 * 2048;
  void SetUp() override { Start({{"a", 4 * kChunkBytes, 3, 2, 0}, {"*", 0, 0, 0, 0}}); }
};

TEST_F(QuotaTest, BytesPerPoolStopAtTheQuotaWithNothingHalfWrittenAndReleaseGivesThemBack) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  int64_t tokens = 0;
  while (AppendAll(kTokenA, "doc", tokens, 16).ok()) tokens += 16;
  EXPECT_EQ(tokens, 64) << "4 chunks fit the quota";
  // The refused layer-0 append left everything as it was.
  std::string before;
  ASSERT_TRUE(Fetch(kTokenA, "doc", &before).ok());
  const int64_t used = server_->store()->stats().GetPoolStats("").value().used_bytes;
  const grpc::Status refused = Append(kTokenA, "doc", 0, tokens, 16);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("quota"));
  EXPECT_THAT(refused.error_message(), HasSubstr("max_bytes_per_pool 65536"));
  std::string after;
  ASSERT_TRUE(Fetch(kTokenA, "doc", &after).ok());
  EXPECT_EQ(before, after);
  EXPECT_EQ(server_->store()->stats().GetPoolStats("").value().used_bytes, used);
  pb::GetSequenceRequest get;
  get.set_sequence_id("doc");
  pb::SequenceInfo info;
  ASSERT_TRUE(kv_->GetSequence(Ctx(kTokenA).get(), get, &info).ok());
  EXPECT_EQ(info.visible_tokens(), 64);

  // Another tenant is not starved by a's quota.
  ASSERT_TRUE(Create(kTokenB, "doc").ok());
  EXPECT_TRUE(AppendAll(kTokenB, "doc", 0, 16 * 6).ok());

  // Compressing shrinks what a holds, although the conversion needs both copies at once:
  // the quota counts the result.
  pb::CompressRequest compress;
  compress.set_sequence_id("doc");
  compress.mutable_spec()->set_storage(pb::STORAGE_FORMAT_INT4_G32);
  pb::CompressResponse compressed;
  ASSERT_TRUE(kv_->Compress(Ctx(kTokenA).get(), compress, &compressed).ok());
  pb::PoolStats stats;
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenA).get(), {}, &stats).ok());
  EXPECT_LT(stats.used_bytes(), 4 * kChunkBytes / 2);
  EXPECT_EQ(stats.quota_bytes(), 4 * kChunkBytes);

  // Release gives the quota back exactly.
  pb::ReleaseRequest release;
  release.set_sequence_id("doc");
  pb::ReleaseResponse released;
  ASSERT_TRUE(kv_->Release(Ctx(kTokenA).get(), release, &released).ok());
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenA).get(), {}, &stats).ok());
  EXPECT_EQ(stats.used_bytes(), 0);
  EXPECT_EQ(stats.sequences(), 0);
  ASSERT_TRUE(Create(kTokenA, "doc2").ok());
  EXPECT_TRUE(AppendAll(kTokenA, "doc2", 0, 64).ok());
}

TEST_F(QuotaTest, LiveSequencesStopAtTheQuota) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Create(kTokenA, absl::StrCat("s", i)).ok());
  const grpc::Status refused = Create(kTokenA, "s3");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("max_sequences 3"));
  EXPECT_TRUE(Create(kTokenB, "s3").ok()) << "b has no limit";
  pb::ReleaseRequest release;
  release.set_sequence_id("s0");
  pb::ReleaseResponse released;
  ASSERT_TRUE(kv_->Release(Ctx(kTokenA).get(), release, &released).ok());
  EXPECT_TRUE(Create(kTokenA, "s3").ok());
}

TEST_F(QuotaTest, OpenStreamsStopAtTheQuotaAndFreeTheirSlotWhenTheyEnd) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  // Two AppendStreams held open (max_streams 2): the server handler holds its slot while it
  // waits for the next message.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::AppendRequest>>> open;
  pb::AppendStreamResponse responses[3];
  for (int i = 0; i < 2; ++i) {
    contexts.push_back(Ctx(kTokenA));
    open.push_back(kv_->AppendStream(contexts.back().get(), &responses[i]));
    ASSERT_TRUE(open.back()->Write(AppendReq("doc", i, 0, 16, 1)));
  }
  // Wait until both handlers run (their first message is applied).
  for (int i = 0; i < 100; ++i) {
    pb::GetSequenceRequest r;
    r.set_sequence_id("doc");
    pb::SequenceInfo info;
    ASSERT_TRUE(kv_->GetSequence(Ctx(kTokenA).get(), r, &info).ok());
    if (info.layer_tokens(0) == 16 && info.layer_tokens(1) == 16) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string data;
  const grpc::Status third = Fetch(kTokenA, "doc", &data);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("max_streams 2"));
  EXPECT_TRUE(Fetch(kTokenB, "nope", &data).error_code() == grpc::StatusCode::NOT_FOUND)
      << "b's streams are not a's";
  for (auto& w : open) {
    w->WritesDone();
    EXPECT_TRUE(w->Finish().ok());
  }
  EXPECT_TRUE(Fetch(kTokenA, "doc", &data).ok());
  EXPECT_THAT(testing::HttpGet(server_->metrics_address(), "/metrics"),
              HasSubstr("kvc_tenant_call_limit_refusals_total{limit=\"streams\",tenant=\"a\"} 1"));
}

TEST(CallLimitsTest, ComputeSlotsAreCountedPerTenantAndReturnedByScope) {
  CallLimits limits({{"a", 0, 0, 0, 2}});
  auto s1 = limits.Acquire("a", CallKind::kCompute);
  auto s2 = limits.Acquire("a", CallKind::kCompute);
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto s3 = limits.Acquire("a", CallKind::kCompute);
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s3.status().message()), HasSubstr("max_compute_calls 2"));
  EXPECT_TRUE(limits.Acquire("b", CallKind::kCompute).ok());
  EXPECT_TRUE(limits.Acquire("a", CallKind::kStream).ok());
  EXPECT_EQ(limits.InFlight("a", CallKind::kCompute), 2);
  { auto released = std::move(s1); }
  EXPECT_EQ(limits.InFlight("a", CallKind::kCompute), 1);
  EXPECT_TRUE(limits.Acquire("a", CallKind::kCompute).ok());
  EXPECT_TRUE(limits.Acquire("", CallKind::kCompute).ok()) << "no tenant: not limited";
}

TEST(TokensFileTest, ParsesLinesAndNamesTheBadOne) {
  const std::string salt = "0123456789abcdef";
  auto ok = ParseTokensFile("# comment\n\n a tenant " + ToHex(salt) + " " +
                            TokenHashHex(salt, "t") + "  # trailing\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_EQ((*ok)[0].tenant, "a");
  const std::string hash = TokenHashHex(salt, "t");
  const std::string hex_salt = ToHex(salt);
  for (const std::string& bad :
       {absl::StrCat("a tenant ", hex_salt), absl::StrCat("a root ", hex_salt, " ", hash),
        absl::StrCat("a/b tenant ", hex_salt, " ", hash), absl::StrCat("a tenant zz ", hash),
        absl::StrCat("a tenant ", hex_salt, " abcd"), absl::StrCat("a tenant 00 ", hash)}) {
    auto parsed = ParseTokensFile("# ok\n" + bad + "\n");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("line 2")) << bad;
  }
}

TEST(ExposureTest, NonLoopbackListenNeedsTlsAndAuthenticationOrAnExplicitOptOut) {
  ServerOptions options = testing::SmallServerOptions();
  options.listen = "0.0.0.0:0";
  auto refused = KvCacheServer::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("insecure: true"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("TLS"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("authentication"));
  TempDir dir;
  options.auth.tokens_file = dir.path() + "/tokens";
  std::ofstream(options.auth.tokens_file) << TokenLine("a", "tenant", kTokenA);
  refused = KvCacheServer::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << "tokens over plaintext on the network";
  options.insecure = true;
  auto started = KvCacheServer::Start(options);
  EXPECT_TRUE(started.ok()) << started.status();
  options.insecure = false;
  options.auth = {};
  options.listen = "127.0.0.1:0";
  EXPECT_TRUE(KvCacheServer::Start(options).ok()) << "loopback: the developer default";
  options.listen = "[::1]:0";
  auto v6 = KvCacheServer::Start(options);
  EXPECT_NE(v6.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ExposureTest, AMissingOrBrokenTokensFileStopsStartup) {
  ServerOptions options = testing::SmallServerOptions();
  options.auth.tokens_file = "/nonexistent/tokens";
  auto missing = KvCacheServer::Start(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/tokens"));
  TempDir dir;
  options.auth.tokens_file = dir.path() + "/tokens";
  std::ofstream(options.auth.tokens_file) << "a tenant\n";
  auto broken = KvCacheServer::Start(options);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("line 1"));
}

TEST(UnauthenticatedTest, WithoutAuthTenantLabelsAreFreeTextAndSummedInMetrics) {
  ServerOptions options = testing::SmallServerOptions();
  options.metrics_listen = "127.0.0.1:0";
  options.store.quotas = {{"named", 0, 1, 0, 0}};
  auto t = testing::StartTestServer(options);
  for (const std::string tenant : {"x1", "x2", "named"}) {
    client::CreateSequenceOptions create;
    create.tenant = tenant;
    ASSERT_TRUE(t.client->CreateSequence(create).ok());
  }
  client::CreateSequenceOptions again;
  again.tenant = "named";
  EXPECT_EQ(t.client->CreateSequence(again).status().code(), absl::StatusCode::kResourceExhausted)
      << "memory quotas apply to tenant labels without authentication too";
  const std::string metrics = testing::HttpGet(t.server->metrics_address(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("kvc_tenant_sequences{tenant=\"_other\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("kvc_tenant_sequences{tenant=\"named\"} 1"));
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("tenant=\"x1\"")));
}

}  // namespace
}  // namespace kvc::cachesvc
