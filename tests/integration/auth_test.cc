// Authentication and authorization through real gRPC calls to an in-process kvcached
// (auth_fixture.h): every RPC checked without credentials, across tenants and by role.
#include "tests/integration/auth_fixture.h"

namespace kvc::cachesvc {
namespace {

using namespace auth_testing;  // NOLINT(google-build-using-namespace): the suites' fixture

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

}  // namespace
}  // namespace kvc::cachesvc
