// The fixture of the authentication, authorization and quota suites (auth_test.cc,
// auth_reload_test.cc, quota_test.cc): an in-process kvcached behind a real tokens file
// (salted SHA-256) with tenants a and b and an admin, and raw stubs to call it with each
// credential.
#pragma once

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
#include "cachesvc/security/authenticator.h"
#include "cachesvc/security/call_limits.h"
#include "cachesvc/server/server.h"
#include "common/token_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/http_get.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/test_server.h"

namespace kvc::cachesvc::auth_testing {

namespace pb = ::kvcache::v1;
using ::testing::HasSubstr;

inline constexpr char kTokenA[] = "token-of-tenant-a-0123456789abcdef";
inline constexpr char kTokenB[] = "token-of-tenant-b-0123456789abcdef";
inline constexpr char kTokenAdmin[] = "token-of-the-admin-0123456789abcd";

inline std::string TokenLine(const std::string& tenant, const std::string& role,
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
inline void WriteAtomically(const std::string& path, const std::string& text) {
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

}  // namespace kvc::cachesvc::auth_testing
